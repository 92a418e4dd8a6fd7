"""Random paged-MQA-logits problems: small ones written through the real cache writer (tests, notebooks), and
benchmark-sized ones built the way docs/performance.md says."""

from __future__ import annotations

import hashlib

import torch

from .. import device as kernel_device
from ..arguments import non_negative_int, positive_int
from ..cache import allocate_k_cache, sequence_slots, write_k_cache
from ..contract import cache_scales
from ..layout import offset_map
from ..problem import PagedMQAProblem
from ..shapes import Shape

# The benchmark's geometry (docs/performance.md: H = 64, D = 128).
HEADS = 64
HEAD_DIM = 128


def scattered_block_tables(blocks_per_seq, num_blocks: int, width: int, generator: torch.Generator) -> torch.Tensor:
    """int32 ``[B, width]``: sequence b's ``blocks_per_seq[b]`` kernel blocks dealt in order from one random
    permutation of all ``num_blocks`` blocks, so pages are scattered and never shared; the rest of a row is 0."""
    return _deal(torch.randperm(num_blocks, generator=generator).to(torch.int32), blocks_per_seq, width)


def contiguous_block_tables(blocks_per_seq, width: int) -> torch.Tensor:
    """int32 ``[B, width]``: sequence b's kernel blocks consecutive, sequences one after another (a cache writer
    that keeps each sequence's pages together); the rest of a row is 0."""
    return _deal(torch.arange(sum(int(n) for n in blocks_per_seq), dtype=torch.int32), blocks_per_seq, width)


def _deal(ids: torch.Tensor, blocks_per_seq, width: int) -> torch.Tensor:
    """Rows of ``width`` block ids: sequence b takes the next ``blocks_per_seq[b]`` of ``ids``, the rest is 0."""
    tables = torch.zeros(len(blocks_per_seq), width, dtype=torch.int32)
    used = 0
    for b, n in enumerate(int(n) for n in blocks_per_seq):
        tables[b, :n] = ids[used:used + n]
        used += n
    return tables


