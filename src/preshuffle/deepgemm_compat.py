"""DeepGEMM's Python API for paged MQA logits, the calls vLLM's sparse indexer makes, on this package's kernels:
:func:`get_paged_mqa_logits_metadata`, :func:`fp8_fp4_paged_mqa_logits`, :func:`fp8_paged_mqa_logits` and
:func:`get_num_sms`, with DeepGEMM's names, argument order and defaults (DeepGEMM 54e2261,
``csrc/apis/attention.hpp``). docs/vllm.md says how to route vLLM's call here.

It takes what DeepGEMM takes: fp8 queries as the pair ``(q, None)``, a ``[B, next_n]`` int32 length per row (or
``[B]``, the package's own form), block tables wider than the contexts need, and the schedule metadata, which it never
reads (the kernels cut their launch on the host). It returns what DeepGEMM returns: ``[B * next_n, max_context_len]``
logits of ``logits_dtype``, a view of rows padded as DeepGEMM pads them (to a multiple of 256 logits and of 1 KiB), the
logits a row may see, and positions outside each row's visible prefix unspecified unless ``clean_logits``.

Beyond DeepGEMM's SM90 kernel: next_n 3 and 4 natively (more through the portable kernel), pages of any size (1, 16,
32, 64 or more tokens), preshuffled pages (``layout="shuffle"``), 16 to 128 heads, ``clean_logits=True`` with 2-D
lengths, and ``precision="exact"``. It refuses what it cannot do with DeepGEMM's kind of message, the function's name
then what failed: fp4 queries, varlen ``indices``, a schedule that is not an int32 ``[n, 2]`` tensor; every other bad
argument meets the kernels' own checks. It never reads lengths or block ids on the host (no device sync, so a CUDA
graph can capture it): where a row may see a position whose block id is invalid, its logit is NaN
(:func:`preshuffle.contract.unreadable_positions`) where DeepGEMM would read outside the cache.
"""

from __future__ import annotations

import torch

from . import device
from .arguments import positive_int
from .contract import LOGITS_DTYPES, check_fits
from .kernels import fp8_paged_mqa_logits as _logits

__all__ = ["fp8_fp4_paged_mqa_logits", "fp8_paged_mqa_logits", "get_num_sms", "get_paged_mqa_logits_metadata",
           "padded_row"]

# DeepGEMM's output rows: a multiple of its 256-position split of the context, and of 1 KiB.
SPLIT_KV = 256
ROW_ALIGNMENT_BYTES = 1024


def get_num_sms() -> int:
    """The current CUDA device's SMs, DeepGEMM's default scheduler slot count; 1 under Triton's interpreter."""
    if device.INTERPRETED:
        return 1
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _context_lens_or_refuse(context_lens, what: str) -> torch.Tensor:
    if not isinstance(context_lens, torch.Tensor) or context_lens.dtype != torch.int32:
        raise TypeError(f"{what}: context_lens must be an int32 tensor [batch, next_n], got "
                        f"{getattr(context_lens, 'dtype', type(context_lens).__name__)}")
    if context_lens.dim() not in (1, 2):
        raise ValueError(f"{what}: context_lens must be [batch, next_n] (or [batch]), got {list(context_lens.shape)}")
    return context_lens


def _refuse_indices(indices, what: str) -> None:
    if indices is not None:
        raise ValueError(f"{what}: varlen indices are not supported (DeepGEMM takes them on SM100 only); pass one "
                         f"row per query, indices=None")


def get_paged_mqa_logits_metadata(context_lens: torch.Tensor, block_kv: int, num_sms: int,
                                  indices: torch.Tensor | None = None) -> torch.Tensor:
    """DeepGEMM's schedule metadata, int32 ``[num_sms + 1, 2]`` on the lengths' device, for a call of
    :func:`fp8_fp4_paged_mqa_logits` to ignore: zeros (the kernels split each sequence's row on the host). The
    arguments are checked as DeepGEMM checks them: ``num_sms`` is the caller's slot count (vLLM passes half the SMs
    to DeepGEMM nv_dev at next_n = 4; any count serves here)."""
    what = "get_paged_mqa_logits_metadata"
    context_lens = _context_lens_or_refuse(context_lens, what)
    positive_int(block_kv, "block_kv")
    num_sms = positive_int(num_sms, "num_sms")
    _refuse_indices(indices, what)
    return torch.zeros(num_sms + 1, 2, dtype=torch.int32, device=context_lens.device)


