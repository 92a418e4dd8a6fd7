"""The indexer's last step: each query row keeps the positions of its k largest logits (DeepSeek-V3.2 keeps 2048),
the tokens its sparse attention reads. The Triton kernels are :mod:`preshuffle.topk.portable`.

**The selection.** Row ``r`` sees the leading positions the logits kernel's rule gives it
(:func:`preshuffle.contract.kv_lengths`: with 1-D ``context_lens`` row ``b*next_n + j`` sees
``context_lens[b] - next_n + j + 1``, with 2-D ones ``context_lens[b, j]``), cut to the logits' width. Its visible
positions are ordered by value, largest first, in this order:

* numbers by value, ``-0.0`` equal to ``+0.0``, ``-inf`` below every other number;
* NaN (any sign or payload) below ``-inf``, all NaNs equal;
* equal values by position, lowest first.

The selection is the first ``min(k, n)`` visible positions of that order (``n`` visible), so it is one set for every
input. The output holds them, in no order a caller may rely on, then -1 for each of the ``k - n`` slots a row with
fewer than k visible positions leaves (vLLM pads the same way). Logits outside each row's visible prefix are never
read, so logits written with ``clean_logits=False`` (garbage there) give the same selection.

Another implementation may break ties differently: :func:`is_top_k` accepts any set that takes every position above
the k-th value and fills the rest with positions equal to it.

**Kernels.** On an sm90 GPU (H100, H200) the selection runs the Gluon kernel of
:mod:`preshuffle.topk.hopper` (a shared-memory histogram, thread-block clusters for few long rows); elsewhere,
and under Triton's interpreter, the Triton kernels of :mod:`preshuffle.topk.portable`. Both give the same set.
"""

from __future__ import annotations

import math

import torch

from .. import device
from ..arguments import positive_int
from ..contract import kv_lengths
from .backends import check_owner, choose
from .hopper import HopperTopKConfig
from .portable import TopKConfig

TOPK = 2048  # DeepSeek-V3.2's index_topk
LOGIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _sequences(logits: torch.Tensor, context_lens) -> tuple[int, int, bool]:
    """(batch, next_n, 2-D lengths) that ``context_lens`` implies for ``logits``' rows, after checking both."""
    if not isinstance(logits, torch.Tensor) or not logits.dtype.is_floating_point:
        got = getattr(logits, "dtype", type(logits).__name__)
        raise TypeError(f"logits must be a floating-point tensor, got {got}")
    if logits.dim() != 2:
        raise ValueError(f"logits must be [rows, positions], got shape {list(logits.shape)}")
    if not isinstance(context_lens, torch.Tensor) or context_lens.dtype != torch.int32:
        got = getattr(context_lens, "dtype", type(context_lens).__name__)
        raise TypeError(f"context_lens must be an int32 tensor, got {got}")
    rows = logits.shape[0]
    if context_lens.dim() == 2:
        batch, next_n = context_lens.shape
        if batch * next_n != rows:
            raise ValueError(f"context_lens [batch, next_n] = {list(context_lens.shape)} must give one length a row of "
                             f"logits ({rows} rows)")
        return batch, next_n, True
    if context_lens.dim() != 1:
        raise ValueError(f"context_lens must be [batch] or [batch, next_n], got shape {list(context_lens.shape)}")
    batch = context_lens.shape[0]
    if (batch == 0 and rows) or (batch and rows % batch):
        raise ValueError(f"logits' {rows} rows must be batch x next_n for the {batch} sequences of context_lens")
    return batch, rows // batch if batch else 1, False


