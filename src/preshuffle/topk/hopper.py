"""Top-k selection over the indexer's logits for Hopper (sm90), in Gluon: one pass over each row builds a histogram
of its 16-bit keys in shared memory with atomics, a second over the same registers writes the winners, and a few
hundred candidates at most settle the rest. The selection is the one :mod:`preshuffle.topk.selection` defines, exactly (the
same set as :mod:`preshuffle.topk.portable`'s Triton kernels).

A program (CTA) owns a segment of ``chunks * chunk`` positions of one row; ``cluster`` CTAs (a thread-block cluster)
share a row whose logits are wider than one segment, and exchange histograms and candidates through distributed
shared memory. Per row:

1. **Load and count.** Each CTA loads its segment once (16-byte loads, every chunk in flight before the first is
   used), packs each pair of logits into their 16-bit order keys (the value rounded to fp16: NaN as -inf, -0.0 as
   +0.0; :func:`~preshuffle.topk.smem_ptx.fp16_keys`) kept in registers, and adds every key's top ``bits`` bits to
   a shared histogram, one ``red.shared.add`` a position.
2. **Threshold.** The CTA's threads sum the histogram into 32 coarse bins; one warp scans the coarse bins (summed
   over the cluster's CTAs) for the coarse bin of the k-th largest key, then that bin's fine bins for the fine bin
   ``p`` of it: how many positions lie above ``p`` and in it.
3. **Scatter.** From the registers: positions above ``p`` go to the output, each warp taking its slots with one
   atomic on a counter (the cluster's first CTA holds it); positions in ``p`` go, with their fp32 order keys, to a
   candidate list of ``candidates`` entries in the first CTA. If ``p`` holds exactly the positions still needed,
   they all go to the output instead.
4. **Candidates.** The first CTA selects the rest from the list: ranked against each other by (fp32 key, lowest
   position first) when at most ``rank_limit`` of them remain, or first narrowed by radix levels (a histogram of
   ``bits`` bits of the keys' offset from the smallest, as in step 2). A bucket larger than the list (many equal
   logits) is narrowed the same way from the row itself, read again from memory: slow, exact.

Every count is an exact integer and ties are ranked by position, so the set does not depend on the launch or on
the order atomics land in; only the order of the output row does (callers may not rely on it). Only each row's
visible prefix is read. Shared memory is one buffer addressed through inline PTX (:mod:`.smem_ptx`), which is why
the kernel keeps all its cross-warp traffic there and none in Triton's own scratch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from ..arguments import positive_int
from ..internals import constexpr_function, gluon_source, load_compiled, run_compiled
from . import smem_ptx
from . import smem_ptx as px

INVALID_KEY = gl.constexpr(-(2 ** 31))  # below every key
NAN_KEY = gl.constexpr(-(2 ** 31) + 1)  # the fp32 order key of NaN: below -inf's
CLUSTERS = (1, 2, 4, 8, 16)
MAX_K = 32767                   # the scatter's counters pack two 16-bit counts a word


@dataclass(frozen=True)
class HopperTopKConfig:
    """A launch of the sm90 kernel. ``warps`` a CTA (32 threads each); ``vectors``: 16-byte loads a thread a chunk
    (a chunk is ``vectors * 32 * warps`` loads); ``chunks`` a CTA; ``cluster``: CTAs a row (a thread-block cluster;
    16 is non-portable but runs on H100/H200); ``bits``: histogram bins ``2**bits`` over the 16-bit keys and over
    the candidates' keys; ``candidates``: entries of the candidate list (a power of two); ``rank_limit``: the most
    candidates ranked against each other without a radix level first; ``eager``: load the segment's first chunks (up to
    24 values a thread) as far as the logits' width without waiting for the row's length (one dependent memory
    round trip fewer, more bytes read where rows are shorter than the width); ``registers``: a cap on the registers a thread (0: the compiler's
    choice), so that more CTAs fit a multiprocessor."""

    warps: int = 32
    vectors: int = 1
    chunks: int = 4
    cluster: int = 1
    bits: int = 12
    candidates: int = 1024
    rank_limit: int = 128
    eager: bool = False
    registers: int = 0

    def __post_init__(self):
        warps = positive_int(self.warps, "warps")
        if warps & (warps - 1) or warps > 32:
            raise ValueError(f"warps must be a power of two up to 32, got {warps}")
        vectors = positive_int(self.vectors, "vectors")
        if vectors & (vectors - 1) or vectors > 16:
            raise ValueError(f"vectors must be a power of two up to 16, got {vectors}")
        if not 1 <= positive_int(self.chunks, "chunks") <= 64:
            raise ValueError(f"chunks must be in [1, 64], got {self.chunks}")
        if self.cluster not in CLUSTERS:
            raise ValueError(f"cluster must be one of {CLUSTERS}, got {self.cluster!r}")
        if not 11 <= positive_int(self.bits, "bits") <= 13:
            raise ValueError(f"bits must be in [11, 13], got {self.bits}")
        cap = positive_int(self.candidates, "candidates")
        if cap & (cap - 1) or not max(128, 32 * warps) <= cap <= 8192:
            raise ValueError(f"candidates must be a power of two in [max(128, 32 * warps), 8192] = "
                             f"[{max(128, 32 * warps)}, 8192], got {cap}")
        if not isinstance(self.registers, int) or isinstance(self.registers, bool) or not (
                self.registers == 0 or 24 <= self.registers <= 255):
            raise ValueError(f"registers must be 0 (the compiler's choice) or in [24, 255], got {self.registers!r}")
        if not isinstance(self.eager, bool):
            raise TypeError(f"eager must be a bool, got {type(self.eager).__name__} {self.eager!r}")
        limit = min(self.capacity(), cap - 8)  # the ranking reads 8 slots a step, the last past the list's end
        if not 1 <= positive_int(self.rank_limit, "rank_limit") <= limit:
            raise ValueError(f"rank_limit must be in [1, {limit}] (the list's capacity, 8 slots short of its "
                             f"end), got {self.rank_limit}")

    def segment(self, elem_bytes: int = 4) -> int:
        """Positions a CTA holds: chunks x vectors x threads x positions a 16-byte load."""
        return self.chunks * self.vectors * 32 * self.warps * (16 // elem_bytes)

    def reach(self, elem_bytes: int = 4) -> int:
        """The widest logits a launch covers: a cluster's segments."""
        return self.cluster * self.segment(elem_bytes)

    def shared_words(self) -> int:
        return shared_words(1 << self.bits, self.candidates)

    def capacity(self) -> int:
        """Candidates the list holds: ``candidates``, less what the control words take where they share its end."""
        return capacity(1 << self.bits, self.candidates)


