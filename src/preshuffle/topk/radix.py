"""The sm90 top-k kernel's selection (:mod:`preshuffle.topk.hopper`) step by step in PyTorch, on one row:
the same 16-bit keys and bins, the coarse-then-fine threshold search, the scatter, the radix levels over the
candidates' composite keys and the final ranking, with the kernel's list capacity and ranking limit, so that each
path the kernel can take (the list, the radix levels, the slow path over the row) runs and is checked on the CPU.
The order of a row's output is the kernel's only freedom (atomics), so the model returns the set."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

NAN_KEY = -(2 ** 31) + 1
FP16_MAX_KEY = 0xFFFF


def fp16_keys(x: torch.Tensor) -> torch.Tensor:
    """int64 16-bit order keys of float32 ``x``: NaN as -inf and -0.0 as +0.0, rounded to fp16 (overflowing to
    infinity), the bits mapped so that unsigned order is the values' order."""
    x = torch.where(x.isnan(), torch.tensor(-torch.inf), x.float()) + 0.0
    h = x.half().view(torch.int16).long() & 0xFFFF
    return torch.where(h >= 0x8000, 0xFFFF - h, h | 0x8000)


def fp32_keys(x: torch.Tensor) -> torch.Tensor:
    """int64 fp32 order keys (the signed-int reading of the bits, the 31 below the sign flipped for negatives);
    -0.0 as +0.0, NaN below -inf."""
    x = x.float()
    x = torch.where(x == 0, torch.zeros_like(x), x)
    s = x.view(torch.int32).long()
    key = torch.where(s < 0, s ^ 0x7FFFFFFF, s)
    return torch.where(x.isnan(), NAN_KEY, key)


def composite(key: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """One integer a position whose order is the selection's: fp32 key, then the lower position first."""
    return key * 2 ** 32 + (2 ** 32 - 1 - pos)


def threshold(hist: torch.Tensor, need: int) -> tuple[int, int, int]:
    """The kernel's search: 32 coarse bins, the coarse bin with at least ``need`` keys at or above it, then its fine
    bins. Returns (bin, keys above it, keys in it)."""
    bins = hist.numel()
    fpc = bins // 32
    coarse = hist.reshape(32, fpc).sum(1)
    at_or_above = coarse.flip(0).cumsum(0).flip(0)
    big = int(torch.nonzero(at_or_above >= need).max())
    above_big = int(at_or_above[big] - coarse[big])
    fine = hist[big * fpc:(big + 1) * fpc]
    at_or_above_f = above_big + fine.flip(0).cumsum(0).flip(0)
    q = int(torch.nonzero(at_or_above_f >= need).max())
    return big * fpc + q, int(at_or_above_f[q] - fine[q]), int(fine[q])


@dataclass
class Trace:
    """What one row took: the first bin and its counts, then each radix level ('row' or 'list'), the ranked
    candidates."""
    bin: int = -1
    above: int = 0
    in_bin: int = 0
    levels: list = field(default_factory=list)
    ranked: int = 0


def select(x: torch.Tensor, k: int, bits: int = 12, capacity: int = 960, rank_limit: int = 128) -> tuple[set, Trace]:
    """The set of positions the kernel selects from one row's visible logits ``x`` (float32, any length), and the
    path it took. ``capacity``: candidates the list holds; ``rank_limit``: the most ranked without a radix level."""
    n = x.numel()
    trace = Trace()
    if n <= k:
        return set(range(n)), trace
    pos = torch.arange(n)
    shift = 16 - bits
    b = fp16_keys(x) >> shift
    hist = torch.bincount(b, minlength=1 << bits)
    p, above, n_in = threshold(hist, k)
    trace.bin, trace.above, trace.in_bin = p, above, n_in
    need = k - above
    out = set(pos[b > p].tolist())
    if n_in == need:
        return out | set(pos[b == p].tolist()), trace
    comp = composite(fp32_keys(x), pos)
    members = b == p                       # the candidates, in the row
    listed = members if n_in <= capacity else None
    c = n_in
    lo = hi = None

    def level(where: torch.Tensor, kind: str):
        nonlocal need, c, lo, hi, out
        s = max(0, (hi - lo).bit_length() - bits)
        digit = torch.where(where, (comp - lo) >> s, -1)
        p2, above2, in2 = threshold(torch.bincount(digit[where], minlength=1 << bits), need)
        trace.levels.append((kind, s, p2, above2, in2))
        take_all = in2 == need - above2
        out |= set(pos[where & ((digit > p2) | (take_all & (digit == p2)))].tolist())
        need -= above2
        lo = lo + (p2 << s)
        hi = min(hi, lo + (1 << s) - 1)
        c = 0 if take_all else in2
        need = 0 if take_all else need
        return where & (digit == p2) & (not take_all)

    if listed is None:  # slow path: the bucket is larger than the list
        lo = int(composite(fp32_keys(x[members]).min(), pos[members].max()))
        hi = int(composite(fp32_keys(x[members]).max(), pos[members].min()))
        while c > capacity:
            members = level(members, "row")
        listed = members
    elif c > rank_limit and c > need:
        lo = int(composite(fp32_keys(x[listed]).min(), pos[listed].max()))
        hi = int(composite(fp32_keys(x[listed]).max(), pos[listed].min()))
    while c > rank_limit and c > need:
        listed = level(listed, "list")
    if c == need:
        return out | set(pos[listed].tolist()), trace
    trace.ranked = c
    cand = comp[listed]
    ranks = (cand[None, :] > cand[:, None]).sum(1)
    return out | set(pos[listed][ranks < need].tolist()), trace


def pass_checks(x: torch.Tensor, k: int, bits: int = 12, capacity: int = 960, rank_limit: int = 128) -> dict:
    """Each pass of the kernel, as :func:`select` models it, checked against the selection's float64 definition
    (:func:`preshuffle.topk.topk_reference`) on one row ``x`` of more than ``k`` logits: the keys order as the
    values do and every position is counted once (load and count); the threshold bin holds the k-th largest value,
    with ``above`` positions over it (threshold); the positions over it are all selected and the bin's own are the
    candidates (scatter); the candidates settle the same set (candidates). Returns each verdict and the trace."""
    from .selection import topk_reference

    n = x.numel()
    if n <= k:
        raise ValueError(f"a row of {n} logits selects them all: give more than k = {k}")
    reference = topk_reference(x[None], torch.tensor([n], dtype=torch.int32), k)[0].long()
    chosen = set(reference.tolist())
    by_value = reference[:k]
    keys = fp16_keys(x)
    b = keys >> (16 - bits)
    got, trace = select(x, k, bits=bits, capacity=capacity, rank_limit=rank_limit)
    p = trace.bin
    kth_bin = int(b[by_value[-1]])
    return {
        "load and count": bool((keys[by_value].diff() <= 0).all())
        and int(torch.bincount(b, minlength=1 << bits).sum()) == n,
        "threshold": p == kth_bin and trace.above == int((b > p).sum()) < k <= trace.above + trace.in_bin,
        "scatter": set(torch.nonzero(b > p).flatten().tolist()) <= chosen
        and trace.in_bin == int((b == p).sum()),
        "candidates": got == chosen,
        "trace": trace,
    }
