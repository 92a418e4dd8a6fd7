"""FP8 paged MQA logits for Hopper (sm90), in Gluon: the cache is read by TMA, a loader warp keeps a ring of
shared-memory stages full through mbarriers, and a math warpgroup (or one for each query row) multiplies each
64-position chunk by the queries with WGMMA, then applies relu, the weights, the head sum and the scales.

Why each piece (the numbers were measured on an H200; docs/kernel-design.md):

* **TMA over a paged cache.** A page of B tokens is ``B*132`` bytes: ``B`` rows of 128 value bytes, then the
  scales. A 3-D descriptor ``[num_blocks, B, 128]`` with a page stride of ``B*132`` bytes lets one copy fetch
  the ``min(B, 64)`` rows of a chunk (a 16-token page is 4 copies), and a 2-D fp32 descriptor fetches the
  scales. A block id past the table, the context or the cache becomes -1 or stays out of range: TMA reads such a
  box as zeros (values) and NaN (scales, the descriptor's padding), so no input makes the kernel read outside the
  cache, and the NaN scales make that page's logits NaN (the contract) without the math loading any block id.
* **A gather where TMA cannot go.** A descriptor's strides must be multiples of 16 bytes (a page of ``B*132``
  bytes is one when 4 divides B), and a chunk must be whole copies of ``min(B, 64)`` rows: TMA takes pages of 16,
  32 or a multiple of 64 tokens (:func:`preshuffle.kernels.launch.gathers`). Other pages (block 1, what vLLM
  negotiates without a kernel that takes ``MultipleOf(16)``; 48 tokens) are gathered by a loader warpgroup: each
  thread copies 4 bytes of 16 keys a chunk with cp.async (the rows are 4-byte aligned), and each thread's copies
  arrive on the stage's barrier when they land. An invalid block id copies nothing; the math, which loads the block
  ids a chunk ahead, marks its logits NaN.
* **The pipeline.** The loader waits for a free stage, posts the bytes it expects on the stage's barrier and
  issues the copies; the math warpgroup waits on the barrier and hands the stage back when its MMA is done.
  Block ids come 32 at a time, one group ahead.
* **The MMA.** Keys are WGMMA's A operand (M = 64 positions), the queries of one or two rows its B operand
  (N = rows x heads, 16 to 256), fp32 accumulators. fp8 precision reads both from shared memory in place (DeepGEMM's
  numerics). The exact precision loads the keys with ldmatrix, widens them to fp16 in registers (exact) and
  multiplies on fp16 tensor cores; the widened registers are already the fp16 operand once the head dim is
  reordered, so the queries are stored in that order too. Preshuffled pages are copied raw and read through
  the shuffle's own address map: the 16-byte rows a lane needs are contiguous, as on AMD.
* **Warpgroups per row.** Triton pads the loader warp to a warpgroup, and every warp of a program holds the
  program's register budget, so a program of one math warpgroup costs two warpgroups of registers. With
  ``row_warpgroups`` each query row gets a math warpgroup of its own (N = heads; 64 registers a thread at fp8)
  reading the same stages, and a stage is free once all of them have arrived: three rows fit two programs an SM
  (6 math warpgroups) where one warpgroup for four padded rows fits two (2).
* **The split.** Each program owns one sequence and an even share of the chunks that hold its context, cut from
  the length it reads (:func:`_read_share`; the -inf fill past it likewise, :func:`_fill_share`): the launch is
  ``splits`` programs a sequence whatever ``max_model_len`` is, and needs no host sync. The launch rule
  (:func:`preshuffle.kernels.launch.hopper_config`) picks how many, how deep the ring is and whether rows get
  warpgroups of their own.

Every position of the output row is written: logits where the row may see the position, -inf past that, NaN
where the block id is invalid or the scale is not finite and positive, and wherever a NaN in q or a key enters
(the same contract as the portable kernel, docs/input-contract.md); unless ``CLEAN`` is off (DeepGEMM's
``clean_logits=False``), which skips the -inf fill past the context. Logits are stored in the output's type: fp32,
or bf16 rounded to nearest even.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (fence_async_shared, mbarrier, tma, warpgroup_mma,
                                                              warpgroup_mma_wait)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from ..internals import constexpr_function, encode_descriptor, gluon_source, launch_metadata, raw_stream
from .launch import (CHUNK, HopperConfig, gathers, hopper_config, hopper_loader_regs, hopper_registers,
                     math_warpgroups)
from .preset_launch import preset

HEAD_DIM = 128
_CHUNK = gl.constexpr(CHUNK)  # positions per MMA (and per stage of the ring)
_D = gl.constexpr(HEAD_DIM)


@gluon.jit
def _position_ids(bt_row, pos, kv_len, bt_width, BLOCK_SIZE: gl.constexpr):
    """The block ids of positions ``pos``, -1 past the context or the table."""
    return gl.load(bt_row + pos // BLOCK_SIZE, mask=(pos < kv_len) & (pos // BLOCK_SIZE < bt_width), other=-1)


@gluon.jit
def _id_group(row, n_entries, group, lanes):
    """Block ids 32*group .. 32*group+31 of a program's row, -1 past the context or the table."""
    e = group * 32 + lanes
    return gl.load(row + e, mask=e < n_entries, other=-1)