@constexpr_function
def shared_words(bins, lists):
    """The one shared buffer's words, a power of two (Triton's shared layouts need one): the histogram, then two
    lists of ``lists`` keys and ``lists`` positions; 64 control words (coarse bins, counters) at its end, where they
    may take the last slots of the second list's positions."""
    return triton.next_power_of_2(bins + 4 * lists)


@constexpr_function
def capacity(bins, lists):
    """Slots of a list: the second list's positions end before the control words."""
    return min(lists, shared_words(bins, lists) - 64 - bins - 3 * lists)


SMS = 132               # the H200's multiprocessors, which the default launch sizes itself for
SPREAD_PER_THREAD = 48  # positions a thread past which a row takes more CTAs, while they still fit one wave
MAX_PER_THREAD = 96     # positions a thread holds at most in a default launch (two 16-bit keys a register)
DEFAULT_CLUSTER = 8     # the largest portable cluster; 16 (non-portable) is a launch option
# A default launch's CTAs a multiprocessor and register cap a thread, by warps a CTA (0: no cap).
RESIDENT = {32: 1, 16: 2, 8: 3}
REGISTER_CAP = {32: 0, 16: 64, 8: 80}


def default_config(rows: int, width: int, elem_bytes: int = 4) -> HopperTopKConfig:
    """The launch predicted fastest for ``rows`` rows of logits ``width`` wide (docs/topk.md): while rows leave
    most multiprocessors idle, a cluster of CTAs a row (up to 8), the largest that keeps rows x cluster within half
    the SMs and 8192 positions a CTA (a cluster's merge costs more than the SMs it adds beyond that); 1024 threads a
    CTA up to a row an SM, fewer and smaller CTAs beyond (their registers capped so that two CTAs of 512 threads or
    three of 256 fit a multiprocessor); then more CTAs a row where a thread would hold more than 96 positions, or
    more than 48 while the added CTAs still fit the GPU at once; two 16-byte loads a thread a chunk once a thread
    holds 16 positions or more; 2048 bins for the smaller CTAs (their histogram is zeroed and scanned by fewer
    threads), 4096 for the 1024-thread ones; eager loads."""
    rows, width = positive_int(rows, "rows"), positive_int(width, "width")
    per_load = 16 // elem_bytes
    cluster = 1
    while cluster < DEFAULT_CLUSTER and rows * cluster * 4 <= SMS and width >= 8192 * cluster:
        cluster *= 2
    warps = 32 if rows * cluster <= SMS else 16 if rows <= 2 * SMS else 8
    threads = 32 * warps
    resident = RESIDENT[warps]
    while cluster < DEFAULT_CLUSTER:
        holds = -(-width // cluster) / threads
        if not (holds > MAX_PER_THREAD or holds > SPREAD_PER_THREAD and rows * cluster * 2 <= SMS * resident):
            break
        cluster *= 2
    segment = -(-width // cluster)
    vectors = 2 if -(-segment // threads) >= 4 * per_load else 1
    chunks = -(-segment // (vectors * per_load * threads))
    return HopperTopKConfig(warps=warps, vectors=vectors, chunks=max(1, chunks), cluster=cluster,
                            bits=12 if warps == 32 else 11, candidates=max(1024, threads), rank_limit=128, eager=True,
                            registers=REGISTER_CAP[warps])


# --------------------------------------------------------------------------------------------------------------------
# Building blocks


@gluon.jit
def _add(a, b):
    return a + b


@gluon.jit
def _row_length(ctx_ptr, row, width, next_n, CTX_2D: gl.constexpr):
    """How many leading positions ``row`` may see (the logits kernel's rule), cut to ``[0, width]``."""
    if CTX_2D:
        n = gl.load(ctx_ptr + row)
    else:
        n = gl.load(ctx_ptr + row // next_n) - next_n + row % next_n + 1
    return gl.minimum(gl.maximum(n, 0), width)


@gluon.jit
def _key32(x):
    """The fp32 order key: the bits as a signed int, the 31 below the sign flipped for negatives; -0.0 as +0.0, NaN
    below -inf."""
    x = gl.where(x == 0.0, 0.0, x)
    s = x.to(gl.int32, bitcast=True)
    key = s ^ ((s >> 31) & 0x7FFFFFFF)
    return gl.where(x != x, NAN_KEY, key)


@gluon.jit
def _composite(key, pos):
    """One int64 a candidate whose order is the selection's: the fp32 key, then the lower position first."""
    return (key.to(gl.int64) << 32) | (pos ^ -1).to(gl.uint32, bitcast=True).to(gl.int64)


@constexpr_function
def _chunk_layout(V, E4, W):
    return gl.BlockedLayout([E4, 1, V], [1, 32, 1], [1, W, 1], [2, 0, 1])


@gluon.jit
def _chunk_positions(first, V: gl.constexpr, E4: gl.constexpr, W: gl.constexpr):
    """Positions ``first + [0, chunk)`` as [E4, threads, V]: each thread V contiguous positions (one 16-byte load)
    E4 times, the warp's loads contiguous."""
    L: gl.constexpr = _chunk_layout(V, E4, W)
    e = gl.arange(0, E4, layout=gl.SliceLayout(1, gl.SliceLayout(2, L)))
    t = gl.arange(0, 32 * W, layout=gl.SliceLayout(0, gl.SliceLayout(2, L)))
    v = gl.arange(0, V, layout=gl.SliceLayout(0, gl.SliceLayout(1, L)))
    return first + e[:, None, None] * (32 * W * V) + t[None, :, None] * V + v[None, None, :]


@gluon.jit
def _load_chunk(row_ptr, first, end, V: gl.constexpr, E4: gl.constexpr, W: gl.constexpr, WHOLE: gl.constexpr):
    """The chunk of the row at ``first``, as fp32, loaded up to ``end``: with ``WHOLE``, whole 16-byte vectors (the
    rest of the last one lies in the row: the logits' width is whole vectors; it is never counted)."""
    pos = _chunk_positions(first, V, E4, W)
    if WHOLE:
        x = gl.load(row_ptr + pos, mask=(pos // V) * V < end, other=0.0)
    else:
        x = gl.load(row_ptr + pos, mask=pos < end, other=0.0)
    return x.to(gl.float32)


@gluon.jit
def _pairs(t, V: gl.constexpr):
    """A chunk tensor as its even and odd positions' halves."""
    return gl.split(gl.reshape(t, [t.shape[0], t.shape[1], V // 2, 2]))


@gluon.jit
def _thread_totals(g):
    """Per-thread sums of a [E4, threads, V] tensor (its first and last axes are the thread's own elements)."""
    return gl.sum(gl.sum(g, 2), 0)


@constexpr_function
def _blocked3(shape, W):
    """The plain blocked layout of a [E, threads, V] tensor whose first and last axes are a thread's own elements
    (scans need one: Triton 3.6 does not scan sliced layouts)."""
    return gl.BlockedLayout([shape[0], 1, shape[2]], [1, 32, 1], [1, W, 1], [2, 0, 1])


@gluon.jit
def _thread_exclusive(g, W: gl.constexpr):
    """Each element's exclusive prefix sum over its thread's own elements (last axis first, then the first), in
    ``g``'s layout."""
    b = gl.convert_layout(g, _blocked3(g.shape, W))
    rows = gl.sum(b, 2)[:, :, None] + gl.zeros_like(b)
    excl = gl.associative_scan(rows, 0, _add) - rows + gl.associative_scan(b, 2, _add) - b
    return gl.convert_layout(excl, g.type.layout)


@gluon.jit
def _slots(counter, g, C: gl.constexpr, W: gl.constexpr):
    """Each element's slot from the packed counts ``g`` (one thread's elements, two 16-bit counts an int32): the
    counter's value before the thread's warp added its total, plus the counts before the element."""
    tot = _thread_totals(g)
    if C == 1:
        base = px.warp_slot(counter, tot)
    else:
        base = px.cluster_warp_slot(counter, tot, 0)
    return base[None, :, None] + _thread_exclusive(g, W)


@gluon.jit
def _list_store(word, value, pred, C: gl.constexpr):
    if C == 1:
        px.store(word, value, pred)
    else:
        px.cluster_store(word, value, pred, 0)


@gluon.jit
def _coarse(HIST: gl.constexpr, COARSE: gl.constexpr, BINS: gl.constexpr, W: gl.constexpr):
    """Sum the histogram's ``BINS`` fine bins into 32 coarse bins (all threads; the histogram complete)."""
    BPT: gl.constexpr = BINS // (32 * W)   # fine bins a thread; the W threads of a coarse bin share a warp
    L: gl.constexpr = gl.BlockedLayout([1, 1, BPT], [32 // W, W, 1], [W, 1, 1], [2, 1, 0])
    cb = gl.arange(0, 32, layout=gl.SliceLayout(1, gl.SliceLayout(2, L)))
    m = gl.arange(0, W, layout=gl.SliceLayout(0, gl.SliceLayout(2, L)))
    j = gl.arange(0, BPT, layout=gl.SliceLayout(0, gl.SliceLayout(1, L)))
    word = HIST + (cb[:, None, None] * W + m[None, :, None]) * BPT + j[None, None, :]
    total = gl.sum(gl.sum(px.load(word), 2), 1)
    px.store(COARSE + cb, total, cb >= 0)  # the W lanes of a coarse bin store the same sum


@gluon.jit
def _search(need, HIST: gl.constexpr, COARSE: gl.constexpr, CTRL: gl.constexpr, BINS: gl.constexpr,
            W: gl.constexpr, C: gl.constexpr):
    """One warp's search of the coarse bins (summed over the cluster's CTAs when ``C > 1``), then of the fine bins
    of the coarse bin found, for the largest bin with at least ``need`` keys at or above it; stores (bin, keys above
    it, keys in it) at ``CTRL[0:3]``. Run by warp 0 alone."""
    FPC: gl.constexpr = BINS // 32
    FL: gl.constexpr = FPC // 32
    L2: gl.constexpr = gl.BlockedLayout([1, 1], [1, 32], [W, 1], [1, 0])
    lane = gl.arange(0, 32, layout=gl.SliceLayout(0, L2))[None, :] + gl.zeros([W, 1], gl.int32, L2)
    if C == 1:
        cv = px.load(COARSE + lane)
    else:
        cv = px.cluster_load(COARSE + lane, 0)
        for r in gl.static_range(1, C):
            cv += px.cluster_load(COARSE + lane, r)
    at_or_above = gl.associative_scan(cv, 1, _add, reverse=True)
    big = gl.max(gl.where(at_or_above >= need, lane, -1), 1)
    above_big = gl.sum(gl.where(lane == big[:, None], at_or_above - cv, 0), 1)
    # Through shared memory into scalars (each lane reads back what it wrote).
    px.store(CTRL + 3 + big * 0, big, big >= 0)
    px.store(CTRL + 4 + big * 0, above_big, big >= 0)
    P = px.load(CTRL + 3)
    above_P = px.load(CTRL + 4)
    L3: gl.constexpr = gl.BlockedLayout([1, 1, FL], [1, 32, 1], [W, 1, 1], [2, 1, 0])
    ln = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    jn = gl.arange(0, FL, layout=gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    q = ln[None, :, None] * FL + jn[None, None, :] + gl.zeros([W, 1, 1], gl.int32, L3)
    word = HIST + P * FPC + q
    if C == 1:
        f = px.load(word)
    else:
        f = px.cluster_load(word, 0)
        for r in gl.static_range(1, C):
            f += px.cluster_load(word, r)
    lane_total = gl.convert_layout(gl.sum(f, 2), L2)
    lanes_above = gl.associative_scan(lane_total, 1, _add, reverse=True) - lane_total
    lanes_above = gl.convert_layout(lanes_above, gl.SliceLayout(2, L3))
    at_or_above_f = above_P + lanes_above[:, :, None] + gl.associative_scan(f, 2, _add, reverse=True)
    pq = gl.max(gl.max(gl.where(at_or_above_f >= need, q, -1), 2), 1)
    hit = q == pq[:, None, None]
    n_in = gl.sum(gl.sum(gl.where(hit, f, 0), 2), 1)
    above = gl.sum(gl.sum(gl.where(hit, at_or_above_f, 0), 2), 1) - n_in
    px.store(CTRL + pq * 0, P * FPC + pq, pq >= 0)
    px.store(CTRL + 1 + pq * 0, above, pq >= 0)
    px.store(CTRL + 2 + pq * 0, n_in, pq >= 0)


@gluon.jit
def _threshold(need, tid, HIST: gl.constexpr, COARSE: gl.constexpr, CTRL: gl.constexpr, BINS: gl.constexpr,
               W: gl.constexpr, C: gl.constexpr):
    """The bin ``p`` of the ``need``-th largest key in the histogram (complete, after a barrier), the keys above it
    and in it, as scalars in every thread. With ``C > 1`` the histogram is the sum of the cluster's; every CTA of the
    cluster must call it together."""
    _coarse(HIST, COARSE, BINS, W)
    if C == 1:
        gl.thread_barrier()
    else:
        px.cluster_sync()
    if tid < 32:
        _search(need, HIST, COARSE, CTRL, BINS, W, C)
    gl.thread_barrier()
    return px.load(CTRL), px.load(CTRL + 1), px.load(CTRL + 2)


@gluon.jit
def _zero(buf, first: gl.constexpr, words: gl.constexpr, W: gl.constexpr):
    """Zero ``words`` (a power of two, at least the threads) words of the buffer from ``first``."""
    L: gl.constexpr = gl.BlockedLayout([words // (32 * W)], [32], [W], [0])
    buf.slice(first, words).store(gl.zeros([words], gl.int32, L))


@gluon.jit
def _reset_ctrl(CTRL: gl.constexpr, W: gl.constexpr):
    """The control words: zero, but the candidates' key and position range at +10..13 (min, max, min, max). By
    inline PTX (every warp writes the same values), so that Triton's barrier pass, which sees the histogram's
    zeroing as a write to the same buffer, puts no barrier between the two."""
    L: gl.constexpr = gl.BlockedLayout([1], [32], [W], [0])
    i = gl.arange(0, 32, layout=L)
    init = gl.where(i == 10, 2147483647, gl.where(i == 11, -2147483648, gl.where(i == 12, 2147483647,
                                                                               gl.where(i == 13, -1, 0))))
    px.store(CTRL + i, init, i >= 0)


# --------------------------------------------------------------------------------------------------------------------
# Candidates: radix levels, the ranking, the slow path


@gluon.jit
def _list_tensors(cur, c, CAP: gl.constexpr, W: gl.constexpr):
    """The candidate list at ``cur`` (keys, then positions), as [1, threads, CAP/threads] tensors: index, key,
    position, member (index below ``c``)."""
    EPT: gl.constexpr = CAP // (32 * W)
    L: gl.constexpr = gl.BlockedLayout([1, 1, EPT], [1, 32, 1], [1, W, 1], [2, 0, 1])
    t = gl.arange(0, 32 * W, layout=gl.SliceLayout(0, gl.SliceLayout(2, L)))
    e = gl.arange(0, EPT, layout=gl.SliceLayout(0, gl.SliceLayout(1, L)))
    i = t[None, :, None] * EPT + e[None, None, :]
    member = i < c
    key = px.load(cur + i)
    pos = px.load(cur + CAP + i)
    return i, key, pos, member


@gluon.jit
def _level_digit(comp, lo, s):
    return ((comp - lo).to(gl.uint64, bitcast=True) >> s.to(gl.uint64)).to(gl.int32)


@gluon.jit
def _level_emit(pos, key, digit, member, p2, take_all, not_all, out_row, out_base, nxt, CTRL: gl.constexpr,
                CAP: gl.constexpr, CAPE: gl.constexpr, W: gl.constexpr):
    """One radix level's writes: members above digit ``p2`` (and in it, with ``take_all``) to the output after
    ``out_base``, those in it to the next list at ``nxt``."""
    win = member & ((digit > p2) | (take_all & (digit == p2)))
    keep = member & (digit == p2) & (not_all)
    slot = _slots(CTRL + 9, win.to(gl.int32) + (keep.to(gl.int32) << 16), 1, W)
    gl.store(out_row + out_base + (slot & 0xFFFF), pos, mask=win)
    ls = slot >> 16
    px.store(nxt + ls, key, keep & (ls < CAPE))
    px.store(nxt + CAP + ls, pos, keep & (ls < CAPE))


@gluon.jit
def _row_chunk(row_ptr, start, n, p, V: gl.constexpr, E4: gl.constexpr, W: gl.constexpr, SHIFT: gl.constexpr):
    """A chunk of the row read again (the slow path): positions, fp32 keys, and whether each is in bin ``p``."""
    pos = _chunk_positions(start, V, E4, W)
    valid = pos < n
    x = gl.load(row_ptr + pos, mask=valid, other=0.0).to(gl.float32)
    in_p = valid & (((px.fp16_keys(x, x) & 0xFFFF) >> SHIFT) == p)
    return pos, _key32(x), in_p


@gluon.jit
def _candidates(row_ptr, out_row, n, k, p, above, n_in, tid, LISTA: gl.constexpr, LISTB: gl.constexpr,
                HIST: gl.constexpr, COARSE: gl.constexpr, CTRL: gl.constexpr, BITS: gl.constexpr,
                CAP: gl.constexpr, CAPE: gl.constexpr, R3L: gl.constexpr, V: gl.constexpr, E4: gl.constexpr,
                W: gl.constexpr, buf):
    """The row's last ``k - above`` positions from bin ``p`` (``n_in`` positions, listed at LISTA when they fit):
    radix levels until at most ``R3L`` remain, then each ranked against the others. One CTA, all its threads."""
    BINS: gl.constexpr = 1 << BITS
    CHUNK: gl.constexpr = E4 * 32 * W * V
    SHIFT: gl.constexpr = 16 - BITS
    need = k - above
    out_base = above
    c = n_in
    cur = LISTA
    lo = gl.to_tensor(0).to(gl.int64)
    span = gl.to_tensor(-1).to(gl.int64)
    if c > CAPE:
        # The bucket is larger than the list: its range, then radix levels over the row read again.
        for start in range(0, n, CHUNK):
            pos, key, in_p = _row_chunk(row_ptr, start, n, p, V, E4, W, SHIFT)
            px.red_min(CTRL + 10 + pos * 0, key, in_p)
            px.red_max(CTRL + 11 + pos * 0, key, in_p)
            px.red_min(CTRL + 12 + pos * 0, pos, in_p)
            px.red_max(CTRL + 13 + pos * 0, pos, in_p)
        gl.thread_barrier()
        lo = _composite(px.load(CTRL + 10), px.load(CTRL + 13))
        span = _composite(px.load(CTRL + 11), px.load(CTRL + 12)) - lo
        while c > CAPE:
            s = gl.maximum(px.bit_length64(span) - BITS, 0)
            _zero(buf, HIST, BINS, W)
            px.store(CTRL + 9, 0, tid == 0)
            gl.thread_barrier()
            for start in range(0, n, CHUNK):
                pos, key, in_p = _row_chunk(row_ptr, start, n, p, V, E4, W, SHIFT)
                off = (_composite(key, pos) - lo).to(gl.uint64, bitcast=True)
                member = in_p & (off <= span.to(gl.uint64, bitcast=True))
                px.red_add(HIST + _level_digit(_composite(key, pos), lo, s), 1, member)
            gl.thread_barrier()
            p2, above2, in2 = _threshold(need, tid, HIST, COARSE, CTRL, BINS, W, 1)
            take_all = in2 == need - above2
            not_all = in2 != need - above2
            for start in range(0, n, CHUNK):
                pos, key, in_p = _row_chunk(row_ptr, start, n, p, V, E4, W, SHIFT)
                comp = _composite(key, pos)
                member = in_p & ((comp - lo).to(gl.uint64, bitcast=True) <= span.to(gl.uint64, bitcast=True))
                _level_emit(pos, key, _level_digit(comp, lo, s), member, p2, take_all, not_all, out_row, out_base,
                            LISTA, CTRL, CAP, CAPE, W)
            gl.thread_barrier()
            out_base += above2
            need -= above2
            lo, span = _narrow(lo, span, p2, s)
            c = gl.where(take_all, 0, in2)
            need = gl.where(take_all, 0, need)
    else:
        # The listed candidates' fp32 keys, read again from the row.
        i, key, pos, member = _list_tensors(cur, c, CAP, W)
        key = _key32(gl.load(row_ptr + pos, mask=member, other=0.0).to(gl.float32))
        px.store(cur + i, key, member)
        gl.thread_barrier()
    if (c > R3L) & (c > need) & (span == -1):
        # The range of the listed candidates, for the first radix level.
        i, key, pos, member = _list_tensors(cur, c, CAP, W)
        px.red_min(CTRL + 10 + i * 0, key, member)
        px.red_max(CTRL + 11 + i * 0, key, member)
        px.red_min(CTRL + 12 + i * 0, pos, member)
        px.red_max(CTRL + 13 + i * 0, pos, member)
        gl.thread_barrier()
        lo = _composite(px.load(CTRL + 10), px.load(CTRL + 13))
        span = _composite(px.load(CTRL + 11), px.load(CTRL + 12)) - lo
    while (c > R3L) & (c > need):
        s = gl.maximum(px.bit_length64(span) - BITS, 0)
        nxt = LISTA + LISTB - cur
        _zero(buf, HIST, BINS, W)
        px.store(CTRL + 9, 0, tid == 0)
        gl.thread_barrier()
        i, key, pos, member = _list_tensors(cur, c, CAP, W)
        digit = _level_digit(_composite(key, pos), lo, s)
        px.red_add(HIST + digit, 1, member)
        gl.thread_barrier()
        p2, above2, in2 = _threshold(need, tid, HIST, COARSE, CTRL, BINS, W, 1)
        take_all = in2 == need - above2
        not_all = in2 != need - above2
        _level_emit(pos, key, digit, member, p2, take_all, not_all, out_row, out_base, nxt, CTRL, CAP, CAPE, W)
        gl.thread_barrier()
        out_base += above2
        need -= above2
        lo, span = _narrow(lo, span, p2, s)
        c = gl.where(take_all, 0, in2)
        need = gl.where(take_all, 0, need)
        cur = nxt
    i, key, pos, member = _list_tensors(cur, c, CAP, W)
    if c == need:
        gl.store(out_row + out_base + i, pos, mask=member)
    else:
        # Each listed candidate's rank among the others: how many have a larger key, or the same key and a lower
        # position. The first `need` ranks win. Warps holding no candidate skip the loop.
        # The slots after the last candidate, to the next multiple of 8, rank below every candidate (key INVALID).
        tail = (i >= c) & (i < c + 8)
        px.store(cur + i, gl.full(i.shape, INVALID_KEY, gl.int32, i.type.layout) + i * 0, tail)
        gl.thread_barrier()
        rank = gl.zeros_like(i)
        EPT: gl.constexpr = CAP // (32 * W)
        mine = _composite(key, pos)
        if (tid // 32) * (32 * EPT) < c:
            for j in range(0, c, 8):  # 8 candidates a step, as 64-bit composites
                k0, k1, k2, k3 = px.load4(cur + j)
                q0, q1, q2, q3 = px.load4(cur + CAP + j)
                k4, k5, k6, k7 = px.load4(cur + j + 4)
                q4, q5, q6, q7 = px.load4(cur + CAP + j + 4)
                rank += (_composite(k0, q0) > mine).to(gl.int32)
                rank += (_composite(k1, q1) > mine).to(gl.int32)
                rank += (_composite(k2, q2) > mine).to(gl.int32)
                rank += (_composite(k3, q3) > mine).to(gl.int32)
                rank += (_composite(k4, q4) > mine).to(gl.int32)
                rank += (_composite(k5, q5) > mine).to(gl.int32)
                rank += (_composite(k6, q6) > mine).to(gl.int32)
                rank += (_composite(k7, q7) > mine).to(gl.int32)
        gl.store(out_row + out_base + rank, pos, mask=member & (rank < need))


@gluon.jit
def _narrow(lo, span, p2, s):
    """The composite range of radix digit ``p2`` (width ``2**s``) within ``[lo, lo + span]``."""
    step = p2.to(gl.int64) << s.to(gl.int64)
    width = (gl.to_tensor(1).to(gl.int64) << s.to(gl.int64)) - 1
    rest = span.to(gl.uint64, bitcast=True) - step.to(gl.uint64, bitcast=True)
    return lo + step, gl.minimum(rest, width.to(gl.uint64, bitcast=True)).to(gl.int64, bitcast=True)


# --------------------------------------------------------------------------------------------------------------------
# The kernel


@gluon.jit(do_not_specialize=["k", "width", "next_n"])
def _topk_hopper_kernel(x_ptr, x_stride, ctx_ptr, out_ptr, k, width, next_n, CTX_2D: gl.constexpr,
                        W: gl.constexpr, E4: gl.constexpr, V: gl.constexpr, NCH: gl.constexpr, C: gl.constexpr,
                        BITS: gl.constexpr, CAP: gl.constexpr, R3L: gl.constexpr, WHOLE: gl.constexpr,
                        EAGER: gl.constexpr):
    BINS: gl.constexpr = 1 << BITS
    WORDS: gl.constexpr = shared_words(BINS, CAP)
    HIST: gl.constexpr = 0
    LISTA: gl.constexpr = BINS
    LISTB: gl.constexpr = BINS + 2 * CAP
    COARSE: gl.constexpr = WORDS - 64
    CTRL: gl.constexpr = WORDS - 32
    CAPE: gl.constexpr = capacity(BINS, CAP)
    CHUNK: gl.constexpr = E4 * 32 * W * V
    SEG: gl.constexpr = NCH * CHUNK
    SHIFT: gl.constexpr = 16 - BITS
    buf = gl.allocate_shared_memory(gl.int32, [WORDS], gl.SwizzledSharedLayout(1, 1, 1, [0]))

    pid = gl.program_id(0)
    row = pid // C
    rank = pid % C
    row_ptr = x_ptr + row.to(gl.int64) * x_stride
    seg_start = rank * SEG
    # With EAGER the first chunks' loads (up to 24 values a thread: more would spill) go out before the row's
    # length comes back; the rest follow once it has.
    EARLY: gl.constexpr = min(NCH, max(1, 24 // (E4 * V))) if EAGER else 0
    xs = ()
    for ci in gl.static_range(EARLY):
        xs = xs + (_load_chunk(row_ptr, seg_start + ci * CHUNK, gl.minimum(width, seg_start + SEG), V, E4, W,
                               WHOLE),)
    n = _row_length(ctx_ptr, row, width, next_n, CTX_2D)
    out_row = out_ptr + row.to(gl.int64) * k
    tid = px.thread_index()
    _zero(buf, HIST, BINS, W)  # while the row's length is on its way
    _reset_ctrl(CTRL, W)
    if n <= k:
        if rank == 0:
            L: gl.constexpr = gl.BlockedLayout([4], [32], [W], [0])
            for first in range(0, k, 128 * W):
                i = first + gl.arange(0, 128 * W, layout=L)
                gl.store(out_row + i, gl.where(i < n, i, -1), mask=i < k)
    else:
        seg_end = gl.minimum(n, seg_start + SEG)
        # 1. Load the segment (every chunk in flight at once), pack its 16-bit keys, count them.
        keys = ()
        for ci in gl.static_range(NCH):
            pos = _chunk_positions(seg_start + ci * CHUNK, V, E4, W)
            if ci < EARLY:
                x = xs[ci]
            else:
                x = _load_chunk(row_ptr, seg_start + ci * CHUNK, seg_end, V, E4, W, WHOLE)
            xa, xb = _pairs(x, V)
            pa, pb = _pairs(pos, V)
            # A position past the segment gets key 0, which no logit has (NaN counts as -inf, key 0x03FF): it
            # falls alone into bin 0, below the k-th largest of a row of more than k positions, and is never
            # written. Its count in bin 0 changes no count at or above that bin. Chunks wholly past it are not
            # packed at all (nor counted, nor scattered).
            if seg_start + ci * CHUNK < seg_end:
                w = px.fp16_keys(xa, xb)
                w = gl.where(pa < seg_end, w, w & -65536)
                w = gl.where(pb < seg_end, w, w & 65535)
            else:
                w = gl.zeros_like(pa)
            keys = keys + (w,)
        gl.thread_barrier()
        for ci in gl.static_range(NCH):
            if seg_start + ci * CHUNK < seg_end:  # chunks past the segment's end count nothing
                w = keys[ci]
                px.red_inc(HIST + ((w >> SHIFT) & (BINS - 1)))
                px.red_inc(HIST + ((w >> (16 + SHIFT)) & (BINS - 1)))
        gl.thread_barrier()
        # 2. The bin of the k-th largest key over the whole row.
        p, above, n_in = _threshold(k, tid, HIST, COARSE, CTRL, BINS, W, C)
        refine = n_in != k - above
        # Bins above `win_above` win (p's own too when all of p is needed); bin `tie_bin` is listed (-2: none).
        win_above = gl.where(refine, p, p - 1)
        tie_bin = gl.where(refine, p, -2)
        # 3. Positions above p to the output; p's own to the candidate list, or to the output if all are needed.
        for ci in gl.static_range(NCH):
            if seg_start + ci * CHUNK < seg_end:  # and write nothing
                pa, pb = _pairs(_chunk_positions(seg_start + ci * CHUNK, V, E4, W), V)
                w = keys[ci]
                ba = (w >> SHIFT) & (BINS - 1)
                bb = (w >> (16 + SHIFT)) & (BINS - 1)
                wa = ba > win_above
                wb = bb > win_above
                ta = ba == tie_bin
                tb = bb == tie_bin
                fa = gl.where(wa, 1, gl.where(ta, 65536, 0))
                fb = gl.where(wb, 1, gl.where(tb, 65536, 0))
                slot_a = _slots(CTRL + 8, fa + fb, C, W)
                slot_b = slot_a + fa
                gl.store(out_row + (slot_a & 0xFFFF), pa, mask=wa)
                gl.store(out_row + (slot_b & 0xFFFF), pb, mask=wb)
                # Listed by position only (the few candidates' keys are read again when the list is settled); slots
                # past the list's capacity all land on the slot after it, never read.
                _list_store(LISTA + CAP + gl.minimum(slot_a >> 16, CAPE), pa, ta, C)
                _list_store(LISTA + CAP + gl.minimum(slot_b >> 16, CAPE), pb, tb, C)
        if C == 1:
            gl.thread_barrier()
        else:
            px.cluster_sync()
        # 4. The rest from the candidates, in the cluster's first CTA.
        if (rank == 0) & refine:
            _candidates(row_ptr, out_row, n, k, p, above, n_in, tid, LISTA, LISTB, HIST, COARSE, CTRL, BITS, CAP,
                        CAPE, R3L, V, E4, W, buf)
    buf._keep_alive()


# --------------------------------------------------------------------------------------------------------------------
# Launch

_ELEM = {torch.float32: ("fp32", 4), torch.bfloat16: ("bf16", 2), torch.float16: ("fp16", 2)}


def constexprs(config: HopperTopKConfig, ctx_2d: bool, elem_bytes: int, width: int) -> dict:
    """The kernel's constexprs; ``WHOLE``: the width is whole 16-byte vectors, so the kernel may load the last
    vector of a row's prefix whole."""
    return dict(CTX_2D=ctx_2d, W=config.warps, E4=config.vectors, V=16 // elem_bytes, NCH=config.chunks,
                C=config.cluster, BITS=config.bits, CAP=config.candidates, R3L=config.rank_limit,
                WHOLE=width % (16 // elem_bytes) == 0, EAGER=config.eager)


def check_launch(config: HopperTopKConfig, width: int, k: int, elem_bytes: int) -> None:
    if config.reach(elem_bytes) < width:
        raise ValueError(f"the launch covers {config.reach(elem_bytes)} positions a row (cluster x segment), fewer "
                         f"than the logits' {width}")
    if k > MAX_K:
        raise ValueError(f"k must be at most {MAX_K} for the sm90 kernel, got {k}")


def sm90a_source(config: HopperTopKConfig, ctx_2d: bool = False, dtype: str = "fp32", width: int = 65536,
                 aligned: bool = True):
    """What a launch compiles: Gluon's source of the kernel (signature, constexprs and, where ``aligned``, the
    tensors 16-byte aligned and the row stride a multiple of 16, which lets its loads take 16 bytes)."""
    elem_bytes = {"fp32": 4, "bf16": 2, "fp16": 2}[dtype]
    consts = constexprs(config, ctx_2d, elem_bytes, width)
    signature = {"x_ptr": f"*{dtype}", "x_stride": "i32", "ctx_ptr": "*i32", "out_ptr": "*i32", "k": "i32",
                 "width": "i32", "next_n": "i32", **dict.fromkeys(consts, "constexpr")}
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2, 3)} if aligned else {}
    return gluon_source(_topk_hopper_kernel, signature, consts, attrs)


def compile_sm90a(config: HopperTopKConfig | None = None, ctx_2d: bool = False, dtype: str = "fp32",
                  width: int = 65536, aligned: bool = True):
    """Compile the kernel for sm90a, with or without a GPU (Triton's bundled ptxas; its cache keeps the result, so
    a later launch of the same arguments finds it); returns Triton's compiled kernel, checked to hold only its one
    shared-memory buffer. Call it where TRITON_INTERPRET is 0."""
    from triton.backends.compiler import GPUTarget

    config = config or HopperTopKConfig()
    options = dict(num_warps=config.warps, **({"maxnreg": config.registers} if config.registers else {}))
    compiled = triton.compile(sm90a_source(config, ctx_2d, dtype, width, aligned), target=GPUTarget("cuda", 90, 32),
                              options=options)
    smem_ptx.check_single_allocation(compiled, config.shared_words())
    return compiled


_COMPILED: dict = {}


def _aligned(logits: torch.Tensor, lengths: torch.Tensor, out: torch.Tensor) -> bool:
    return all(t.data_ptr() % 16 == 0 for t in (logits, lengths, out)) and logits.stride(0) % 16 == 0


def launch_topk_hopper(logits: torch.Tensor, lengths: torch.Tensor, out: torch.Tensor, k: int, next_n: int,
                       ctx_2d: bool, config: HopperTopKConfig) -> torch.Tensor:
    """Run the sm90 kernel on checked inputs (as :func:`preshuffle.topk.portable.launch_topk` takes them): ``logits``
    [rows, width] with unit column stride, ``lengths`` int32, ``out`` int32 [rows, k] contiguous. Each launch
    (options, logits type, lengths' rank, whole vectors, alignment, device) compiles once; a cluster launch is
    Triton's launcher making clusters of ``cluster`` CTAs of a kernel compiled for one."""
    rows, width = logits.shape
    if rows == 0 or width == 0:
        return out.fill_(-1)
    dtype, elem_bytes = _ELEM[logits.dtype]
    check_launch(config, width, k, elem_bytes)
    whole = width % (16 // elem_bytes) == 0
    aligned = _aligned(logits, lengths, out)
    key = (config, dtype, ctx_2d, whole, aligned, logits.device)
    compiled = _COMPILED.get(key)
    if compiled is None:
        with torch.cuda.device(logits.device):
            compiled = compile_sm90a(config, ctx_2d, dtype, width, aligned)
            load_compiled(compiled)
        _COMPILED[key] = compiled
    consts = constexprs(config, ctx_2d, elem_bytes, width)
    stream = torch.cuda.current_stream(logits.device).cuda_stream
    run_compiled(compiled, (rows, 1, 1), config.cluster, stream, logits, logits.stride(0), lengths, out, k, width,
                 next_n, *consts.values())
    return out


def replace(config: HopperTopKConfig, **changes) -> HopperTopKConfig:
    return dataclasses.replace(config, **changes)
