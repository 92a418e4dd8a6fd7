"""The lightning indexer's FP8 K cache: quantise, write by slot, read back through a block table.

One token is 132 bytes: 128 fp8 values and one fp32 scale. A block of ``B`` tokens is stored block-flat:
``B*D`` value bytes (NORMAL or SHUFFLE order, see :mod:`preshuffle.layout`), then ``B`` fp32 scales. The
tensor is typed ``[num_blocks, B, 1, D + 4]`` uint8, but ``cache[n, t]`` is token t's record only when B == 1.
"""

from __future__ import annotations

import numpy as np
import torch

from .arguments import non_negative_int, positive_int
from .layout import check_block_layout, offset_map
from .paging import slot_mapping

SCALE_BYTES = 4
SCALE_FLOOR = 1e-4
# vLLM's writer uses 224, not the format's 240, for the fnuz variant (MI300): docs/layout.md.
FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e4m3fnuz: 224.0}
SCALE_FORMATS = (None, "ue8m0")


def fp8_max(fp8_dtype: torch.dtype) -> float:
    if fp8_dtype not in FP8_MAX:
        raise TypeError(f"fp8_dtype must be one of {list(FP8_MAX)}, got {fp8_dtype}")
    return FP8_MAX[fp8_dtype]


def _check_keys(k) -> None:
    if not isinstance(k, torch.Tensor):
        raise TypeError(f"k must be a tensor [num_tokens, head_dim], got {type(k).__name__}")
    if k.dim() != 2:
        raise ValueError(f"k must be 2-D [num_tokens, head_dim], got {list(k.shape)}")
    if k.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise TypeError(f"k must be bfloat16, float16 or float32, got {k.dtype}")
    if k.device.type == "meta":
        raise ValueError("k is on meta: it holds no values to quantise")


def _check_finite(k: torch.Tensor, written: torch.Tensor | None = None) -> None:
    """Refuse a NaN or Inf in any token of ``k`` (only those where ``written``, when given)."""
    bad = ~torch.isfinite(k).all(dim=1)
    if written is not None:
        bad &= written
    if bad.any():
        token = int(bad.nonzero()[0, 0])
        value = k[token][~torch.isfinite(k[token])][0].item()
        raise ValueError(f"k must be finite, but token {token} holds {value}: its scale would be NaN")


def token_scales(amax: torch.Tensor, *, fp8_dtype: torch.dtype = torch.float8_e4m3fn,
                 scale_fmt: str | None = None) -> torch.Tensor:
    """The scale of each token whose largest magnitude is ``amax``: ``max(amax, 1e-4) / fp8_max`` (a power of two,
    rounded up, with ``scale_fmt="ue8m0"``), in ``amax``'s dtype."""
    if not isinstance(amax, torch.Tensor) or not amax.is_floating_point():
        raise TypeError(f"amax must be a floating-point tensor, got {getattr(amax, 'dtype', type(amax).__name__)}")
    if scale_fmt not in SCALE_FORMATS:
        raise ValueError(f"scale_fmt must be one of {SCALE_FORMATS}, got {scale_fmt!r}")
    bad = ~(torch.isfinite(amax) & (amax >= 0))  # a largest magnitude; clamp would turn -3 (and NaN) into a scale
    if bad.any():
        index = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(f"amax must be finite and >= 0 (each token's largest magnitude), got {amax[index].item()} "
                         f"at index {index[0] if len(index) == 1 else index}")
    scale = amax.clamp(min=SCALE_FLOOR) / fp8_max(fp8_dtype)
    if scale_fmt == "ue8m0":
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    return scale


def quantize_k(k: torch.Tensor, *, fp8_dtype: torch.dtype = torch.float8_e4m3fn, scale_fmt: str | None = None):
    """Per-token FP8 quantisation by :func:`token_scales`: returns ``(fp8 values [T, D], fp32 scales [T])`` with
    ``values * scale ~= k``.

    A NaN or Inf in ``k`` raises ``ValueError`` naming the token (vLLM would quantise it into a NaN scale)."""
    _check_keys(k)
    top = fp8_max(fp8_dtype)
    _check_finite(k)
    k = k.detach().float()
    scale = token_scales(k.abs().amax(dim=-1), fp8_dtype=fp8_dtype, scale_fmt=scale_fmt)
    values = (k / scale.unsqueeze(-1)).clamp(-top, top).to(fp8_dtype)
    return values, scale


