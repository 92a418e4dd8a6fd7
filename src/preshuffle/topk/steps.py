"""The row path of the top-k kernel (:mod:`preshuffle.topk.portable`) in plain PyTorch, one step at a time, each
to show and check against the reference: the order keys, the 16-bit buckets, the bisection over
counts, the split into positions above the k-th value's bucket and candidates in it, and the bisection of the
candidates on their fp32 keys."""

from __future__ import annotations

import torch

from ..arguments import positive_int

NAN_KEY = -(2 ** 31) + 1  # below -inf's key, as in the kernel
FP16_MAX = 65504.0


def order_keys(x: torch.Tensor) -> torch.Tensor:
    """int64 keys whose order is the selection's order of the float32 values ``x``: the fp32 bits read as a signed int,
    the bits below the sign flipped for negative values, -0.0 first made +0.0, NaN below -inf."""
    x = torch.where(x == 0, torch.zeros_like(x), x).float()
    bits = x.view(torch.int32).long()
    key = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)
    return torch.where(x.isnan(), NAN_KEY, key)


def fp16_buckets(x: torch.Tensor, bits: int) -> torch.Tensor:
    """int64: the top ``bits`` of the 16-bit key of ``x`` (the value rounded to fp16 within its finite range, mapped
    as :func:`order_keys` maps fp32), NaN in the lowest bucket."""
    if not 1 <= positive_int(bits, "bits") <= 16:
        raise ValueError(f"bits must be in [1, 16], got {bits}")
    x = torch.where(x == 0, torch.zeros_like(x), x).float()
    h = x.clamp(-FP16_MAX, FP16_MAX).half().view(torch.int16).long() & 0xFFFF
    key16 = torch.where(h >= 0x8000, 0xFFFF - h, h | 0x8000)
    return torch.where(x.isnan(), 0, key16) >> (16 - bits)


def bisect(keys: torch.Tensor, r: int) -> tuple[int, list[dict]]:
    """The largest t with at least ``r`` of ``keys`` >= t (the r-th largest key), halving ``[min, max]`` by counts;
    and each halving's interval, midpoint and count."""
    r = positive_int(r, "r")
    if r > keys.numel():
        raise ValueError(f"r must be at most the {keys.numel()} keys, got {r}")
    lo, hi = int(keys.min()), int(keys.max())
    trace = []
    while lo < hi:
        mid = lo + (hi - lo + 1) // 2
        count = int((keys >= mid).sum())
        trace.append({"lo": lo, "hi": hi, "mid": mid, "count": count})
        lo, hi = (mid, hi) if count >= r else (lo, mid - 1)
    return lo, trace


def row_path(values: torch.Tensor, k: int, search_bits: int = 12) -> dict:
    """Every intermediate of the row path on one row's visible logits ``values`` (more than ``k`` of them): the
    k-th value's bucket and its bisection, how many positions lie above it and in it, the candidates' bisection on
    fp32 keys, and the selected positions (those above, then the lowest-positioned winners of the bucket)."""
    k = positive_int(k, "k")
    if values.dim() != 1 or values.numel() <= k:
        raise ValueError(f"values must be one row of more than k = {k} logits, got shape {list(values.shape)}")
    buckets = fp16_buckets(values, search_bits)
    p, bucket_trace = bisect(buckets, k)
    above = torch.nonzero(buckets > p).flatten()
    candidates = torch.nonzero(buckets == p).flatten()
    need = k - above.numel()
    keys = order_keys(values[candidates])
    t, key_trace = bisect(keys, need)
    over = candidates[keys > t]
    tied = candidates[keys == t][:need - over.numel()]
    return {"bucket": p, "bucket_trace": bucket_trace, "above": above, "candidates": candidates, "need": need,
            "kth_key": t, "key_trace": key_trace, "selected": torch.cat([above, over, tied])}
