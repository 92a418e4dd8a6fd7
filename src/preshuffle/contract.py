"""The paged-MQA-logits contract: what the inputs must be, checked once for the reference and the kernels.

Inputs (shared by DeepGEMM, AITER and vLLM): ``q`` fp8 ``[B, next_n, H, D]``; ``kv_cache`` uint8
``[num_blocks, block_size, 1, D + 4]``; ``weights`` fp32 ``[B * next_n, H]``; ``context_lens`` int32 ``[B]`` or
``[B, next_n]``; ``block_tables`` int32 ``[B, max_blocks]``; ``max_model_len``, the output's row length.
Row ``b*next_n + j`` may see position ``p`` when ``p <= context_lens[b] - next_n + j`` (1-D lengths) or
``p < context_lens[b, j]`` (2-D lengths).

The value checks (``check_values=True``) refuse negative lengths, lengths past the block table or ``max_model_len``,
block ids outside ``[0, num_blocks)`` in the blocks a row reads, and a scale that is not finite and positive at a
position a row reads (naming its block and token). Without them, the Triton kernel and the PyTorch baseline still
read nothing outside their tensors: where a row may see a position whose block id is out of range, or past its
block-table row, the logit is NaN (:func:`unreadable_positions`), and so it is where the position's scale is not
finite and positive (:func:`bad_scale_positions`); positions past a row's visible prefix stay -inf. A NaN in q, in
the keys' fp8 values or in the weights gives NaN at every logit it enters, checked or not. docs/input-contract.md
has the whole contract and why.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .arguments import positive_int
from .cache import FP8_MAX, cache_geometry
from .device import memory_bytes
from .layout import check_block_layout


@dataclass(frozen=True)
class CallDims:
    """The dimensions of one checked call, read off its tensors."""

    batch: int
    next_n: int
    heads: int
    head_dim: int
    num_blocks: int
    block_size: int
    max_blocks: int
    max_model_len: int
    layout: str
    ctx_2d: bool


def check_inputs(q, kv_cache, weights, context_lens, block_tables, max_model_len, layout="normal", *,
                 check_values=True, out_dtype: torch.dtype = torch.float32, outputs: int = 1) -> CallDims:
    """Check dtypes, shapes and devices; with ``check_values`` also the lengths, block ids and scales (this reads
    them on the host, a device sync: pass False when benchmarking inputs already known to be valid). The output,
    ``outputs`` tensors of ``out_dtype`` logits, must fit in the device's memory."""
    if not isinstance(check_values, (bool, np.bool_)):  # "no" would be true
        raise TypeError(f"check_values must be a bool, got {type(check_values).__name__} {check_values!r}")
    if not isinstance(q, torch.Tensor) or q.dtype not in FP8_MAX:
        raise TypeError(f"q must be an fp8 tensor ({list(FP8_MAX)}), got {getattr(q, 'dtype', type(q))}")
    if q.dim() != 4:
        raise ValueError(f"q must be [batch, next_n, heads, head_dim], got {list(q.shape)}")
    batch, next_n, heads, head_dim = q.shape
    if next_n == 0:
        raise ValueError(f"q must have next_n >= 1, got {list(q.shape)}")
    num_blocks, block_size, cache_dim = cache_geometry(kv_cache)
    if cache_dim != head_dim:
        raise ValueError(f"kv_cache holds head_dim {cache_dim} but q has head_dim {head_dim}")
    check_block_layout(block_size, head_dim, layout)
    if not isinstance(weights, torch.Tensor) or weights.dtype != torch.float32:
        raise TypeError(f"weights must be a float32 tensor, got {getattr(weights, 'dtype', type(weights))}")
    if tuple(weights.shape) != (batch * next_n, heads):
        raise ValueError(f"weights must be [batch*next_n, heads] = [{batch * next_n}, {heads}], "
                         f"got {list(weights.shape)}")
    if not isinstance(context_lens, torch.Tensor) or context_lens.dtype != torch.int32:
        raise TypeError(f"context_lens must be an int32 tensor, got {getattr(context_lens, 'dtype', None)}")
    if tuple(context_lens.shape) not in ((batch,), (batch, next_n)):
        raise ValueError(f"context_lens must be [batch] = [{batch}] or [batch, next_n] = [{batch}, {next_n}], "
                         f"got {list(context_lens.shape)}")
    if not isinstance(block_tables, torch.Tensor) or block_tables.dtype != torch.int32:
        raise TypeError(f"block_tables must be an int32 tensor, got {getattr(block_tables, 'dtype', None)}")
    if block_tables.dim() != 2 or block_tables.shape[0] != batch:
        raise ValueError(f"block_tables must be [batch, max_blocks] with batch {batch}, got {list(block_tables.shape)}")
    max_model_len = positive_int(max_model_len, "max_model_len")
    devices = {t.device for t in (q, kv_cache, weights, context_lens, block_tables)}
    if len(devices) != 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(map(str, devices))}")
    rows = outputs * batch * next_n
    kind = "fp32" if out_dtype == torch.float32 else str(out_dtype).removeprefix("torch.")
    check_fits(out_dtype.itemsize * rows * max_model_len, q.device,
               f"max_model_len {max_model_len} asks for {rows} rows of {max_model_len} {kind} logits")

    dims = CallDims(batch, next_n, heads, head_dim, num_blocks, block_size, block_tables.shape[1],
                    max_model_len, layout, context_lens.dim() == 2)
    if check_values:
        _check_values(dims, kv_cache, context_lens, block_tables)
    return dims