def allocate_k_cache(num_blocks: int, block_size: int, head_dim: int = 128, device=None) -> torch.Tensor:
    """A zeroed uint8 cache ``[num_blocks, block_size, 1, head_dim + 4]``."""
    num_blocks, block_size, head_dim = (positive_int(v, name) for v, name in (
        (num_blocks, "num_blocks"), (block_size, "block_size"), (head_dim, "head_dim")))
    if head_dim % 16:
        raise ValueError(f"head_dim must be a multiple of 16, got {head_dim}")
    try:
        dev = torch.device(device) if device is not None else torch.get_default_device()
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"device must name a torch device, got {device!r}") from exc
    try:  # torch raises AssertionError for a backend it was built without, RuntimeError for a missing device
        torch.empty(1, dtype=torch.uint8, device=dev)
    except (AssertionError, RuntimeError) as exc:
        raise ValueError(f"device must be a device this torch can allocate on, got {device!r}: {exc}") from exc
    shape = (num_blocks, block_size, 1, head_dim + SCALE_BYTES)
    try:
        return torch.zeros(shape, dtype=torch.uint8, device=dev)
    except RuntimeError as exc:  # too large for the device, or for a size in int64
        raise ValueError(f"a cache of {num_blocks} blocks of {block_size} tokens "
                         f"({num_blocks * block_size * (head_dim + SCALE_BYTES)} bytes) cannot be allocated on "
                         f"{dev}: {exc}") from exc


def cache_geometry(kv_cache: torch.Tensor) -> tuple[int, int, int]:
    """``(num_blocks, block_size, head_dim)`` of a cache, after checking its dtype, shape and memory."""
    if not isinstance(kv_cache, torch.Tensor):  # a NumPy array has a dtype too: name its type
        raise TypeError(f"kv_cache must be a uint8 tensor, got {type(kv_cache).__name__}")
    if kv_cache.dtype != torch.uint8:
        raise TypeError(f"kv_cache must be a uint8 tensor, got {kv_cache.dtype}")
    shape = tuple(kv_cache.shape)
    if not (len(shape) == 4 and shape[2] == 1 or len(shape) == 3):
        raise ValueError(f"kv_cache must be [num_blocks, block_size, 1, head_dim + 4] or "
                         f"[num_blocks, block_size, head_dim + 4], got {list(shape)}")
    if shape[0] == 0 or shape[1] == 0:
        raise ValueError(f"kv_cache must hold at least one block of at least one token, got {list(shape)}")
    if shape[-1] <= SCALE_BYTES or (shape[-1] - SCALE_BYTES) % 16:
        raise ValueError(f"kv_cache's last dim must be head_dim + 4 with head_dim a multiple of 16, got {shape[-1]}")
    if not kv_cache.is_contiguous():
        raise ValueError("kv_cache must be contiguous: its blocks are addressed as flat bytes")
    if kv_cache.device.type == "meta":
        raise ValueError("kv_cache is on meta: it holds no bytes to read or write")
    return shape[0], shape[1], shape[-1] - SCALE_BYTES


def _flat_blocks(kv_cache: torch.Tensor) -> torch.Tensor:
    num_blocks = kv_cache.shape[0]
    return kv_cache.view(num_blocks, -1)


def _slot_bytes(slots: torch.Tensor, block_size: int, head_dim: int, layout: str):
    """Where each slot's record lies in the flat blocks: its block ``[..., 1]``, and the offsets of its values in
    ``layout`` ``[..., D]`` and of its scale ``[..., 4]`` in that block (on the slots' device)."""
    block, token = slots // block_size, slots % block_size
    value_offsets = offset_map(block_size, head_dim, layout).to(slots.device)[token]
    scale_offsets = (block_size * head_dim + SCALE_BYTES * token.unsqueeze(-1)
                     + torch.arange(SCALE_BYTES, device=slots.device))
    return block.unsqueeze(-1), value_offsets, scale_offsets


def _check_index_tensor(t, name: str) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name} must be an int32/int64 tensor, got {getattr(t, 'dtype', type(t).__name__)}")
    if t.device.type == "meta":
        raise ValueError(f"{name} is on meta: it holds no values")


