"""Top-k selection over the indexer's logits in Triton: for each row, the positions of its k largest visible logits.

Two paths, chosen by the logits' width (``TopKConfig.row_tile``):

* **row** (rows of at most ``row_tile`` positions): one program a row. It loads the row's visible prefix once, keeps
  the top ``search_bits`` bits of each logit's 16-bit key (the logit rounded to fp16, whose 10 mantissa bits separate
  typical logits finely) in registers, and bisects them by counts to the bucket of the k-th largest. It then reads
  the row again a chunk at a time, writing the positions above that bucket and copying the bucket's positions aside
  (``candidates`` of them at most), whose fp32 keys a second bisection settles. A bucket larger than the list is
  bisected where it lies, a chunk at a time, so every input takes a correct path.
* **split** (longer rows): the row is cut into segments of ``segment`` positions, each its own program, so one long
  row fills the GPU. Four launches: a histogram of each segment's 16-bit keys (top ``hist_bits`` bits); one program a
  row that sums them, finds the bucket of the k-th largest and each segment's offsets; each segment writes its
  positions above the bucket to the output and its bucket to a candidate list; one program a row selects the rest
  from the candidates (from the whole row, a chunk at a time, if the bucket holds more than ``candidates``).

Order keys: a logit's fp32 bits, read as a signed int whose order is the values' (-0.0 first made +0.0, so the two
zeros tie), NaN below -inf, positions a row may not see below everything. The 16-bit key is the same map applied to
the logit rounded to fp16 (clamped to fp16's finite range first), which never reverses two logits' order. Positions
tied at the k-th value are taken lowest position first, so the selected set is a function of the input. Every
count is an exact integer, so the path taken and the launch change no selected position.

Only each row's visible prefix is read: logits past it (unwritten, with ``clean_logits=False``) are never loaded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import device  # noqa: F401 (first: sets TRITON_INTERPRET before the kernels below are decorated)
from ..arguments import positive_int

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

INVALID = tl.constexpr(-(2 ** 31))     # the key of a position the row may not see: below every other key
NAN_KEY = tl.constexpr(-(2 ** 31) + 1)  # the key of NaN: below -inf
FP16_MAX = tl.constexpr(65504.0)
MAX_TILE = 16384          # positions one program ranks at once: its ranks pack two 16-bit counts into an int32
PATHS = ("row", "split")
ROW_CHUNK = 4096          # positions the row path writes out at a time


@dataclass(frozen=True)
class TopKConfig:
    """How the top-k runs. ``row_tile``: the longest logits width the row path takes (a power of two; wider logits
    take the split path); ``row_warps``; ``search_bits``: 16-bit-key bits the row path bisects over the whole tile
    before it copies the remaining bucket aside; ``candidates``: how many bucket positions are copied aside (a power
    of two); ``row_halves``: a row no longer than half the tile is bisected over half a tile; ``segment``,
    ``split_warps``: positions and warps of a split-path program; ``hist_bits``: the split path's histogram bins,
    ``2**hist_bits``; ``final_warps``: warps of the split path's last step."""

    row_tile: int = 16384
    row_warps: int = 16
    search_bits: int = 12
    candidates: int = 512
    row_halves: bool = True
    segment: int = 4096
    split_warps: int = 8
    hist_bits: int = 8
    split_candidates: int = 4096
    final_warps: int = 16

    def __post_init__(self):
        for name in ("row_tile", "candidates", "segment", "split_candidates"):
            value = positive_int(getattr(self, name), name)
            if value & (value - 1) or not 16 <= value <= MAX_TILE:
                raise ValueError(f"{name} must be a power of two in [16, {MAX_TILE}], got {value}")
        for name in ("row_warps", "split_warps", "final_warps"):
            value = positive_int(getattr(self, name), name)
            if value & (value - 1) or value > 32:
                raise ValueError(f"{name} must be a power of two up to 32, got {value}")
        if not 1 <= positive_int(self.search_bits, "search_bits") <= 16:
            raise ValueError(f"search_bits must be in [1, 16], got {self.search_bits}")
        if not isinstance(self.row_halves, bool):
            raise TypeError(f"row_halves must be a bool, got {type(self.row_halves).__name__} {self.row_halves!r}")
        if not 5 <= positive_int(self.hist_bits, "hist_bits") <= 12:
            raise ValueError(f"hist_bits must be in [5, 12] (tl.histogram needs at least 32 bins), "
                             f"got {self.hist_bits}")