def check_fits(nbytes: int, dev: torch.device, what: str) -> None:
    """Refuse an output of ``nbytes`` the device cannot hold (it would fail inside the allocator, or on the CPU pass
    it and fail when written); ``what`` names what asks for it."""
    capacity = memory_bytes(dev)
    if capacity is not None and nbytes > capacity:
        raise ValueError(f"{what} ({nbytes / 2**30:.1f} GiB), more than the {dev.type} device's "
                         f"{capacity / 2**30:.1f} GiB of memory")


# The logits' element types a kernel writes: fp32, or bf16 (DeepGEMM's ``logits_dtype``).
LOGITS_DTYPES = (torch.float32, torch.bfloat16)


def check_output_options(clean_logits, logits_dtype) -> None:
    """Refuse a ``clean_logits`` that is not a bool and a ``logits_dtype`` not in :data:`LOGITS_DTYPES`."""
    if not isinstance(clean_logits, bool):
        raise TypeError(f"clean_logits must be a bool, got {type(clean_logits).__name__} {clean_logits!r}")
    if not isinstance(logits_dtype, torch.dtype):
        raise TypeError(f"logits_dtype must be torch.float32 or torch.bfloat16, got {type(logits_dtype).__name__} "
                        f"{logits_dtype!r}")
    if logits_dtype not in LOGITS_DTYPES:
        raise ValueError(f"logits_dtype must be torch.float32 or torch.bfloat16, got {logits_dtype}")