def write_k_cache(kv_cache: torch.Tensor, k: torch.Tensor, slot_mapping: torch.Tensor, *, layout: str = "normal",
                  scale_fmt: str | None = None, fp8_dtype: torch.dtype = torch.float8_e4m3fn) -> None:
    """Quantise ``k [T, D]`` and scatter token i to slot ``slot_mapping[i]`` (-1 skips it), in place.

    All or nothing: every argument is checked, and the whole write prepared, before one indexed store changes
    the cache. ``k`` must be on the cache's device; ``slot_mapping`` may be on any device that holds values.
    Keys must be finite: a NaN or Inf in a token that would be written raises ``ValueError`` naming the token
    (vLLM's writer would store a NaN scale and garbage values; a workbook should say so instead). Tokens with
    slot -1 are not looked at. So every scale it writes is finite and positive (at least ``1e-4 / fp8_max``), and
    its fp8 values are never NaN: the kernels' contract for non-finite and non-positive inputs
    (docs/input-contract.md) concerns caches written some other way."""
    num_blocks, block_size, head_dim = cache_geometry(kv_cache)
    if kv_cache.is_inference() and not torch.is_inference_mode_enabled():
        # torch would raise this only after the indexed store has written its bytes.
        raise ValueError("kv_cache was made under torch.inference_mode() and can only be written inside it: "
                         "write inside torch.inference_mode(), or pass kv_cache.clone()")
    check_block_layout(block_size, head_dim, layout)
    if not isinstance(k, torch.Tensor):
        raise TypeError(f"k must be a tensor [num_tokens, {head_dim}], got {type(k).__name__}")
    if k.dim() != 2 or k.shape[1] != head_dim:
        raise ValueError(f"k must be [num_tokens, {head_dim}] to match the cache, got {list(k.shape)}")
    if k.device != kv_cache.device:
        raise ValueError(f"k is on {k.device} but kv_cache is on {kv_cache.device}: pass k on {kv_cache.device}")
    _check_keys(k)
    _check_index_tensor(slot_mapping, "slot_mapping")
    if slot_mapping.shape != (k.shape[0],):
        raise ValueError(f"slot_mapping must be [{k.shape[0]}] (one slot per token), got {list(slot_mapping.shape)}")
    slots = slot_mapping.to(torch.int64).cpu()
    capacity = num_blocks * block_size
    bad = (slots < -1) | (slots >= capacity)
    if bad.any():
        raise ValueError(f"slot_mapping has slot {int(slots[bad][0])} outside [-1, {capacity}) "
                         f"({num_blocks} blocks of {block_size})")
    keep = slots >= 0
    if torch.unique(slots[keep]).numel() != int(keep.sum()):
        raise ValueError("slot_mapping writes one slot twice")
    device = kv_cache.device
    keep = keep.to(device)
    _check_finite(k, keep)
    values, scales = quantize_k(k[keep], fp8_dtype=fp8_dtype, scale_fmt=scale_fmt)

    # One store of each written token's 132 bytes: values at their layout's offsets, then its scale.
    block, value_offsets, scale_offsets = _slot_bytes(slots.to(device)[keep], block_size, head_dim, layout)
    record = torch.cat([values.view(torch.uint8), scales.unsqueeze(1).view(torch.uint8)], dim=1)
    _flat_blocks(kv_cache)[block, torch.cat([value_offsets, scale_offsets], dim=1)] = record


def read_slots(kv_cache: torch.Tensor, slots: torch.Tensor, *, layout: str = "normal",
               fp8_dtype: torch.dtype = torch.float8_e4m3fn):
    """The fp8 values ``[..., D]`` and fp32 scales ``[...]`` stored at each slot (any shape of slots)."""
    num_blocks, block_size, head_dim = cache_geometry(kv_cache)
    check_block_layout(block_size, head_dim, layout)
    fp8_max(fp8_dtype)
    _check_index_tensor(slots, "slots")
    slots = slots.to(torch.int64).to(kv_cache.device)
    if slots.numel() and (slots.min() < 0 or slots.max() >= num_blocks * block_size):
        raise ValueError(f"slots must be in [0, {num_blocks * block_size}), got range "
                         f"[{int(slots.min())}, {int(slots.max())}]")
    block, value_offsets, scale_offsets = _slot_bytes(slots, block_size, head_dim, layout)
    flat = _flat_blocks(kv_cache)
    values = flat[block, value_offsets].view(fp8_dtype)
    scales = flat[block, scale_offsets].contiguous().view(torch.float32).squeeze(-1)
    return values, scales


def sequence_slots(block_table: torch.Tensor, num_tokens: int, block_size: int) -> torch.Tensor:
    """int64 slots of positions ``0 .. num_tokens-1`` of one sequence, on the table's device: the vLLM slot
    mapping (:func:`preshuffle.paging.slot_mapping`) of a whole prefix.

    The block ids those positions read must be non-negative; the table's tail past them may hold anything."""
    block_size = positive_int(block_size, "block_size")
    num_tokens = non_negative_int(num_tokens, "num_tokens")
    _check_index_tensor(block_table, "block_table")
    if block_table.dim() != 1:
        raise ValueError(f"block_table must be a 1-D tensor of kernel block ids, got shape {list(block_table.shape)}")
    if num_tokens > block_table.numel() * block_size:
        raise ValueError(f"num_tokens {num_tokens} is beyond the block table's "
                         f"{block_table.numel()} blocks of {block_size}")
    slots = slot_mapping(block_table.cpu().numpy(), np.arange(num_tokens), block_size)
    return torch.from_numpy(slots).to(block_table.device)


def gather_k_cache(kv_cache: torch.Tensor, block_table: torch.Tensor, num_tokens: int, *, layout: str = "normal",
                   fp8_dtype: torch.dtype = torch.float8_e4m3fn):
    """Positions ``0 .. num_tokens-1`` of one sequence, read through its block table ``[max_blocks]``:
    natural fp8 values ``[num_tokens, D]`` and fp32 scales ``[num_tokens]``. The block ids those positions read must
    be blocks of the cache."""
    num_blocks, block_size, _ = cache_geometry(kv_cache)
    slots = sequence_slots(block_table, num_tokens, block_size)
    ids = block_table[:-(-int(num_tokens) // block_size)].cpu()
    if ids.numel() and int(ids.max()) >= num_blocks:
        index = int((ids >= num_blocks).nonzero()[0, 0])
        raise ValueError(f"block_table holds block id {int(ids[index])} at index {index}, outside the cache's "
                         f"{num_blocks} blocks, in the first {int(num_tokens)} positions")
    return read_slots(kv_cache, slots, layout=layout, fp8_dtype=fp8_dtype)