def default_config(width: int) -> TopKConfig:
    """The launch for logits ``width`` positions wide: up to 16K positions the row path, on a tile of the width's
    power of two (so small problems compile small tiles) and up to 16 warps; wider logits the split path."""
    tile = max(16, min(MAX_TILE, triton.next_power_of_2(max(width, 1))))
    return TopKConfig(row_tile=tile, row_warps=max(1, min(16, tile // 512)), candidates=min(512, tile))


def path_for(width: int, config: TopKConfig) -> str:
    return "row" if width <= config.row_tile else "split"


# --------------------------------------------------------------------------------------------------------------------
# Building blocks


@triton.jit
def _row_length(ctx_ptr, row, width, next_n, CTX_2D: tl.constexpr):
    """How many leading positions ``row`` may see, as the logits kernel's rule says, cut to ``[0, width]``."""
    if CTX_2D:
        n = tl.load(ctx_ptr + row)
    else:
        n = tl.load(ctx_ptr + row // next_n) - next_n + row % next_n + 1
    return tl.minimum(tl.maximum(n, 0), width)


@triton.jit
def _keys(x, valid):
    """(fp32 order key, 16-bit order key) of each logit; see the module's docstring. The 16-bit key is in
    ``[0, 65535]`` for numbers, 0 for NaN (it shares the lowest bucket, which the fp32 key splits)."""
    x = tl.where(x == 0.0, 0.0, x)
    nan = x != x
    s = x.to(tl.int32, bitcast=True)
    key = s ^ ((s >> 31) & 0x7FFFFFFF)
    key = tl.where(valid, tl.where(nan, NAN_KEY, key), INVALID)
    h = tl.minimum(tl.maximum(x, -FP16_MAX), FP16_MAX).to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
    h = h & 0xFFFF
    key16 = tl.where(h >= 0x8000, 0xFFFF - h, h | 0x8000)
    return key, tl.where(nan, 0, key16)


@triton.jit
def _kth_key(key, valid, r):
    """The largest t with at least ``r`` valid keys >= t (the r-th largest valid key), by bisection over
    ``[min, max]`` of the valid keys: one count a halving. Invalid keys must lie below every valid one."""
    lo = tl.min(tl.where(valid, key, 2147483647)).to(tl.int64)
    hi = tl.max(tl.where(valid, key, -2147483647 - 1)).to(tl.int64)
    while lo < hi:
        mid = lo + (hi - lo + 1) // 2
        if tl.sum((key >= mid.to(tl.int32)).to(tl.int32)) >= r:
            lo = mid
        else:
            hi = mid - 1
    return lo.to(tl.int32)


@triton.jit
def _exclusive_ranks(flags, N: tl.constexpr):
    """Exclusive prefix sums of ``flags`` [N]: in groups of four (a thread's contiguous elements), then across
    groups, which costs a quarter of a flat scan's shuffles."""
    groups = tl.reshape(flags, (N // 4, 4))
    totals = tl.sum(groups, 1)
    before = tl.cumsum(totals, 0) - totals
    inside = tl.cumsum(groups, 1) - groups
    return tl.reshape(inside + before[:, None], (N,))


@triton.jit
def _write_winners(key, t, need, pos, dst, N: tl.constexpr):
    """Write to ``dst[0 : need]`` the positions whose key is above ``t``, then the lowest-positioned ones equal to
    it, ``need`` in all (``t`` from :func:`_kth_key`, so enough are equal). ``pos`` ascends along the tile."""
    above = key > t
    tied = key == t
    ranks = _exclusive_ranks(above.to(tl.int32) + (tied.to(tl.int32) << 16), N)
    n_above = tl.sum(above.to(tl.int32))
    tl.store(dst + (ranks & 0xFFFF), pos, mask=above)
    tl.store(dst + n_above + (ranks >> 16), pos, mask=tied & ((ranks >> 16) < need - n_above))


@triton.jit
def _row_and_prefix(ctx_ptr, out_ptr, k, width, next_n, CTX_2D: tl.constexpr, CHUNK: tl.constexpr):
    """This program's row, how many positions it sees, and its output row; a row that sees ``n <= k`` positions
    is written here, all of them, then -1."""
    row = tl.program_id(0)
    n = _row_length(ctx_ptr, row, width, next_n, CTX_2D)
    out_row = out_ptr + row.to(tl.int64) * k
    if n <= k:
        for first in range(0, k, CHUNK):
            i = first + tl.arange(0, CHUNK)
            tl.store(out_row + i, tl.where(i < n, i, -1), mask=i < k)
    return row, n, out_row


@triton.jit
def _buckets(row_ptr, pos, n, BITS: tl.constexpr):
    """The top ``BITS`` bits of the 16-bit keys of ``pos`` (a row's positions; -1 from ``n`` on, unread)."""
    x = tl.load(row_ptr + pos, mask=pos < n, other=0.0).to(tl.float32)
    return tl.where(pos < n, _keys(x, pos < n)[1] >> (16 - BITS), -1)


@triton.jit
def _compact(row_ptr, first, last, p, above_before, tied_before, out_row, cand_row, BITS: tl.constexpr,
             CAP: tl.constexpr, CHUNK: tl.constexpr):
    """Positions ``first .. last-1`` of a row, a chunk at a time: those whose bucket is above ``p`` to
    ``out_row[above_before + ...]``, those in it (fp32 key and position) to the candidate list at
    ``tied_before + ...`` while it has room, both in position order. Returns the two counts after them."""
    for start in range(first, last, CHUNK):
        pos = start + tl.arange(0, CHUNK)
        valid = pos < last
        x = tl.load(row_ptr + pos, mask=valid, other=0.0).to(tl.float32)
        key, key16 = _keys(x, valid)
        bucket = key16 >> (16 - BITS)
        above = valid & (bucket > p)
        tied = valid & (bucket == p)
        flags = above.to(tl.int32) + (tied.to(tl.int32) << 16)
        # A flat scan, not _exclusive_ranks' groups of four: after half-precision loads from rows whose stride is no
        # multiple of 16, Triton 3.6's layout pass for sm90 leaves the grouped scan's reshape using a value it has
        # not defined yet (the kernel fails to compile for such bf16 and fp16 logits).
        ranks = tl.cumsum(flags, 0) - flags
        tl.store(out_row + above_before + (ranks & 0xFFFF), pos, mask=above)
        slot = tied_before + (ranks >> 16)
        tl.store(cand_row + slot, key, mask=tied & (slot < CAP))
        tl.store(cand_row + CAP + slot, pos, mask=tied & (slot < CAP))
        above_before += tl.sum(above.to(tl.int32))
        tied_before += tl.sum(tied.to(tl.int32))
    return above_before, tied_before


@triton.jit
def _bucket_keys(row_ptr, n, first, p, CHUNK: tl.constexpr, BITS: tl.constexpr):
    """Positions and fp32 keys of the chunk at ``first``, keys INVALID outside bucket ``p``."""
    pos = first + tl.arange(0, CHUNK)
    valid = pos < n
    key, key16 = _keys(tl.load(row_ptr + pos, mask=valid, other=0.0).to(tl.float32), valid)
    return pos, tl.where(valid & ((key16 >> (16 - BITS)) == p), key, INVALID)


@triton.jit
def _count_at_least(row_ptr, n, p, t, CHUNK: tl.constexpr, BITS: tl.constexpr):
    count = 0
    for first in range(0, n, CHUNK):
        pos, key = _bucket_keys(row_ptr, n, first, p, CHUNK, BITS)
        count += tl.sum((key >= t).to(tl.int32))
    return count


@triton.jit
def _select_in_bucket(row_ptr, n, p, need, dst, BITS: tl.constexpr, CHUNK: tl.constexpr):
    """Write to ``dst[0 : need]`` the ``need`` best positions of bucket ``p`` among a row's first ``n``, reading the
    row a chunk at a time for every count: the path of a bucket too large for the candidate list (many equal
    logits), slow but exact."""
    lo = 2147483647
    hi = -2147483647 - 1
    for first in range(0, n, CHUNK):
        pos, key = _bucket_keys(row_ptr, n, first, p, CHUNK, BITS)
        lo = tl.minimum(lo, tl.min(tl.where(key > INVALID, key, 2147483647)))
        hi = tl.maximum(hi, tl.max(key))
    lo = lo.to(tl.int64)
    hi = hi.to(tl.int64)
    while lo < hi:
        mid = lo + (hi - lo + 1) // 2
        if _count_at_least(row_ptr, n, p, mid.to(tl.int32), CHUNK, BITS) >= need:
            lo = mid
        else:
            hi = mid - 1
    t = lo.to(tl.int32)
    n_over = _count_at_least(row_ptr, n, p, t + 1, CHUNK, BITS)
    over_before = 0
    tied_before = 0
    for first in range(0, n, CHUNK):
        pos, key = _bucket_keys(row_ptr, n, first, p, CHUNK, BITS)
        over = key > t
        tied = key == t
        ranks = _exclusive_ranks(over.to(tl.int32) + (tied.to(tl.int32) << 16), CHUNK)
        tl.store(dst + over_before + (ranks & 0xFFFF), pos, mask=over)
        slot = tied_before + (ranks >> 16)
        tl.store(dst + n_over + slot, pos, mask=tied & (slot < need - n_over))
        over_before += tl.sum(over.to(tl.int32))
        tied_before += tl.sum(tied.to(tl.int32))


@triton.jit
def _finish(row_ptr, n, p, n_above, n_tied, k, out_row, cand_row, BITS: tl.constexpr, CAP: tl.constexpr):
    """The row's last ``k - n_above`` positions, from bucket ``p``: bisected on the candidates' fp32 keys, or, when
    the bucket held more than the list does, on the row itself."""
    need = k - n_above
    if n_tied <= CAP:
        c = tl.arange(0, CAP)
        listed = c < n_tied
        c_key = tl.load(cand_row + c, mask=listed, other=INVALID)
        c_pos = tl.load(cand_row + CAP + c, mask=listed, other=0)
        t = _kth_key(c_key, listed, need)
        _write_winners(c_key, t, need, c_pos, out_row + n_above, CAP)
    else:
        _select_in_bucket(row_ptr, n, p, need, out_row + n_above, BITS, CAP)


# --------------------------------------------------------------------------------------------------------------------
# The row path


@triton.jit(do_not_specialize=["next_n"])  # one build for every next_n
def _topk_row_kernel(x_ptr, x_stride, ctx_ptr, out_ptr, cand_ptr, k, width,
                     next_n, CTX_2D: tl.constexpr, TILE: tl.constexpr, SEARCH_BITS: tl.constexpr,
                     CAP: tl.constexpr, CHUNK: tl.constexpr, HALVES: tl.constexpr):
    row, n, out_row = _row_and_prefix(ctx_ptr, out_ptr, k, width, next_n, CTX_2D, CHUNK)
    if n > k:
        # Only the buckets are held in registers, through the bisection; the positions are then written from the
        # row read again a chunk at a time (from L1 or L2), so that no second tile an element is ever live.
        row_ptr = x_ptr + row.to(tl.int64) * x_stride
        if HALVES and n <= TILE // 2:  # a row half the tile's length counts over half a tile
            half = _buckets(row_ptr, tl.arange(0, TILE // 2), n, SEARCH_BITS)
            p = _kth_key(half, half >= 0, k)
        else:
            whole = _buckets(row_ptr, tl.arange(0, TILE), n, SEARCH_BITS)
            p = _kth_key(whole, whole >= 0, k)
        cand_row = cand_ptr + row.to(tl.int64) * (2 * CAP)
        zero = tl.zeros((), tl.int32)
        n_above, n_tied = _compact(row_ptr, 0, n, p, zero, zero, out_row, cand_row, SEARCH_BITS, CAP, CHUNK)
        tl.debug_barrier()  # the candidates this program wrote, visible to all its threads
        _finish(row_ptr, n, p, n_above, n_tied, k, out_row, cand_row, SEARCH_BITS, CAP)


# --------------------------------------------------------------------------------------------------------------------
# The split path


@triton.jit(do_not_specialize=["next_n"])  # one build for every next_n
def _topk_hist_kernel(x_ptr, x_stride, ctx_ptr, hist_ptr, k, width, n_segments,
                      next_n, CTX_2D: tl.constexpr, SEG: tl.constexpr, BITS: tl.constexpr):
    row = tl.program_id(0)
    s = tl.program_id(1)
    n = _row_length(ctx_ptr, row, width, next_n, CTX_2D)
    if (n > k) & (s * SEG < n):
        bucket = _buckets(x_ptr + row.to(tl.int64) * x_stride, s * SEG + tl.arange(0, SEG), n, BITS)
        counts = tl.histogram(tl.maximum(bucket, 0), 1 << BITS, mask=bucket >= 0)
        tl.store(hist_ptr + (row.to(tl.int64) * n_segments + s) * (1 << BITS) + tl.arange(0, 1 << BITS), counts)


@triton.jit(do_not_specialize=["next_n"])  # one build for every next_n
def _topk_reduce_kernel(ctx_ptr, hist_ptr, meta_ptr, offsets_ptr, k, width, n_segments,
                        next_n, CTX_2D: tl.constexpr, SEG: tl.constexpr, BITS: tl.constexpr):
    """Per row: the bucket p holding the k-th largest logit, how many positions lie above it and in it (meta), and
    each segment's first output slot and first candidate slot (offsets)."""
    row = tl.program_id(0)
    n = _row_length(ctx_ptr, row, width, next_n, CTX_2D)
    if n > k:
        used = tl.cdiv(n, SEG)
        bins = tl.arange(0, 1 << BITS)
        hist_row = hist_ptr + row.to(tl.int64) * n_segments * (1 << BITS)
        total = tl.zeros((1 << BITS,), tl.int32)
        for s in range(used):
            total += tl.load(hist_row + s * (1 << BITS) + bins)
        from_top = tl.cumsum(total, 0, reverse=True)  # positions in this bucket or above
        p = tl.max(tl.where(from_top >= k, bins, -1))
        n_tied = tl.sum(tl.where(bins == p, total, 0))
        n_above = tl.sum(tl.where(bins == p, from_top, 0)) - n_tied
        tl.store(meta_ptr + row * 4, p)
        tl.store(meta_ptr + row * 4 + 1, n_above)
        tl.store(meta_ptr + row * 4 + 2, n_tied)
        above_before = 0
        tied_before = 0
        for s in range(used):
            h = tl.load(hist_row + s * (1 << BITS) + bins)
            o = offsets_ptr + (row.to(tl.int64) * n_segments + s) * 2
            tl.store(o, above_before)
            tl.store(o + 1, tied_before)
            above_before += tl.sum(tl.where(bins > p, h, 0))
            tied_before += tl.sum(tl.where(bins == p, h, 0))


@triton.jit(do_not_specialize=["next_n"])  # one build for every next_n
def _topk_compact_kernel(x_ptr, x_stride, ctx_ptr, out_ptr, cand_ptr, meta_ptr, offsets_ptr, k, width, n_segments,
                         next_n, CTX_2D: tl.constexpr, SEG: tl.constexpr, BITS: tl.constexpr,
                         CAP: tl.constexpr):
    row = tl.program_id(0)
    s = tl.program_id(1)
    n = _row_length(ctx_ptr, row, width, next_n, CTX_2D)
    if (n > k) & (s * SEG < n):
        o = offsets_ptr + (row.to(tl.int64) * n_segments + s) * 2
        last = tl.minimum(n, (s + 1) * SEG)
        _compact(x_ptr + row.to(tl.int64) * x_stride, s * SEG, last, tl.load(meta_ptr + row * 4), tl.load(o),
                 tl.load(o + 1), out_ptr + row.to(tl.int64) * k, cand_ptr + row.to(tl.int64) * (2 * CAP), BITS, CAP,
                 SEG)


@triton.jit(do_not_specialize=["next_n"])  # one build for every next_n
def _topk_final_kernel(x_ptr, x_stride, ctx_ptr, out_ptr, cand_ptr, meta_ptr, k, width,
                       next_n, CTX_2D: tl.constexpr, BITS: tl.constexpr, CAP: tl.constexpr):
    row, n, out_row = _row_and_prefix(ctx_ptr, out_ptr, k, width, next_n, CTX_2D, CAP)
    if n > k:
        m = meta_ptr + row * 4
        _finish(x_ptr + row.to(tl.int64) * x_stride, n, tl.load(m), tl.load(m + 1), tl.load(m + 2), k, out_row,
                cand_ptr + row.to(tl.int64) * (2 * CAP), BITS, CAP)


# --------------------------------------------------------------------------------------------------------------------
# Launch


def launch_topk(logits: torch.Tensor, lengths: torch.Tensor, out: torch.Tensor, k: int, next_n: int, ctx_2d: bool,
                config: TopKConfig) -> torch.Tensor:
    """Run the top-k on checked inputs: ``logits`` [rows, width] with unit column stride, ``lengths`` int32 (1-D per
    sequence, or the 2-D lengths flattened to one a row), ``out`` int32 [rows, k] contiguous."""
    rows, width = logits.shape
    if rows == 0 or width == 0:  # nothing to read: every row sees no position
        return out.fill_(-1)
    common = dict(next_n=next_n, CTX_2D=ctx_2d)
    if path_for(width, config) == "row":
        cand = torch.empty(rows, 2 * config.candidates, dtype=torch.int32, device=logits.device)
        _topk_row_kernel[(rows,)](logits, logits.stride(0), lengths, out, cand, k, width, **common,
                                  TILE=config.row_tile, SEARCH_BITS=config.search_bits, CAP=config.candidates,
                                  CHUNK=min(config.row_tile, ROW_CHUNK), HALVES=config.row_halves,
                                  num_warps=config.row_warps)
        return out
    seg, bits, cap = config.segment, config.hist_bits, config.split_candidates
    n_segments = triton.cdiv(width, seg)
    dev = logits.device
    hist = torch.empty(rows, n_segments, 1 << bits, dtype=torch.int32, device=dev)
    meta = torch.empty(rows, 4, dtype=torch.int32, device=dev)
    offsets = torch.empty(rows, n_segments, 2, dtype=torch.int32, device=dev)
    cand = torch.empty(rows, 2 * cap, dtype=torch.int32, device=dev)
    _topk_hist_kernel[(rows, n_segments)](logits, logits.stride(0), lengths, hist, k, width, n_segments, **common,
                                          SEG=seg, BITS=bits, num_warps=config.split_warps)
    _topk_reduce_kernel[(rows,)](lengths, hist, meta, offsets, k, width, n_segments, **common, SEG=seg, BITS=bits,
                                 num_warps=config.final_warps)
    _topk_compact_kernel[(rows, n_segments)](logits, logits.stride(0), lengths, out, cand, meta, offsets, k, width,
                                             n_segments, **common, SEG=seg, BITS=bits, CAP=cap,
                                             num_warps=config.split_warps)
    _topk_final_kernel[(rows,)](logits, logits.stride(0), lengths, out, cand, meta, k, width, **common, BITS=bits,
                                CAP=cap, num_warps=config.final_warps)
    return out


# --------------------------------------------------------------------------------------------------------------------
# Compiled without a GPU


def kernels(config: TopKConfig, ctx_2d: bool = False, dtype: str = "fp32") -> dict:
    """Each kernel a call with ``config`` launches: name -> (jit function, signature, constexprs, warps), as a GPU
    compiles them for 16-byte aligned tensors and 16-divisible strides."""
    common = dict(CTX_2D=ctx_2d)
    split = dict(**common, SEG=config.segment, BITS=config.hist_bits)
    x = {"x_ptr": f"*{dtype}", "x_stride": "i32", "ctx_ptr": "*i32"}
    ints = lambda *names: dict.fromkeys(names, "i32")  # noqa: E731
    return {
        "row": (_topk_row_kernel, {**x, "out_ptr": "*i32", "cand_ptr": "*i32", **ints("k", "width", "next_n")},
                dict(**common, TILE=config.row_tile, SEARCH_BITS=config.search_bits, CAP=config.candidates,
                     CHUNK=min(config.row_tile, ROW_CHUNK), HALVES=config.row_halves),
                config.row_warps),
        "hist": (_topk_hist_kernel, {**x, "hist_ptr": "*i32", **ints("k", "width", "n_segments", "next_n")}, split,
                 config.split_warps),
        "reduce": (_topk_reduce_kernel, {"ctx_ptr": "*i32", "hist_ptr": "*i32", "meta_ptr": "*i32",
                                         "offsets_ptr": "*i32", **ints("k", "width", "n_segments", "next_n")}, split,
                   config.final_warps),
        "compact": (_topk_compact_kernel, {**x, "out_ptr": "*i32", "cand_ptr": "*i32", "meta_ptr": "*i32",
                                           "offsets_ptr": "*i32", **ints("k", "width", "n_segments", "next_n")},
                    dict(**split, CAP=config.split_candidates), config.split_warps),
        "final": (_topk_final_kernel, {**x, "out_ptr": "*i32", "cand_ptr": "*i32", "meta_ptr": "*i32",
                                       **ints("k", "width", "next_n")},
                  dict(**common, BITS=config.hist_bits, CAP=config.split_candidates), config.final_warps),
    }


def compile_kernel(name: str, capability: tuple[int, int], config: TopKConfig | None = None, *,
                   strides_of_16: bool = True, **kw):
    """Compile one of :func:`kernels` for an NVIDIA GPU of compute ``capability`` with Triton's bundled ptxas (no GPU
    needed); returns Triton's compiled kernel. ``strides_of_16``: the logits' row stride and k multiples of 16, as
    Triton specialises them when they are (a row of 200 logits is not). Call it where TRITON_INTERPRET is 0."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn, signature, constexprs, warps = kernels(config or TopKConfig(), **kw)[name]
    aligned = {(i,): [["tt.divisibility", 16]] for i, (arg, kind) in enumerate(signature.items())
               if kind.startswith("*") or strides_of_16 and arg in ("x_stride", "k")}
    source = ASTSource(fn, {**signature, **dict.fromkeys(constexprs, "constexpr")}, constexprs, aligned)
    arch = 10 * capability[0] + capability[1]
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=warps))