def output_tensor(out: torch.Tensor | None, shape: tuple[int, int], dev: torch.device,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The tensor a kernel writes its ``shape`` logits of ``dtype`` into: ``out`` once checked, else a new one.
    ``out``'s rows may be padded (DeepGEMM returns a view of rows padded to 256 logits): each row's elements must be
    contiguous, and rows at least a row apart."""
    if out is None:  # sizes as separate ints: half the host time of a tuple (docs/kernel-design.md)
        return torch.empty(*shape, dtype=dtype, device=dev)
    name = str(dtype).removeprefix("torch.")
    if not isinstance(out, torch.Tensor) or out.dtype != dtype:
        raise TypeError(f"out must be a {name} tensor, got {getattr(out, 'dtype', type(out).__name__)}")
    rows_contiguous = out.dim() == 2 and (out.shape[1] <= 1 or out.stride(1) == 1) and (
        out.shape[0] <= 1 or out.stride(0) >= out.shape[1])
    if tuple(out.shape) != shape or not rows_contiguous or out.device != dev:
        raise ValueError(f"out must be a {name} tensor of shape {list(shape)} on {dev} with contiguous rows, got "
                         f"{list(out.shape)} on {out.device}{'' if rows_contiguous else ', rows not contiguous'}")
    if out.requires_grad:  # the kernel writes behind autograd's back: its graph would hold stale values
        raise ValueError("out must not require grad (the kernel's write is not recorded by autograd)")
    return out


def byte_span(t: torch.Tensor) -> tuple[int, int]:
    """``[first, end)``: the addresses of the bytes ``t``'s elements lie in (first == end when it has none)."""
    first = t.data_ptr()
    if t.numel() == 0:
        return first, first
    return first, first + (sum((n - 1) * step for n, step in zip(t.shape, t.stride())) + 1) * t.element_size()


def refuse_overlap(out: torch.Tensor, **inputs: torch.Tensor) -> None:
    """Refuse an ``out`` whose bytes overlap those of an input (by address range, so views and slices of one buffer
    count): the kernels would write logits over what they read, and programs that read what others wrote race."""
    first, end = byte_span(out)
    for name, t in inputs.items():
        t_first, t_end = byte_span(t)
        if first < t_end and t_first < end:
            raise ValueError(f"out overlaps {name} (out's bytes [{first:#x}, {end:#x}), {name}'s "
                             f"[{t_first:#x}, {t_end:#x})): the logits would be written over an input; pass an out of "
                             f"its own")


def valid_scales(scales: torch.Tensor) -> torch.Tensor:
    """bool, where a scale is finite and positive: the only scales for which ``relu(s x) = s relu(x)``, the identity
    every kernel computes with (NaN fails both comparisons)."""
    return (scales > 0) & (scales < math.inf)


def cache_scales(kv_cache: torch.Tensor) -> torch.Tensor:
    """fp32 ``[num_blocks, block_size]``: every token's scale, a view of the cache (a copy where the cache's bytes
    do not start on a 4-byte boundary, which no fp32 view can have)."""
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    value_bytes = kv_cache[0].numel() - 4 * block_size
    scales = kv_cache.view(num_blocks, -1)[:, value_bytes:]
    return (scales.contiguous() if scales.storage_offset() % 4 else scales).view(torch.float32)


def kv_lengths(context_lens: torch.Tensor, next_n: int) -> torch.Tensor:
    """``[B, next_n]``: how many leading positions row (b, j) may see."""
    if context_lens.dim() == 2:
        return context_lens.to(torch.int64)
    j = torch.arange(next_n, device=context_lens.device)
    return (context_lens.to(torch.int64).unsqueeze(1) - next_n + j + 1).clamp(min=0)


def unreadable_positions(context_lens: torch.Tensor, block_tables: torch.Tensor, num_blocks: int, block_size: int,
                         next_n: int, max_model_len: int) -> torch.Tensor:
    """bool ``[B * next_n, max_model_len]``: the positions a row may see whose key cannot be read, because their
    block id is outside ``[0, num_blocks)`` or their block-table row has no entry that far. Inputs that pass the
    value checks have none; unchecked calls (``check_values=False``) return NaN exactly there."""
    lens = kv_lengths(context_lens, next_n)                                            # [B, next_n]
    ids = block_tables.to(torch.int64)
    no_entry = torch.ones(ids.shape[0], 1, dtype=torch.bool, device=ids.device)       # every column past the row
    bad = torch.cat([(ids < 0) | (ids >= num_blocks), no_entry], dim=1)               # [B, max_blocks + 1]
    positions = torch.arange(max_model_len, device=ids.device)
    bad_at = bad[:, (positions // block_size).clamp(max=ids.shape[1])]                # [B, max_model_len]
    return (bad_at.unsqueeze(1) & (positions < lens.unsqueeze(-1))).reshape(-1, max_model_len)


def bad_scale_positions(kv_cache: torch.Tensor, context_lens: torch.Tensor, block_tables: torch.Tensor, next_n: int,
                        max_model_len: int) -> torch.Tensor:
    """bool ``[B * next_n, max_model_len]``: the positions a row may see whose key can be read (see
    :func:`unreadable_positions`) but whose scale is not finite and positive. Checked calls refuse them; unchecked
    calls return NaN exactly there."""
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    lens = kv_lengths(context_lens, next_n)                                            # [B, next_n]
    ids = block_tables.to(torch.int64)
    positions = torch.arange(max_model_len, device=ids.device)
    entry = positions // block_size
    if ids.shape[1] == 0:
        return torch.zeros(ids.shape[0] * next_n, max_model_len, dtype=torch.bool, device=ids.device)
    pages = ids[:, entry.clamp(max=ids.shape[1] - 1)]                                 # [B, max_model_len]
    readable = (pages >= 0) & (pages < num_blocks) & (entry < ids.shape[1])
    scales = cache_scales(kv_cache).to(ids.device)[pages.clamp(0, num_blocks - 1), positions % block_size]
    bad = readable & ~valid_scales(scales)
    return (bad.unsqueeze(1) & (positions < lens.unsqueeze(-1))).reshape(-1, max_model_len)


def _check_scales(kv_cache: torch.Tensor, ids: torch.Tensor, used: torch.Tensor, needed: torch.Tensor,
                  block_size: int) -> None:
    """Refuse a scale that is not finite and positive at a position a sequence reads: ``ids`` the block ids of the
    ``used`` entries of the table, ``needed`` how many positions each sequence reads."""
    sequence, entry = used.nonzero(as_tuple=True)
    read = (needed[sequence] - entry * block_size).clamp(max=block_size)                # positions read per block
    dev = kv_cache.device
    scales = cache_scales(kv_cache)[ids.to(dev, torch.int64)]                          # [blocks read, block_size]
    bad = ~valid_scales(scales) & (torch.arange(block_size, device=dev) < read.to(dev).unsqueeze(1))
    if bad.any():
        i, token = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"kv_cache holds scale {scales[i, token].item()} at block {int(ids[i])}, token {token} "
                         f"(position {int(entry[i]) * block_size + token} of sequence {int(sequence[i])}): scales "
                         f"must be finite and positive")


def _check_values(p: CallDims, kv_cache: torch.Tensor, context_lens: torch.Tensor, block_tables: torch.Tensor) -> None:
    lens = context_lens.cpu()
    if lens.numel() == 0:
        return
    if (lens < 0).any():
        raise ValueError(f"context_lens must be >= 0, got {int(lens.min())}")
    capacity = p.max_blocks * p.block_size
    longest = int(lens.max())
    if longest > capacity:
        raise ValueError(f"context length {longest} is beyond what block_tables can hold "
                         f"({p.max_blocks} blocks of {p.block_size} = {capacity} tokens)")
    if longest > p.max_model_len:
        raise ValueError(f"max_model_len {p.max_model_len} is smaller than the longest context length {longest}")
    # Only the blocks a sequence reads must be real; the table's tail may hold padding.
    needed = kv_lengths(lens, p.next_n).amax(dim=1)
    used = torch.arange(p.max_blocks).unsqueeze(0) < ((needed + p.block_size - 1) // p.block_size).unsqueeze(1)
    ids = block_tables.cpu()[used]
    if ids.numel() and (ids.min() < 0 or ids.max() >= p.num_blocks):
        bad = ids[(ids < 0) | (ids >= p.num_blocks)][0]
        raise ValueError(f"block_tables holds block id {int(bad)} outside [0, {p.num_blocks}) "
                         f"in a block the context reads")
    if ids.numel():
        _check_scales(kv_cache, ids, used, needed, p.block_size)