def random_problem(context_lens, *, next_n: int = 1, heads: int = 64, head_dim: int = 128, block_size: int = 16,
                   layout: str = "normal", ctx_2d: bool = False, extra_blocks: int = 2, spare_columns: int = 1,
                   max_model_len: int | None = None, seed: int = 0, device=None,
                   scale_fmt: str | None = None) -> PagedMQAProblem:
    """A batch whose sequence b has ``context_lens[b]`` tokens of random keys, written by slot through a block
    table drawn from a random permutation of the cache's blocks (``extra_blocks`` unused ones), with
    ``spare_columns`` padding entries (id 0) at the end of each table row.

    With ``ctx_2d`` each row j of a sequence gets its own length, ``context_lens[b] - (next_n - 1 - j)`` (never
    below 0), as a speculative-decoding caller would pass. The tensors go to ``device``, by default the one this
    process's kernels run on (the CPU under the interpreter, else the GPU). Every size is refused unless it is an
    int of its range (a float length is not truncated, a ``max_model_len`` of 0 is not the default)."""
    if isinstance(context_lens, (str, bytes, torch.Tensor)) or not hasattr(context_lens, "__iter__"):
        raise TypeError(f"context_lens must be a list of ints, got {type(context_lens).__name__}")
    lens = [non_negative_int(n, f"context_lens[{i}]") for i, n in enumerate(context_lens)]
    next_n, heads, head_dim, block_size = (positive_int(v, name) for v, name in (
        (next_n, "next_n"), (heads, "heads"), (head_dim, "head_dim"), (block_size, "block_size")))
    extra_blocks, spare_columns = (non_negative_int(v, name) for v, name in (
        (extra_blocks, "extra_blocks"), (spare_columns, "spare_columns")))
    if max_model_len is not None:
        max_model_len = positive_int(max_model_len, "max_model_len")
    if not isinstance(ctx_2d, bool):
        raise TypeError(f"ctx_2d must be a bool, got {type(ctx_2d).__name__} {ctx_2d!r}")
    g = torch.Generator().manual_seed(non_negative_int(seed, "seed"))
    batch = len(lens)
    blocks = [-(-n // block_size) for n in lens]
    max_blocks = max(blocks, default=0) + spare_columns
    num_blocks = sum(blocks) + extra_blocks
    block_tables = scattered_block_tables(blocks, num_blocks, max(max_blocks, 1), g)
    kv_cache = allocate_k_cache(num_blocks, block_size, head_dim)
    for b, n in enumerate(lens):
        k = torch.randn(n, head_dim, generator=g) * torch.rand(n, 1, generator=g) * 4
        write_k_cache(kv_cache, k, sequence_slots(block_tables[b], n, block_size), layout=layout,
                      scale_fmt=scale_fmt)
    q = (torch.randn(batch, next_n, heads, head_dim, generator=g) * 2).to(torch.float8_e4m3fn)
    weights = torch.randn(batch * next_n, heads, generator=g)
    ctx = torch.tensor(lens, dtype=torch.int32)
    if ctx_2d:
        j = torch.arange(next_n)
        ctx = (ctx.unsqueeze(1) - (next_n - 1 - j)).clamp(min=0).to(torch.int32)
    longest = max(lens, default=0)
    problem = PagedMQAProblem(q, kv_cache, weights, ctx, block_tables,
                              longest + 3 if max_model_len is None else max_model_len, layout, sum_ctx=sum(lens))
    return problem.to(device or kernel_device.KERNEL_DEVICE)


def _contexts(shape: Shape, g: torch.Generator) -> torch.Tensor:
    lo, hi = int(0.7 * shape.avg_ctx), int(1.3 * shape.avg_ctx)
    return torch.randint(lo, hi + 1, (shape.batch,), generator=g, dtype=torch.int64).clamp(min=shape.next_n)


def benchmark_problem(shape: Shape, block_size: int, layout: str = "normal", *, heads: int = HEADS, seed: int = 0,
                      device_name: str | None = None) -> PagedMQAProblem:
    """Random inputs like DeepGEMM's test: ctx_b uniform in [0.7, 1.3] x average, pages drawn from a random
    permutation of all blocks, random fp8 keys (never zeros) with positive scales, fp32 weights.

    The cache bytes are written directly (random fp8 values are valid in either layout), which keeps building
    a 4 GB cache cheap; the correctness of the writer itself is tested in tests/test_cache.py."""
    dev = torch.device(device_name or kernel_device.KERNEL_DEVICE)
    g = torch.Generator(device="cpu").manual_seed(seed)
    ctx = _contexts(shape, g)
    blocks_per_seq = (ctx + block_size - 1) // block_size
    num_blocks = int(blocks_per_seq.sum())
    max_blocks = int(blocks_per_seq.max())
    block_tables = scattered_block_tables(blocks_per_seq.tolist(), num_blocks, max_blocks, g)

    # Drawn on the CPU whatever the device, so that a run's inputs can be rebuilt (and checked) without its GPU.
    gd = torch.Generator(device="cpu").manual_seed(seed + 1)
    kv_cache = allocate_k_cache(num_blocks, block_size, HEAD_DIM, device=dev)
    flat = kv_cache.view(num_blocks, -1)
    value_bytes = block_size * HEAD_DIM
    step = max(1, (1 << 27) // value_bytes)  # fill in slices of ~128 MB of fp32 temporaries
    for first in range(0, num_blocks, step):
        last = min(num_blocks, first + step)
        values = torch.randn(last - first, value_bytes, generator=gd).to(torch.float8_e4m3fn)
        flat[first:last, :value_bytes] = values.view(torch.uint8).to(dev)
        scales = torch.rand(last - first, block_size, generator=gd) * 1e-2 + 1e-3
        flat[first:last, value_bytes:] = scales.view(torch.uint8).view(last - first, -1).to(dev)
    q = torch.randn(shape.batch, shape.next_n, heads, HEAD_DIM, generator=gd).to(torch.float8_e4m3fn).to(dev)
    weights = torch.randn(shape.batch * shape.next_n, heads, generator=gd).to(dev)
    return PagedMQAProblem(q, kv_cache, weights, ctx.to(torch.int32).to(dev), block_tables.to(dev), int(ctx.max()),
                           layout, sum_ctx=int(ctx.sum()))


def input_digest(problem: PagedMQAProblem) -> str:
    """sha256 over the bytes of ``problem``'s inputs (queries, cache, weights, lengths, block tables, in that order,
    each with its shape): what a run records so that its inputs, rebuilt from their seed, can be told apart from
    any others."""
    if not isinstance(problem, PagedMQAProblem):
        raise TypeError(f"problem must be a PagedMQAProblem, got {type(problem).__name__}")
    digest = hashlib.sha256()
    for tensor in (problem.q, problem.kv_cache, problem.weights, problem.context_lens, problem.block_tables):
        digest.update(repr((str(tensor.dtype), tuple(tensor.shape))).encode())
        flat = tensor.contiguous().view(-1).view(torch.uint8)
        for first in range(0, flat.numel(), 1 << 26):  # 64 MB at a time off the device
            digest.update(flat[first:first + (1 << 26)].cpu().numpy().tobytes())
    return digest.hexdigest()


# Problems with one poisoned input: for the contract on non-finite and non-positive inputs (docs/input-contract.md).
E4M3_NAN = 0x7F  # e4m3fn's NaN: exponent and mantissa all ones (0xFF is -NaN)


def key_record(problem: PagedMQAProblem, sequence: int, position: int) -> tuple[int, int]:
    """(block id, token in the block) of ``position`` of ``sequence``, through its block table."""
    block_size = problem.block_size
    return int(problem.block_tables[sequence, position // block_size]), position % block_size


def with_scale(problem: PagedMQAProblem, sequence: int, position: int, scale: float) -> PagedMQAProblem:
    """``problem`` on a copy of its cache whose scale of ``position`` of ``sequence`` is ``scale``."""
    kv_cache = problem.kv_cache.clone()
    block, token = key_record(problem, sequence, position)
    cache_scales(kv_cache)[block, token] = scale
    return problem.replace(kv_cache=kv_cache)


def with_nan_key(problem: PagedMQAProblem, sequence: int, position: int, dim: int = 0) -> PagedMQAProblem:
    """``problem`` on a copy of its cache whose key at ``position`` of ``sequence`` holds NaN at ``dim``."""
    kv_cache = problem.kv_cache.clone()
    block, token = key_record(problem, sequence, position)
    offset = offset_map(problem.block_size, problem.head_dim, problem.layout)[token, dim]
    kv_cache.view(problem.num_blocks, -1)[block, offset] = E4M3_NAN
    return problem.replace(kv_cache=kv_cache)


def with_nan_query(problem: PagedMQAProblem, sequence: int, row: int, head: int, dim: int = 0) -> PagedMQAProblem:
    """``problem`` with a NaN at ``dim`` of query ``head`` of row ``row`` of ``sequence``."""
    q = problem.q.clone()
    q.view(torch.uint8)[sequence, row, head, dim] = E4M3_NAN
    return problem.replace(q=q)


def misaligned_copy(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``t`` whose address is 4 bytes off the 16-byte grid."""
    raw = torch.empty(t.numel() * t.element_size() + 4, dtype=torch.uint8, device=t.device)[4:]
    raw.copy_(t.contiguous().view(-1).view(torch.uint8))
    return raw.view(t.dtype).view(t.shape)