@gluon.jit
def _fetch(i, cursor, descs, buffers, ready, row, n_entries, start,
           BLOCK_SIZE: gl.constexpr, TOK: gl.constexpr, STAGES: gl.constexpr):
    """TMA copies of chunk i's values and scales into stage i % STAGES (free by then), completing on its ready
    barrier. ``cursor`` holds the block ids of the current and the next group of 32 (the next one loaded while the
    current one is used); the updated cursor is returned."""
    group, ids, next_ids = cursor
    kv_desc, sc_desc = descs
    kv_smem, sc_smem = buffers
    COPIES: gl.constexpr = _CHUNK // TOK
    SLOT: gl.constexpr = sc_smem.shape[2]
    lanes = gl.arange(0, 32, layout=ids.type.layout)
    s = i % STAGES
    bar = ready.index(s)
    mbarrier.expect(bar, _CHUNK * _D + COPIES * SLOT * 4)
    for c in gl.static_range(COPIES):
        pos = start + (i * COPIES + c) * TOK
        entry = pos // BLOCK_SIZE - start // BLOCK_SIZE   # in the row, from the program's first block
        if entry // 32 != group:
            group = entry // 32
            ids = next_ids
            next_ids = _id_group(row, n_entries, group + 1, lanes)
        page = gl.sum(gl.where(lanes == entry % 32, ids, 0), axis=0)
        dst = kv_smem.index(s).slice(c * TOK, TOK)._reinterpret(gl.float8e4nv, [1, TOK, _D], kv_desc.layout)
        tma.async_copy_global_to_shared(kv_desc, [page, pos % BLOCK_SIZE, 0], bar, dst)
        tma.async_copy_global_to_shared(sc_desc, [page, BLOCK_SIZE * (_D // 4) + pos % BLOCK_SIZE], bar,
                                        sc_smem.index(s).slice(c, 1))
    return group, ids, next_ids


@gluon.jit
def _row_ids(bt_ptr, bt_stride, bt_width, b, start, kv_len, BLOCK_SIZE: gl.constexpr):
    """The start of a program's row of block ids (from its first block) and how many entries it may read."""
    first_entry = start // BLOCK_SIZE
    return bt_ptr + b * bt_stride + first_entry, gl.minimum(gl.cdiv(kv_len, BLOCK_SIZE), bt_width) - first_entry


@gluon.jit
def _loader(loads, BLOCK_SIZE: gl.constexpr, TOK: gl.constexpr, STAGES: gl.constexpr, GATHER: gl.constexpr):
    if GATHER:
        _gather_loader(loads, BLOCK_SIZE, STAGES)
    else:
        _tma_loader(loads, BLOCK_SIZE, TOK, STAGES)


@gluon.jit
def _tma_loader(loads, BLOCK_SIZE: gl.constexpr, TOK: gl.constexpr, STAGES: gl.constexpr):
    """The loader warp: for each chunk, a free stage, then its copies."""
    descs, buffers, bars, bt_ptr, bt_stride, bt_width, b, max_model_len, kv_len, _ = loads
    start, n_read = _read_share(kv_len, max_model_len)
    ready, empty = bars
    row, n_entries = _row_ids(bt_ptr, bt_stride, bt_width, b, start, kv_len, BLOCK_SIZE)
    lanes = gl.arange(0, 32, layout=gl.BlockedLayout([1], [32], [1], [0]))
    cursor = (0, _id_group(row, n_entries, 0, lanes), _id_group(row, n_entries, 1, lanes))
    for i in range(n_read):
        mbarrier.wait(empty.index(i % STAGES), ((i // STAGES) & 1) ^ 1)
        cursor = _fetch(i, cursor, descs, buffers, ready, row, n_entries, start, BLOCK_SIZE, TOK, STAGES)


@gluon.jit
def _gather_loader(loads, BLOCK_SIZE: gl.constexpr, STAGES: gl.constexpr):
    """The loader warpgroup for pages TMA cannot copy: each thread copies 4 bytes of 16 keys a chunk, and a scale,
    with cp.async; each thread's copies, once complete, arrive on the stage's ready barrier. An id outside the
    table, the context or the cache copies nothing (the math writes NaN there)."""
    srcs, buffers, bars, bt_ptr, bt_stride, bt_width, b, max_model_len, kv_len, num_blocks = loads
    start, n_read = _read_share(kv_len, max_model_len)
    kv_ptr, sc_ptr = srcs
    kv_smem, sc_smem = buffers
    ready, empty = bars
    keys: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])   # a warp copies one 128-byte row
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    bt_row = bt_ptr + b * bt_stride
    tok = gl.arange(0, _CHUNK, layout=flat)
    t_k = gl.arange(0, _CHUNK, layout=gl.SliceLayout(1, keys))
    d = gl.arange(0, _D, layout=gl.SliceLayout(0, keys))
    # Ids three chunks ahead, so that no id load's latency sits between a free stage and its copies (on the H200,
    # one chunk ahead measured the same).
    ahead = (_position_ids(bt_row, start + tok, kv_len, bt_width, BLOCK_SIZE),
             _position_ids(bt_row, start + _CHUNK + tok, kv_len, bt_width, BLOCK_SIZE),
             _position_ids(bt_row, start + 2 * _CHUNK + tok, kv_len, bt_width, BLOCK_SIZE))
    for i in range(n_read):
        s = i % STAGES
        pos = start + i * _CHUNK + tok
        ids = ahead[0]
        ahead = (ahead[1], ahead[2], _position_ids(bt_row, pos + 3 * _CHUNK, kv_len, bt_width, BLOCK_SIZE))
        # Token t of page p: values at byte p*B*132 + t*128, scale at word p*B*33 + B*32 + t.
        ok = (ids >= 0) & (ids < num_blocks)
        scale_at = gl.where(ok, ids, 0).to(gl.int64) * (BLOCK_SIZE * (_D // 4 + 1)) + BLOCK_SIZE * (_D // 4) \
            + pos % BLOCK_SIZE
        ids_k = gl.convert_layout(ids, gl.SliceLayout(1, keys))
        ok_k = (ids_k >= 0) & (ids_k < num_blocks)
        value_at = gl.where(ok_k, ids_k, 0).to(gl.int64) * (BLOCK_SIZE * (_D + 4)) \
            + ((start + i * _CHUNK + t_k) % BLOCK_SIZE) * _D
        mbarrier.wait(empty.index(s), ((i // STAGES) & 1) ^ 1)
        async_copy.async_copy_global_to_shared(kv_smem.index(s), kv_ptr + value_at[:, None] + d[None, :],
                                               mask=ok_k[:, None])
        async_copy.async_copy_global_to_shared(
            sc_smem.index(s)._reinterpret(gl.float32, [_CHUNK], gl.SwizzledSharedLayout(1, 1, 1, [0])),
            sc_ptr + scale_at, mask=ok)
        async_copy.mbarrier_arrive(ready.index(s), increment_count=False)


@constexpr_function
def _copy_rows(tok):
    """The layout of a chunk's scales as [copies, tok] (copy c, token t: chunk position c*tok + t) whose threads
    hold the positions WGMMA's accumulator rows give them: position bits 0-2 are lane bits 2-4, bit 3 a register,
    bits 4-5 the warp (lane bits 0-1 hold the same rows)."""
    def at(p):
        return [p // tok, 0] if p >= tok else [0, p]
    return gl.DistributedLinearLayout(reg_bases=[at(8)], lane_bases=[[0, 0], [0, 0], at(1), at(2), at(4)],
                                      warp_bases=[at(16), at(32)], block_bases=[], shape=[CHUNK // tok, tok])


@gluon.jit
def _scales(sc_smem, s, rows: gl.constexpr, TOK: gl.constexpr):
    """The chunk's 64 scales from stage s, in the accumulator rows' layout: one slot, or TOK at the head of each
    copy's 128-byte slot (TMA's alignment in shared memory), read in :func:`_copy_rows`'s layout, so that no scale
    passes between threads: the conversion below compiles to nothing."""
    if TOK == _CHUNK:
        return sc_smem.index(s)._reinterpret(gl.float32, [_CHUNK], gl.SwizzledSharedLayout(1, 1, 1, [0])).load(rows)
    else:
        copies = sc_smem.index(s).slice(0, TOK, dim=1).load(_copy_rows(TOK))
        return gl.convert_layout(gl.reshape(copies, [_CHUNK]), rows)


@gluon.jit
def _widen_order(x, ROWS: gl.constexpr):
    """The head-dim order in which fp8 operand registers, widened to fp16, already are the fp16 operand: in each
    32-wide block, position 16s + 8h + 2c + e of the fp16 operand holds dim 16s + 4c + 2h + e."""
    x = gl.reshape(x, [ROWS, 4, 2, 4, 2, 2])
    return gl.reshape(gl.permute(x, [0, 1, 2, 4, 3, 5]), [ROWS, 128])


@gluon.jit
def _keys(k_smem, a8: gl.constexpr, a16: gl.constexpr, SHUFFLED: gl.constexpr, EXACT: gl.constexpr):
    """One stage's keys [64, D] as WGMMA's A operand: in place (natural fp8), or in registers."""
    if SHUFFLED:
        # (t, d) sits at (t//16)*2048 + (d//16)*256 + (t%16)*16 + d%16, a permutation of address bits: each offset
        # bit names the (token, dim) step it stands for.
        shuffled: gl.constexpr = gl.SharedLinearLayout(
            offset_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [1, 0], [2, 0], [4, 0], [8, 0], [0, 16], [0, 32],
                          [0, 64], [16, 0], [32, 0]])
        k_smem = k_smem._reinterpret(gl.float8e4nv, k_smem.shape, shuffled)
    if EXACT:
        return gl.convert_layout(_widen_order(k_smem.load(a8).to(gl.float16), 64), a16)
    elif SHUFFLED:
        return k_smem.load(a8)
    else:
        return k_smem


@gluon.jit
def _head_sum(acc, w, GJ: gl.constexpr, H: gl.constexpr):
    """relu, weights and the head sum: the logits [64, GJ] of the accumulator's query rows, before the scale."""
    # The relu keeps NaN: a NaN in q or in a key is no score of 0.
    return gl.sum(gl.reshape(gl.maximum(acc, 0.0, propagate_nan=tl.PropagateNan.ALL) * w[None, :], [_CHUNK, GJ, H]),
                  axis=2)


@gluon.jit
def _visible(ctx_ptr, b, kv_len, zero, j0, GJ: gl.constexpr, NEXT_N: gl.constexpr, H: gl.constexpr,
             CTX_2D: gl.constexpr):
    """How many leading positions query rows j0 .. j0+GJ-1 may see, in the layout of :func:`_head_sum`'s columns:
    read once before the chunks, where a load in the loop would wait on memory every chunk."""
    lay: gl.constexpr = _head_sum(zero, gl.zeros([GJ * H], gl.float32, gl.SliceLayout(0, zero.type.layout)), GJ,
                                  H).type.layout
    js = j0 + gl.arange(0, GJ, layout=gl.SliceLayout(0, lay))
    if CTX_2D:
        return gl.load(ctx_ptr + b * NEXT_N + js, mask=js < NEXT_N, other=0)
    else:
        return kv_len - NEXT_N + js + 1


@gluon.jit
def _store_chunk(acc, w, scale, page_ok, first, visible, out_ptr, b, out_stride, end,
                 j0, GJ: gl.constexpr, NEXT_N: gl.constexpr, H: gl.constexpr):
    """relu, weights, head sum, scale, masks: the logits [64, GJ] of query rows j0 .. j0+GJ-1, stored
    (``visible``: :func:`_visible`'s)."""
    logits = _head_sum(acc, w, GJ, H)
    lay: gl.constexpr = logits.type.layout
    pos = first + gl.arange(0, _CHUNK, layout=gl.SliceLayout(1, lay))
    js = j0 + gl.arange(0, GJ, layout=gl.SliceLayout(0, lay))
    # s > 0, so relu(s * x) = s * relu(x): one multiply per position, after the head sum. Any other scale is NaN
    # here, so that its logits are NaN rather than finite and wrong.
    scale = gl.where((scale > 0.0) & (scale < float("inf")), scale, float("nan"))
    logits = logits * gl.convert_layout(scale, gl.SliceLayout(1, lay))[:, None]
    if page_ok is not None:  # gathered pages; TMA's pages bring NaN scales for invalid block ids
        logits = gl.where(gl.convert_layout(page_ok, gl.SliceLayout(1, lay))[:, None], logits, float("nan"))
    logits = gl.where(pos[:, None] < visible[None, :], logits, float("-inf"))
    ptrs = out_ptr + (b * NEXT_N + js).to(gl.int64)[None, :] * out_stride + pos[:, None]
    gl.store(ptrs, logits.to(out_ptr.dtype.element_ty), mask=(pos < end)[:, None] & (js < NEXT_N)[None, :])


@gluon.jit
def _math(work, J0: gl.constexpr, ROWS: gl.constexpr, NEXT_N: gl.constexpr, H: gl.constexpr,
          BLOCK_SIZE: gl.constexpr, TOK: gl.constexpr, STAGES: gl.constexpr, SHUFFLED: gl.constexpr,
          CTX_2D: gl.constexpr, EXACT: gl.constexpr, GATHER: gl.constexpr, CLEAN: gl.constexpr,
          num_warps: gl.constexpr):
    """One warpgroup, for query rows J0 .. J0+ROWS-1 of the program's (from its first, ``row0``; ROWS a power of two;
    rows past next_n are zero): per chunk,
    MMAs of the keys against the queries of two rows at a time (one when ROWS is 1), each followed by its epilogue;
    then (``CLEAN``) -inf for its rows' positions past the context."""
    ptrs, buffers, bars, dims = work
    q_ptr, w_ptr, ctx_ptr, bt_ptr, out_ptr = ptrs
    out_stride, num_blocks, bt_stride, bt_width, b, row0, end, kv_len = dims
    j0 = row0 + J0
    start, n_read = _read_share(kv_len, end)
    kv_smem, sc_smem = buffers
    ready, empty = bars
    GJ: gl.constexpr = 2 if ROWS >= 2 else 1   # query rows per MMA
    NG: gl.constexpr = ROWS // GJ              # MMAs per chunk
    N: gl.constexpr = GJ * H
    mma8: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 32])
    a8: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma8, k_width=4)
    if EXACT:
        mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, N, 16])
        a16: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
        q_dtype: gl.constexpr = gl.float16
    else:
        mma: gl.constexpr = mma8
        a16: gl.constexpr = a8
        q_dtype: gl.constexpr = gl.float8e4nv
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    cols: gl.constexpr = gl.SliceLayout(0, mma)
    flat: gl.constexpr = gl.BlockedLayout([1], [32], [num_warps], [0])

    # Queries [ROWS*H, D], row j*H + h of query row j0 + j, into shared memory: WGMMA's B operand.
    first_q = (b * NEXT_N + j0) * H
    n_q = (NEXT_N - j0) * H                    # this warpgroup's rows that exist, times H
    qb: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [num_warps, 1], [1, 0])
    r = gl.arange(0, ROWS * H, layout=gl.SliceLayout(1, qb))
    d = gl.arange(0, _D, layout=gl.SliceLayout(0, qb))
    q = gl.load(q_ptr + (first_q + r).to(gl.int64)[:, None] * _D + d[None, :], mask=(r < n_q)[:, None], other=0.0)
    q_smem = gl.allocate_shared_memory(q_dtype, [ROWS * H, _D],
                                       gl.NVMMASharedLayout.get_default_for([ROWS * H, _D], q_dtype))
    if EXACT:
        q = _widen_order(q.to(gl.float16), ROWS * H)
    q_smem.store(q.to(q_dtype))
    fence_async_shared()
    if NG == 1:
        c = gl.arange(0, N, layout=cols)
        w = gl.load(w_ptr + first_q + c, mask=c < n_q, other=0.0)
    else:  # registers hold one MMA's weights at a time
        c = gl.arange(0, ROWS * H, layout=flat)
        w_smem = gl.allocate_shared_memory(gl.float32, [ROWS * H], gl.SwizzledSharedLayout(1, 1, 1, [0]))
        w_smem.store(gl.load(w_ptr + first_q + c, mask=c < n_q, other=0.0))

    tok = gl.arange(0, _CHUNK, layout=rows)
    zero = gl.zeros([_CHUNK, N], gl.float32, layout=mma)
    visible_first = _visible(ctx_ptr, b, kv_len, zero, j0, GJ, NEXT_N, H, CTX_2D)  # each MMA's rows (two at most)
    if NG > 1:
        visible_second = _visible(ctx_ptr, b, kv_len, zero, j0 + GJ, GJ, NEXT_N, H, CTX_2D)
    bt_row = bt_ptr + b * bt_stride
    if GATHER:
        ids = _position_ids(bt_row, start + tok, kv_len, bt_width, BLOCK_SIZE)
    for i in range(n_read):
        s = i % STAGES
        first = start + i * _CHUNK
        page_ok = None
        if GATHER:  # an invalid block id copies nothing: the math marks its positions
            page_ok = (ids >= 0) & (ids < num_blocks)
            ids = _position_ids(bt_row, first + _CHUNK + tok, kv_len, bt_width, BLOCK_SIZE)  # a chunk ahead
        mbarrier.wait(ready.index(s), (i // STAGES) & 1)
        if GATHER:  # cp.async wrote the stage through the generic proxy; WGMMA reads it through the async one
            fence_async_shared()
        scale = _scales(sc_smem, s, rows, TOK)
        a = _keys(kv_smem.index(s), a8, a16, SHUFFLED, EXACT)
        for g in gl.static_range(NG):
            acc = warpgroup_mma(a, q_smem.slice(g * N, N).permute((1, 0)), zero, use_acc=False, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            if g == NG - 1:
                # The scales (and on the register paths the keys) were read by ordinary loads: order them before
                # the loader's next TMA write into this stage, then hand the stage back.
                fence_async_shared()
                mbarrier.arrive(empty.index(s), count=1)
            if NG == 1:
                wg = w
            else:
                wg = w_smem.slice(g * N, N).load(cols)
            if g == 0:
                visible = visible_first
            else:
                visible = visible_second
            _store_chunk(acc, wg, scale, page_ok, first, visible, out_ptr, b, out_stride, end,
                         j0 + g * GJ, GJ=GJ, NEXT_N=NEXT_N, H=H)

    if CLEAN:  # positions past the context: -inf, without touching the cache
        fill_start, fill_end = _fill_share(kv_len, end)
        tail = gl.arange(0, _CHUNK, layout=flat)
        neg_inf = gl.full([_CHUNK], float("-inf"), out_ptr.dtype.element_ty, layout=flat)
        for first in range(fill_start, fill_end, _CHUNK):
            pos = first + tail
            for k in gl.static_range(ROWS):
                j = j0 + k
                gl.store(out_ptr + ((b * NEXT_N + j).to(gl.int64) * out_stride + pos), neg_inf,
                         mask=(pos < fill_end) & (j < NEXT_N))


@gluon.jit
def _chunks(kv_len, max_model_len):
    """The chunks that hold a row's context: the sequence reads ``kv_len`` positions, the row holds
    ``max_model_len``."""
    return gl.cdiv(gl.maximum(gl.minimum(kv_len, max_model_len), 0), _CHUNK)


@gluon.jit
def _read_share(kv_len, max_model_len):
    """This program's share of its row's context: the first of its chunks and how many it reads, one of the row's
    ``num_programs(1)`` even shares of the chunks that hold the context."""
    n_chunks = _chunks(kv_len, max_model_len)
    split = gl.program_id(1)
    per = gl.cdiv(n_chunks, gl.num_programs(1))
    return split * per * _CHUNK, gl.maximum(gl.minimum(per, n_chunks - split * per), 0)


@gluon.jit
def _fill_share(kv_len, max_model_len):
    """This program's share of the row past the chunks that hold the context, which it fills with -inf: one of the
    row's ``num_programs(1)`` even shares."""
    tail = _chunks(kv_len, max_model_len) * _CHUNK
    per = gl.cdiv(gl.cdiv(gl.maximum(max_model_len - tail, 0), _CHUNK), gl.num_programs(1))
    first = tail + gl.program_id(1) * per * _CHUNK
    return first, gl.minimum(first + per * _CHUNK, max_model_len)


@gluon.jit
def _hopper_kernel(q_ptr, kv_src, sc_src, w_ptr, ctx_ptr, bt_ptr, out_ptr,
                   bt_stride, bt_width, out_stride, max_model_len, num_blocks,
                   NEXT_N: gl.constexpr, NP: gl.constexpr, H: gl.constexpr, BLOCK_SIZE: gl.constexpr,
                   TOK: gl.constexpr, STAGES: gl.constexpr, SHUFFLED: gl.constexpr, CTX_2D: gl.constexpr,
                   EXACT: gl.constexpr, GATHER: gl.constexpr, CLEAN: gl.constexpr, MATH_WGS: gl.constexpr,
                   MATH_REGS: gl.constexpr, LOADER_WARPS: gl.constexpr, LOADER_REGS: gl.constexpr,
                   ROW_GROUPS: gl.constexpr, num_warps: gl.constexpr):
    # kv_src, sc_src: TMA descriptors over the cache's values and scales, or (GATHER) pointers to them.
    # ROW_GROUPS programs side by side take a sequence's query rows in even groups: they read the same pages at
    # about the same time, the second from L2.
    b = gl.program_id(0) // ROW_GROUPS
    GROUP_ROWS: gl.constexpr = NP // ROW_GROUPS
    row0 = gl.program_id(0) % ROW_GROUPS * GROUP_ROWS
    if CTX_2D:
        kv_len = gl.load(ctx_ptr + b * NEXT_N)
        for j in gl.static_range(1, NEXT_N):
            kv_len = gl.maximum(kv_len, gl.load(ctx_ptr + b * NEXT_N + j))
    else:
        kv_len = gl.load(ctx_ptr + b)

    # Natural pages land 128-byte swizzled, as WGMMA reads them in place; preshuffled pages are copied raw into
    # the same (1024-byte aligned) ring.
    kv_smem = gl.allocate_shared_memory(gl.float8e4nv, [STAGES, _CHUNK, _D],
                                        gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2))
    if GATHER:
        sc_smem = gl.allocate_shared_memory(gl.float32, [STAGES, 1, _CHUNK],
                                            gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    else:
        sc_smem = gl.allocate_shared_memory(gl.float32, [STAGES, _CHUNK // TOK, sc_src.block_type.shape[1]],
                                            sc_src.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for s in gl.static_range(STAGES):
        # TMA: one arrival that posts the bytes to expect; cp.async: one arrival a loader thread.
        mbarrier.init(ready.index(s), count=LOADER_WARPS * 32 if GATHER else 1)
        mbarrier.init(empty.index(s), count=MATH_WGS)

    # Runtime values travel to the partitions in tuples; constexprs one by one (a tuple would make them values).
    buffers = (kv_smem, sc_smem)
    bars = (ready, empty)
    loads = ((kv_src, sc_src), buffers, bars, bt_ptr, bt_stride, bt_width, b, max_model_len, kv_len, num_blocks)
    work = ((q_ptr, w_ptr, ctx_ptr, bt_ptr, out_ptr), buffers, bars,
            (out_stride, num_blocks, bt_stride, bt_width, b, row0, max_model_len, kv_len))
    # One math warpgroup for all query rows, or one for each: each waits for the same stages, and a stage is free
    # once every math warpgroup has arrived. Worker partitions are listed one by one: the list is static code.
    if MATH_WGS == 1:
        gl.warp_specialize([
            (_math, (work, 0, GROUP_ROWS, NEXT_N, H, BLOCK_SIZE, TOK, STAGES, SHUFFLED, CTX_2D, EXACT, GATHER, CLEAN,
                     num_warps)),
            (_loader, (loads, BLOCK_SIZE, TOK, STAGES, GATHER))], [LOADER_WARPS], [LOADER_REGS])
    elif MATH_WGS == 2:
        gl.warp_specialize([
            (_math, (work, 0, 1, NEXT_N, H, BLOCK_SIZE, TOK, STAGES, SHUFFLED, CTX_2D, EXACT, GATHER, CLEAN,
                     num_warps)),
            (_math, (work, 1, 1, NEXT_N, H, BLOCK_SIZE, TOK, STAGES, SHUFFLED, CTX_2D, EXACT, GATHER, CLEAN, 4)),
            (_loader, (loads, BLOCK_SIZE, TOK, STAGES, GATHER))], [4, LOADER_WARPS], [MATH_REGS, LOADER_REGS])
    elif MATH_WGS == 3:
        gl.warp_specialize([
            (_math, (work, 0, 1, NEXT_N, H, BLOCK_SIZE, TOK, STAGES, SHUFFLED, CTX_2D, EXACT, GATHER, CLEAN,
                     num_warps)),
            (_math, (work, 1, 1, NEXT_N, H, BLOCK_SIZE, TOK, STAGES, SHUFFLED, CTX_2D, EXACT, GATHER, CLEAN, 4)),
            (_math, (work, 2, 1, NEXT_N, H, BLOCK_SIZE, TOK, STAGES, SHUFFLED, CTX_2D, EXACT, GATHER, CLEAN, 4)),
            (_loader, (loads, BLOCK_SIZE, TOK, STAGES, GATHER))], [4, 4, LOADER_WARPS],
            [MATH_REGS, MATH_REGS, LOADER_REGS])
    else:
        gl.warp_specialize([
            (_math, (work, 0, 1, NEXT_N, H, BLOCK_SIZE, TOK, STAGES, SHUFFLED, CTX_2D, EXACT, GATHER, CLEAN,
                     num_warps)),
            (_math, (work, 1, 1, NEXT_N, H, BLOCK_SIZE, TOK, STAGES, SHUFFLED, CTX_2D, EXACT, GATHER, CLEAN, 4)),
            (_math, (work, 2, 1, NEXT_N, H, BLOCK_SIZE, TOK, STAGES, SHUFFLED, CTX_2D, EXACT, GATHER, CLEAN, 4)),
            (_math, (work, 3, 1, NEXT_N, H, BLOCK_SIZE, TOK, STAGES, SHUFFLED, CTX_2D, EXACT, GATHER, CLEAN, 4)),
            (_loader, (loads, BLOCK_SIZE, TOK, STAGES, GATHER))], [4, 4, 4, LOADER_WARPS],
            [MATH_REGS, MATH_REGS, MATH_REGS, LOADER_REGS])


def sources(kv_cache: torch.Tensor, layout: str) -> tuple:
    """What the kernel reads the cache through: TMA descriptors (:func:`descriptors`), or for pages TMA cannot copy
    the cache itself as fp8 values and fp32 scales."""
    if gathers(kv_cache.shape[1]):
        return kv_cache.view(torch.float8_e4m3fn), kv_cache.view(torch.float32)
    return descriptors(kv_cache, layout)


def descriptors(kv_cache: torch.Tensor, layout: str) -> tuple[TensorDescriptor, TensorDescriptor]:
    """TMA descriptors over a cache's values (``min(B, 64)`` rows of one page per copy) and its scales."""
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    tok = min(block_size, CHUNK)
    page_bytes = block_size * (HEAD_DIM + 4)
    # A page's values as [block_size, 128] rows: a copy of tok rows is tok*128 contiguous bytes, which for a
    # preshuffled page (t0 a multiple of 16) is whole 16-token tiles, copied raw.
    kv_layout = gl.NVMMASharedLayout(swizzle_byte_width=0 if layout == "shuffle" else 128, element_bitwidth=8, rank=3)
    values = TensorDescriptor(kv_cache.view(torch.float8_e4m3fn), [num_blocks, block_size, HEAD_DIM],
                              [page_bytes, HEAD_DIM, 1], [1, tok, HEAD_DIM], kv_layout)
    # Scales: tok words at column block_size*32 + t0 of the page's row of words, copied into 128-byte slots. A box
    # outside the cache (an invalid block id) reads NaN, which makes its logits NaN: the math needs no block ids.
    scales = TensorDescriptor(kv_cache.view(torch.float32), [num_blocks, page_bytes // 4], [page_bytes // 4, 1],
                              [1, max(tok, 32)], gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=32),
                              padding="nan")
    return values, scales


class HopperLaunch:
    """One compiled specialisation with the cache's TMA descriptors already encoded (or, for the gather, its
    address) and the dimension arguments fixed, launched through a preset launch (:mod:`.preset_launch`): what is
    left of a call's host work is passing five addresses."""

    def __init__(self, compiled, srcs, grid, fixed, device: int):
        meta = launch_metadata(compiled)
        if meta["scratch"]:
            raise RuntimeError("the Hopper kernel needs no scratch memory")
        metas = meta["tensordesc_meta"] or [None] * len(srcs)
        # Encoded once by Triton; addresses as ints, so a launch keeps no cache alive.
        encoded = tuple(x.data_ptr() if isinstance(x, torch.Tensor) else x
                        for src, meta in zip(srcs, metas)
                        for x in ((src,) if isinstance(src, torch.Tensor) else encode_descriptor(src, meta)))
        self.launch = preset(compiled, (None, *encoded, None, None, None, None, *fixed), grid, device)
        self.device = device

    def __call__(self, q: int, weights: int, context_lens: int, block_tables: int, out: int):
        """Launch on the current stream of the launch's device, with the tensors' addresses (the caller's guard
        holds their devices and dimensions)."""
        self.launch(raw_stream(self.device), q, weights, context_lens, block_tables, out)


def specialisation(next_n: int, heads: int, block_size: int, *, layout: str, ctx_2d: bool, exact: bool,
                   config: HopperConfig, clean: bool = True) -> tuple[dict, int]:
    """The kernel's constexprs for a call of these dimensions, and its register budget a thread."""
    maxnreg = hopper_registers(config, next_n, exact)
    gather = gathers(block_size)
    constexprs = dict(NEXT_N=next_n, NP=triton.next_power_of_2(next_n), H=heads, BLOCK_SIZE=block_size,
                      TOK=CHUNK if gather else min(block_size, CHUNK), STAGES=config.stages,
                      SHUFFLED=layout == "shuffle", CTX_2D=ctx_2d, EXACT=exact, GATHER=gather, CLEAN=clean,
                      MATH_WGS=math_warpgroups(config, next_n), MATH_REGS=maxnreg, LOADER_WARPS=4 if gather else 1,
                      LOADER_REGS=config.loader_regs or hopper_loader_regs(block_size), ROW_GROUPS=config.row_groups)
    return constexprs, maxnreg


def launch_hopper(q, kv_cache, weights, context_lens, block_tables, max_model_len, out, *, layout: str,
                  exact: bool, config: HopperConfig, clean: bool = True) -> HopperLaunch:
    """Launch the kernel on checked inputs (see :func:`preshuffle.kernels.fp8_paged_mqa_logits`) through Triton's
    JIT, and return the launch that repeats it for tensors of the same dimensions, alignment and output row
    stride (``out``: fp32 or bf16, rows contiguous)."""
    batch, next_n, heads, _ = q.shape
    num_blocks, block_size = kv_cache.shape[0], kv_cache.shape[1]
    grid = (batch * config.row_groups, config.splits)
    dims = (block_tables.stride(0), block_tables.shape[1], out.stride(0), max_model_len, num_blocks)
    constexprs, maxnreg = specialisation(next_n, heads, block_size, layout=layout, ctx_2d=context_lens.dim() == 2,
                                         exact=exact, config=config, clean=clean)
    srcs = sources(kv_cache, layout)
    compiled = _hopper_kernel[grid](q, *srcs, weights, context_lens, block_tables, out, *dims, **constexprs,
                                    num_warps=4, maxnreg=maxnreg)
    return HopperLaunch(compiled, srcs, grid, (*dims, *constexprs.values(), 4), q.get_device())


def sm90a_source(next_n: int = 1, heads: int = 64, block_size: int = 64, *, layout: str = "normal",
                 ctx_2d: bool = False, exact: bool = False, config: HopperConfig | None = None, clean: bool = True,
                 bf16: bool = False):
    """What a launch of these dimensions compiles, with 16-byte aligned tensors: Gluon's source of the kernel (its
    signature, constexprs and alignment), and the launch's register budget a thread. ``clean``: the -inf fill past
    the context; ``bf16``: bf16 logits instead of fp32."""
    config = config or HopperConfig(1)
    constexprs, maxnreg = specialisation(next_n, heads, block_size, layout=layout, ctx_2d=ctx_2d, exact=exact,
                                         config=config, clean=clean)
    if gathers(block_size):
        cache_args = {"kv_src": "*fp8e4nv", "sc_src": "*fp32"}
    else:
        values, scales = descriptors(torch.empty(1, block_size, 1, HEAD_DIM + 4, dtype=torch.uint8), layout)
        cache_args = {"kv_src": f"tensordesc<fp8e4nv{values.block_shape},{values.layout!r}>",
                      "sc_src": f"tensordesc<fp32{scales.block_shape},{scales.layout!r}>"}
    signature = {"q_ptr": "*fp8e4nv", **cache_args,
                 "w_ptr": "*fp32", "ctx_ptr": "*i32", "bt_ptr": "*i32", "out_ptr": "*bf16" if bf16 else "*fp32",
                 **dict.fromkeys(("bt_stride", "bt_width", "out_stride", "max_model_len", "num_blocks"), "i32"),
                 **dict.fromkeys((*constexprs, "num_warps"), "constexpr")}
    tensors = (0, 1, 2, 3, 4, 5, 6) if gathers(block_size) else (0, 3, 4, 5, 6)
    aligned = {(i,): [["tt.divisibility", 16]] for i in tensors}  # the tensors, 16-byte aligned
    return gluon_source(_hopper_kernel, signature, {**constexprs, "num_warps": 4}, aligned), maxnreg


def compile_sm90a(next_n: int = 1, heads: int = 64, block_size: int = 64, *, layout: str = "normal",
                  ctx_2d: bool = False, exact: bool = False, config: HopperConfig | None = None, clean: bool = True,
                  bf16: bool = False):
    """Compile the kernel for sm90a without a GPU (Triton's bundled ptxas): what a launch of these dimensions
    would run, for reading its resources and SASS on any machine (:mod:`preshuffle.measure.sass`). Returns Triton's
    compiled kernel. Call it where TRITON_INTERPRET is 0: under the interpreter, Triton's own jit helpers that
    Gluon calls are interpreted functions (``benchmarks/compile_hopper.py`` sets it)."""
    from triton.backends.compiler import GPUTarget

    source, maxnreg = sm90a_source(next_n, heads, block_size, layout=layout, ctx_2d=ctx_2d, exact=exact,
                                   config=config, clean=clean, bf16=bf16)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4, maxnreg=maxnreg))


def alignment(block_size: int) -> int:
    """Bytes the cache's start must be a multiple of: TMA copies from 16-byte aligned addresses, the gather reads
    fp32 words."""
    return 4 if gathers(block_size) else 16


def launch(q, kv_cache, weights, context_lens, block_tables, max_model_len, dims, *, layout: str, precision: str,
           support, config: HopperConfig | None, out: torch.Tensor, clean: bool = True):
    """:func:`launch_hopper` on checked inputs with the launch rule's config by default, and the launch that repeats
    it where the inputs were contiguous already (a repeat takes the caller's tensors' addresses)."""
    if out.numel() == 0:
        return out, None
    exact = precision == "exact"
    inputs = (q, weights, context_lens, block_tables)
    contiguous = tuple(t.contiguous() for t in inputs)
    repeat = launch_hopper(contiguous[0], kv_cache, *contiguous[1:], max_model_len, out, layout=layout, exact=exact,
                           clean=clean, config=config or hopper_config(dims.batch, dims.next_n, exact=exact,
                                                                       block_size=dims.block_size, layout=layout))
    return out, repeat if all(a is b for a, b in zip(contiguous, inputs)) else None