def row_lengths(logits: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
    """int64 ``[rows]``: how many leading positions each row of ``logits`` sees, cut to its width."""
    _, next_n, _ = _sequences(logits, context_lens)
    return kv_lengths(context_lens, next_n).reshape(-1).clamp(0, logits.shape[1])


def topk_reference(logits: torch.Tensor, context_lens: torch.Tensor, k: int = TOPK) -> torch.Tensor:
    """The selection by its definition, in float64 with two stable sorts (by value, then numbers before NaN before
    what the row may not see): int32 ``[rows, k]``, best first, -1 after a short row's positions."""
    k = positive_int(k, "k")
    rows, width = logits.shape
    lens = row_lengths(logits, context_lens).to(logits.device)
    values = logits.double()
    visible = torch.arange(width, device=logits.device) < lens.unsqueeze(1)
    tier = torch.where(visible, torch.where(values.isnan(), 1, 2), 0)
    by_value = torch.where(tier == 2, values, -math.inf).sort(dim=1, descending=True, stable=True).indices
    by_tier = tier.gather(1, by_value).sort(dim=1, descending=True, stable=True).indices
    order = by_value.gather(1, by_tier)[:, :k]
    order = torch.where(tier.gather(1, order) > 0, order, -1).to(torch.int32)
    return torch.nn.functional.pad(order, (0, k - order.shape[1]), value=-1)


def topk_launch(rows: int, width: int, k: int, dtype: torch.dtype = torch.float32, *,
                support: device.KernelSupport | None = None) -> TopKConfig | HopperTopKConfig:
    """The launch :func:`indexer_topk` takes by default for ``rows`` rows of logits ``width`` wide: the default launch
    of the first kernel of :data:`preshuffle.topk.backends.BACKENDS` that runs on ``support``'s device (default: this
    process's) and takes the call: the sm90 kernel's (:func:`preshuffle.topk.hopper.default_config`) on an sm90 GPU
    where k is at most its limit, else the Triton kernels'."""
    backend = choose(support or device.current_support(), rows, width, k)
    return backend.default(rows, width, 2 if dtype in (torch.bfloat16, torch.float16) else 4)


def indexer_topk(logits: torch.Tensor, context_lens: torch.Tensor, k: int = TOPK, *, check_values: bool = True,
                 config: TopKConfig | HopperTopKConfig | None = None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Each row's selection (module docstring) by the Triton kernels: int32 ``[rows, k]``.

    ``logits``: float32, bfloat16 or float16 ``[rows, positions]`` with unit column stride (any row stride, so a
    view of a wider buffer works), as :func:`preshuffle.kernels.fp8_paged_mqa_logits` writes them: ``rows =
    batch * next_n``. ``context_lens``: int32, ``[batch]`` or ``[batch, next_n]``, as the logits kernel takes them.
    ``check_values`` reads the lengths on the host (a device sync) and refuses negative ones or ones past the
    logits' width; unchecked, a negative length sees nothing and a longer one the whole width. ``config`` sets the
    launch: :class:`preshuffle.topk.portable.TopKConfig` (the Triton kernels, any device) or
    :class:`preshuffle.topk.hopper.HopperTopKConfig` (the sm90 kernel, an sm90 GPU only); by default
    :func:`topk_launch`'s. ``out``, an int32 ``[rows, k]`` contiguous tensor, receives the result."""
    k = positive_int(k, "k")
    if k >= 2 ** 31:
        raise ValueError(f"k must be below 2**31, got {k}")
    _, next_n, ctx_2d = _sequences(logits, context_lens)
    if logits.dtype not in LOGIT_DTYPES:
        raise TypeError(f"logits must be one of {[str(d) for d in LOGIT_DTYPES]}, got {logits.dtype}")
    if logits.shape[1] and logits.stride(1) != 1:
        raise ValueError(f"logits must have unit column stride, got strides {list(logits.stride())}")
    if context_lens.device != logits.device:
        raise ValueError(f"context_lens is on {context_lens.device}, logits on {logits.device}: pass both on one "
                         f"device")
    device.require_kernel_devices(logits=logits, context_lens=context_lens)
    rows, width = logits.shape
    elem_bytes = logits.element_size()
    backend = None if config is None else check_owner(config, device.current_support(), k, width, elem_bytes)
    if out is None:
        out = torch.empty(rows, k, dtype=torch.int32, device=logits.device)
    elif not isinstance(out, torch.Tensor) or out.dtype != torch.int32:
        raise TypeError(f"out must be an int32 tensor, got {getattr(out, 'dtype', type(out).__name__)}")
    elif tuple(out.shape) != (rows, k) or not out.is_contiguous() or out.device != logits.device:
        raise ValueError(f"out must be a contiguous int32 tensor of shape {[rows, k]} on {logits.device}, got "
                         f"{list(out.shape)} on {out.device}{'' if out.is_contiguous() else ', not contiguous'}")
    if check_values and context_lens.numel():
        lens = context_lens.cpu()
        if (lens < 0).any():
            raise ValueError(f"context_lens must be >= 0, got {int(lens.min())}")
        longest = int(kv_lengths(lens, next_n).max())
        if longest > width:
            raise ValueError(f"context_lens lets a row see {longest} positions, more than the logits' {width}")
    if config is None:
        backend = choose(device.current_support(), rows, width, k)
        config = backend.default(rows, width, elem_bytes)
    return backend.launch(logits, context_lens.contiguous().reshape(-1), out, k, next_n, ctx_2d, config)


def _order_tiers(logits: torch.Tensor, lens: torch.Tensor):
    """Per position: tier (2 a visible number, 1 a visible NaN, 0 not visible) and the number (0 elsewhere)."""
    values = logits.double()
    visible = torch.arange(logits.shape[1], device=logits.device) < lens.unsqueeze(1)
    tier = torch.where(visible, torch.where(values.isnan(), 1, 2), 0)
    return tier, torch.where(tier == 2, values, 0.0)


def is_top_k(selection: torch.Tensor, logits: torch.Tensor, context_lens: torch.Tensor, k: int = TOPK, *,
             reference: torch.Tensor | None = None) -> torch.Tensor:
    """bool ``[rows]``: whether each row of ``selection`` is a top-k of its logits up to ties: ``min(k, n)`` distinct
    visible positions and -1 in the other slots, every position above the k-th value among them, and none below
    it (so positions equal to the k-th value are interchangeable). ``reference``: :func:`topk_reference` of the same
    arguments, when the caller has it (it sorts every row)."""
    k = positive_int(k, "k")
    rows, width = logits.shape
    if tuple(selection.shape) != (rows, k):
        raise ValueError(f"selection must be [rows, k] = {[rows, k]}, got {list(selection.shape)}")
    if width == 0:
        return selection.eq(-1).all(1)
    lens = row_lengths(logits, context_lens).to(logits.device)
    need = lens.clamp(max=k)
    sel = selection.to(logits.device).long()
    listed = sel >= 0
    shape_ok = (listed.sum(1) == need) & ((sel == -1) | (listed & (sel < lens.unsqueeze(1)))).all(1)
    ordered = torch.where(listed, sel, width).sort(dim=1).values
    distinct = (ordered[:, 1:] != ordered[:, :-1]) | (ordered[:, 1:] == width)
    tier, number = _order_tiers(logits, lens)
    if reference is None:
        reference = topk_reference(logits, context_lens, k)
    kth = reference.to(logits.device).long().gather(1, (need - 1).clamp(min=0).unsqueeze(1))
    kth_tier, kth_number = tier.gather(1, kth.clamp(min=0)), number.gather(1, kth.clamp(min=0))
    same_tier = tier == kth_tier
    above = (tier > kth_tier) | (same_tier & (kth_tier == 2) & (number > kth_number))
    below = (tier < kth_tier) | (same_tier & (kth_tier == 2) & (number < kth_number))
    at = sel.clamp(0, width - 1)
    picked_above = (above.gather(1, at) & listed).sum(1)
    picked_below = (below.gather(1, at) & listed).any(1)
    return shape_ok & distinct.all(1) & (picked_above == above.sum(1)) & ~picked_below


def agreement(selection: torch.Tensor, reference: torch.Tensor, width: int) -> torch.Tensor:
    """float64 ``[rows]``: the share of each row's reference positions (entries >= 0 of ``reference``, distinct) that
    ``selection`` also holds; 1 for a row whose reference is empty. ``width``: the logits' width."""
    if selection.shape != reference.shape:
        raise ValueError(f"selection {list(selection.shape)} and reference {list(reference.shape)} must have one shape")
    rows = reference.shape[0]
    member = torch.zeros(rows, width + 1, dtype=torch.bool, device=reference.device)
    member.scatter_(1, torch.where(reference >= 0, reference.long(), width), True)
    member[:, width] = False
    sel = selection.to(reference.device).long()
    hits = member.gather(1, torch.where((sel >= 0) & (sel < width), sel, width)).sum(1)
    total = (reference >= 0).sum(1)
    return torch.where(total > 0, hits.double() / total.clamp(min=1), 1.0)


def selected_slots(selection: torch.Tensor, block_tables: torch.Tensor, block_size: int, next_n: int) -> torch.Tensor:
    """int64 ``[rows, k]``: the cache slot of each selected position (row ``b*next_n + j`` reads sequence b's block
    table), -1 where the selection holds -1: the tokens a sparse-attention kernel gathers."""
    block_size = positive_int(block_size, "block_size")
    next_n = positive_int(next_n, "next_n")
    rows = selection.shape[0]
    if rows != block_tables.shape[0] * next_n:
        raise ValueError(f"selection's {rows} rows must be block_tables' {block_tables.shape[0]} sequences x next_n "
                         f"{next_n}")
    pos = selection.long()
    tables = block_tables.long().repeat_interleave(next_n, dim=0)
    index = (pos.clamp(min=0) // block_size).clamp(max=tables.shape[1] - 1)
    slots = tables.gather(1, index) * block_size + pos.clamp(min=0) % block_size
    return torch.where(pos >= 0, slots, -1)
