"""Small random paged-MQA-logits problems, built through the real cache writer, for tests and notebooks."""

from __future__ import annotations

import torch

from . import device as kernel_device
from .cache import allocate_k_cache, sequence_slots, write_k_cache

ARG_NAMES = ("q", "kv_cache", "weights", "context_lens", "block_tables", "max_model_len")


def kernel_args(problem: dict) -> tuple:
    """The positional arguments of the reference and the kernel, in order."""
    return tuple(problem[k] for k in ARG_NAMES)


def scattered_block_tables(blocks_per_seq, num_blocks: int, width: int, generator: torch.Generator) -> torch.Tensor:
    """int32 ``[B, width]``: sequence b's ``blocks_per_seq[b]`` kernel blocks dealt in order from one random
    permutation of all ``num_blocks`` blocks, so pages are scattered and never shared; the rest of a row is 0."""
    perm = torch.randperm(num_blocks, generator=generator).to(torch.int32)
    tables = torch.zeros(len(blocks_per_seq), width, dtype=torch.int32)
    used = 0
    for b, n in enumerate(int(n) for n in blocks_per_seq):
        tables[b, :n] = perm[used:used + n]
        used += n
    return tables


def random_problem(context_lens, *, next_n: int = 1, heads: int = 64, head_dim: int = 128, block_size: int = 16,
                   layout: str = "normal", ctx_2d: bool = False, extra_blocks: int = 2, spare_columns: int = 1,
                   max_model_len: int | None = None, seed: int = 0, device=None, scale_fmt: str | None = None) -> dict:
    """A batch whose sequence b has ``context_lens[b]`` tokens of random keys, written by slot through a block
    table drawn from a random permutation of the cache's blocks (``extra_blocks`` unused ones), with
    ``spare_columns`` padding entries (id 0) at the end of each table row.

    With ``ctx_2d`` each row j of a sequence gets its own length, ``context_lens[b] - (next_n - 1 - j)`` (never
    below 0), as a speculative-decoding caller would pass. The tensors go to ``device``, by default the one this
    process's kernels run on (the CPU under the interpreter, else the GPU)."""
    g = torch.Generator().manual_seed(seed)
    lens = [int(n) for n in context_lens]
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
    problem = {"q": q, "kv_cache": kv_cache, "weights": weights, "context_lens": ctx, "block_tables": block_tables,
               "max_model_len": max_model_len or longest + 3, "layout": layout, "sum_ctx": sum(lens)}
    target = device or kernel_device.KERNEL_DEVICE
    problem.update({k: v.to(target) for k, v in problem.items() if isinstance(v, torch.Tensor)})
    return problem