def padded_row(max_context_len: int, logits_dtype: torch.dtype) -> int:
    """DeepGEMM's row stride for ``max_context_len`` logits of ``logits_dtype``: the length rounded up to a multiple
    of 256 positions, then of 1 KiB (256 fp32 logits, 512 bf16 ones)."""
    per_alignment = ROW_ALIGNMENT_BYTES // logits_dtype.itemsize
    split = -(-max_context_len // SPLIT_KV) * SPLIT_KV
    return -(-split // per_alignment) * per_alignment


def _padded_output(q, max_context_len: int, logits_dtype) -> torch.Tensor | None:
    """DeepGEMM's output, a view of padded rows, for arguments well-formed enough to size it; None where they are
    not (the kernels' checks then name what is wrong)."""
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or logits_dtype not in LOGITS_DTYPES:
        return None
    rows, stride = q.shape[0] * q.shape[1], padded_row(max_context_len, logits_dtype)
    check_fits(rows * stride * logits_dtype.itemsize, q.device,
               f"max_context_len {max_context_len} asks for {rows} rows of {stride} {logits_dtype} logits")
    return torch.empty(rows, stride, dtype=logits_dtype, device=q.device)[:, :max_context_len]


def fp8_fp4_paged_mqa_logits(q, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                             block_table: torch.Tensor, schedule_meta: torch.Tensor, max_context_len: int,
                             clean_logits: bool = False, logits_dtype: torch.dtype = torch.float32,
                             indices: torch.Tensor | None = None, *, layout: str = "normal", precision: str = "fp8",
                             check_values: bool = False) -> torch.Tensor:
    """DeepGEMM's ``fp8_fp4_paged_mqa_logits`` (module docstring) on the package's kernels.

    ``q``: ``(q_fp8, None)``, q_fp8 e4m3 ``[B, next_n, H, D]``; ``kv_cache``: uint8 ``[num_blocks, block_size, 1,
    D + 4]`` (or without the 1), natural pages, or preshuffled with ``layout="shuffle"``; ``weights``: fp32
    ``[B * next_n, H]``; ``context_lens``: int32 ``[B, next_n]`` (row j sees positions below ``context_lens[b, j]``)
    or ``[B]``; ``block_table``: int32 ``[B, max_blocks]``; ``schedule_meta``: :func:`get_paged_mqa_logits_metadata`'s
    (or DeepGEMM's) tensor, not read. ``precision``: "fp8" (DeepGEMM's numerics) or "exact"; ``check_values=True``
    reads the lengths and block ids on the host and refuses bad ones (a device sync)."""
    what = "fp8_fp4_paged_mqa_logits"
    if not isinstance(q, (tuple, list)) or len(q) != 2:
        raise TypeError(f"{what}: q must be the pair (values, scales), (q, None) for fp8 queries, got "
                        f"{type(q).__name__}")
    q, scales = q
    if scales is not None:
        raise ValueError(f"{what}: fp4 queries (q with scales) are not supported: pass fp8 queries, (q, None), with "
                         f"q torch.float8_e4m3fn")
    _refuse_indices(indices, what)
    if not isinstance(schedule_meta, torch.Tensor) or schedule_meta.dtype != torch.int32:
        raise TypeError(f"{what}: schedule_meta must be the int32 tensor get_paged_mqa_logits_metadata returns, got "
                        f"{getattr(schedule_meta, 'dtype', type(schedule_meta).__name__)}")
    if schedule_meta.dim() != 2 or schedule_meta.shape[0] < 1 or schedule_meta.shape[1] != 2:
        raise ValueError(f"{what}: schedule_meta must be [num_sms + 1, 2], got {list(schedule_meta.shape)}")
    if isinstance(q, torch.Tensor) and schedule_meta.device != q.device:
        raise ValueError(f"{what}: schedule_meta is on {schedule_meta.device}, q on {q.device}")
    max_context_len = positive_int(max_context_len, "max_context_len")
    return _logits(q, kv_cache, weights, context_lens, block_table, max_context_len, layout=layout,
                   precision=precision, check_values=check_values, clean_logits=clean_logits,
                   logits_dtype=logits_dtype, out=_padded_output(q, max_context_len, logits_dtype))


def fp8_paged_mqa_logits(q: torch.Tensor, kv_cache: torch.Tensor, weights: torch.Tensor, context_lens: torch.Tensor,
                         block_table: torch.Tensor, schedule_meta: torch.Tensor, max_context_len: int,
                         clean_logits: bool = False, indices: torch.Tensor | None = None, *, layout: str = "normal",
                         precision: str = "fp8", check_values: bool = False) -> torch.Tensor:
    """DeepGEMM's older ``fp8_paged_mqa_logits``: :func:`fp8_fp4_paged_mqa_logits` with a bare fp8 ``q`` and fp32
    logits."""
    return fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, context_lens, block_table, schedule_meta,
                                    max_context_len, clean_logits, torch.float32, indices, layout=layout,
                                    precision=precision, check_values=check_values)
