"""FP8 paged MQA logits in Triton: one kernel, specialised at compile time into the three variants vLLM
chooses between.

* kernel block size 1: every token has its own block-table entry and its 128 values start at a 132-byte
  stride, so a program gathers CHUNK scattered rows with 4-byte-aligned loads;
* natural-layout blocks (``BLOCK_SIZE`` >= 2): one table entry serves a contiguous run of ``BLOCK_SIZE*128``
  bytes whose base is 16-byte aligned when ``BLOCK_SIZE % 4 == 0``, so loads are 16 bytes wide;
* preshuffled blocks (multiples of 16): the same bytes in 16x16 tiles; one token's 16 dims of a tile are
  still 16 contiguous bytes, so the loads keep their width.

Each program owns one sequence and a share of its output row (:func:`program_share`): one of ``splits`` even
shares of the chunks that hold the sequence's context, cut from the length the program reads, or a fixed run of
``tokens_per_program`` positions. It keeps the sequence's queries ``[next_n*H, D]`` and weights in registers, then
for each CHUNK of positions loads the fp8 keys and their scales, computes ``relu(s * q.k)`` with one ``tl.dot``,
reduces over heads with the weights, and stores the logits (-inf outside each row's visible prefix). Positions past
the context are filled with -inf without touching the cache, each program filling its share, so the output is fully
defined up to ``max_model_len``; unless ``CLEAN`` is off (DeepGEMM's ``clean_logits=False``): then no program writes
past the chunks that hold its rows' context, and what a row may not see is left unspecified. A bf16 output gets each fp32 logit rounded to nearest
even.
Where Triton has no e4m3 type (sm80-sm86) the exact path decodes the bytes to fp16 with integer instructions
(``DOT`` "fp16-decode"), the same values Triton's conversion gives elsewhere.

No input makes the kernel read outside its tensors, checked or not. A row of the block table is read only up to
its width, and a block id outside ``[0, num_blocks)`` is never followed: where a row may see a position whose
block id is out of range, or whose table entry does not exist (context longer than the table), the logit is NaN
(a NaN cannot pass for a masked score); positions past a row's visible prefix stay -inf. Inputs that pass the
host's value checks have no such positions (:func:`preshuffle.contract.unreadable_positions`). A scale that is not
finite and positive gives NaN at its position too (:func:`preshuffle.contract.bad_scale_positions`), and a NaN in q
or in a key's values gives NaN wherever it enters (docs/input-contract.md).
"""

from __future__ import annotations

import dataclasses

import torch

from .. import device  # first: sets TRITON_INTERPRET before the kernel below is decorated
from ..contract import CallDims
from .launch import LaunchConfig, default_config, dot_precision

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

device.keep_e4m3_nan_in_the_interpreter()


@triton.jit
def _e4m3_over_256(x):
    """fp8 e4m3 bytes (the ``fn`` variant: no infinities, S.1111.111 is NaN) as fp16 values 256 times smaller,
    exactly, with two masks, two shifts, an or and a NaN select: for GPUs on which Triton has no e4m3 type
    (sm80-sm86). The byte's sign goes to bit 15 and its other seven bits up by seven, into fp16's exponent and
    mantissa: fp16's exponent bias is 8 more than e4m3's, so the result is the value times 2**-8, normal and
    subnormal alike."""
    x = x.to(tl.int16)
    v = (((x & 0x80) << 8) | ((x & 0x7F) << 7)).to(tl.float16, bitcast=True)
    return tl.where((x & 0x7F) == 0x7F, float("nan"), v)


@triton.jit
def _round_to_bf16(x):
    """fp32 to bf16, rounded to nearest even, with integer instructions: Triton's interpreter truncates where a GPU's
    conversion rounds, and the kernel must give the same bits in both. Adding 0x7FFF plus the lowest kept bit carries
    into the kept bits exactly when the dropped half is above half an ulp, or at half with the kept bits odd; NaN
    stays NaN (the carry could turn a NaN with a small payload into an infinity)."""
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(x != x, 0x7FC0, rounded)
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def _as_output(ptrs, logits):
    """``logits`` in the element type of the output ``ptrs`` point into (fp32, or bf16)."""
    if ptrs.dtype.element_ty == tl.bfloat16:
        return _round_to_bf16(logits)
    else:
        return logits


@triton.jit
def _chunk_tokens(first, BLOCK_SIZE: tl.constexpr, CHUNK: tl.constexpr):
    """(index into the block table, token inside its block) of each position of the chunk starting at
    ``first``, a multiple of CHUNK. When one of CHUNK and BLOCK_SIZE divides the other, both come from the
    chunk's start plus a pattern of ``arange`` the compiler hoists out of the loop: no division per element."""
    tok = tl.arange(0, CHUNK)
    if BLOCK_SIZE % CHUNK == 0:  # the chunk lies inside one block
        return tl.zeros_like(tok) + first // BLOCK_SIZE, first % BLOCK_SIZE + tok
    if CHUNK % BLOCK_SIZE == 0:  # the chunk is whole blocks
        return first // BLOCK_SIZE + tok // BLOCK_SIZE, tok % BLOCK_SIZE
    pos = first + tok
    return pos // BLOCK_SIZE, pos % BLOCK_SIZE


@triton.jit
def _block_ids(first, index, read_len, b, bt_ptr, bt_stride, num_blocks, BLOCK_SIZE: tl.constexpr,
               CHUNK: tl.constexpr, MASKED: tl.constexpr = True):
    """(block id to address, whether it is a real block) for each position of the chunk; ``index`` from
    _chunk_tokens. Positions from ``read_len`` on (the context, cut to what the table row holds) read no table
    entry and are not real. Ids outside ``[0, num_blocks)`` are clamped into the cache, so that even unmasked
    loads stay inside it, and flagged. When the chunk lies in one block, one scalar table read serves it.
    ``MASKED=False`` when the whole chunk is inside ``read_len``."""
    pos = first + tl.arange(0, CHUNK)
    if BLOCK_SIZE % CHUNK == 0:
        page = tl.load(bt_ptr + b * bt_stride + first // BLOCK_SIZE, mask=first < read_len, other=0)
        pages = tl.zeros_like(pos).to(tl.int64) + page
    elif MASKED:
        pages = tl.load(bt_ptr + b * bt_stride + index, mask=pos < read_len, other=0).to(tl.int64)
    else:
        pages = tl.load(bt_ptr + b * bt_stride + index).to(tl.int64)
    real = (pages >= 0) & (pages < num_blocks)
    if MASKED:
        real = real & (pos < read_len)
    return tl.minimum(tl.maximum(pages, 0), num_blocks - 1), real


@triton.jit
def _load_scales(first, read_len, b, bt_ptr, bt_stride, num_blocks, scale_ptr, BLOCK_SIZE: tl.constexpr,
                 D: tl.constexpr, CHUNK: tl.constexpr):
    """fp32 scales of the chunk starting at ``first``, through the cache viewed as fp32: token t's scale is word t
    after its block's B*D value bytes. NaN where the scale is not finite and positive, or where no real block."""
    index, t = _chunk_tokens(first, BLOCK_SIZE, CHUNK)
    page, real = _block_ids(first, index, read_len, b, bt_ptr, bt_stride, num_blocks, BLOCK_SIZE, CHUNK)
    words_per_block: tl.constexpr = BLOCK_SIZE * (D + 4) // 4
    s = tl.load(scale_ptr + page * words_per_block + (BLOCK_SIZE * D) // 4 + t, mask=real, other=0.0)
    # The scale leaves the relu (_score_chunk), which is right for s > 0 only: any other scale makes its logits NaN.
    return tl.where((s > 0.0) & (s < float("inf")), s, float("nan"))


@triton.jit
def _load_keys(first, read_len, b, bt_ptr, bt_stride, num_blocks, kv_ptr, dim_offsets, BLOCK_SIZE: tl.constexpr,
               D: tl.constexpr, CHUNK: tl.constexpr, SHUFFLED: tl.constexpr, MASKED: tl.constexpr,
               DOT: tl.constexpr):
    """Keys ``[CHUNK, D]`` of the chunk starting at ``first``, in natural order (0 where no real block), as fp8, or
    (``DOT`` "fp16-decode") decoded to fp16 256 times smaller, and which positions have a real block."""
    index, t = _chunk_tokens(first, BLOCK_SIZE, CHUNK)
    page, real = _block_ids(first, index, read_len, b, bt_ptr, bt_stride, num_blocks, BLOCK_SIZE, CHUNK, MASKED)
    if BLOCK_SIZE % CHUNK == 0:
        # t = t0 + arange with t0 a multiple of CHUNK (so of 16): split off t0 to keep the rest loop-invariant.
        t0 = first % BLOCK_SIZE
        t = tl.arange(0, CHUNK)
    else:
        t0 = 0
    if SHUFFLED:
        token_offsets = t0 * D + (t // 16) * (16 * D) + (t % 16) * 16
    else:
        token_offsets = t0 * D + t * D
    rows = page * (BLOCK_SIZE * (D + 4)) + token_offsets
    if BLOCK_SIZE % 4 == 0:  # then every token's 16-dim run starts 16-byte aligned
        rows = tl.multiple_of(rows, 16)
    if MASKED:
        k = tl.load(kv_ptr + rows[:, None] + dim_offsets[None, :], mask=real[:, None], other=0)
    else:  # the ids are clamped into the cache: an unmasked load stays inside it
        k = tl.load(kv_ptr + rows[:, None] + dim_offsets[None, :])
    if DOT == "fp16-decode":
        k = _e4m3_over_256(k)
    else:
        k = k.to(tl.float8e4nv, bitcast=True)
    return k, real


@triton.jit
def _score_chunk(first, s, q_t, w, visible, read_len, end, b, bt_ptr, bt_stride, num_blocks, kv_ptr, dim_offsets,
                 out_rows, row_mask, H: tl.constexpr, D: tl.constexpr, NEXT_N_PAD: tl.constexpr,
                 BLOCK_SIZE: tl.constexpr, SHUFFLED: tl.constexpr, CHUNK: tl.constexpr, DOT: tl.constexpr,
                 MASKED: tl.constexpr):
    """Logits of the chunk of positions starting at ``first``, stored: NaN where no real block. ``MASKED=False``
    for a chunk every row sees in full and the table covers: no masks on its loads, no -inf select, no bound on
    its store."""
    pos = first + tl.arange(0, CHUNK)
    k, real = _load_keys(first, read_len, b, bt_ptr, bt_stride, num_blocks, kv_ptr, dim_offsets, BLOCK_SIZE, D, CHUNK,
                         SHUFFLED, MASKED, DOT)
    if DOT == "fp16-decode":  # keys decoded 256 times smaller: a power of two changes no rounding
        scores = tl.dot(k, q_t, out_dtype=tl.float32) * 256.0
    elif DOT == "fp16":  # fp8 values are exact in fp16, and fp16 products exact in fp32
        scores = tl.dot(k.to(tl.float16), q_t, out_dtype=tl.float32)
    else:
        scores = tl.dot(k, q_t, out_dtype=tl.float32)                           # [CHUNK, NEXT_N_PAD*H]
    # s > 0, so relu(s * x) = s * relu(x): apply the scale once per token, after the head reduction. The relu keeps
    # NaN (a NaN in q or in a key is no score of 0).
    scores = tl.maximum(scores, 0.0, propagate_nan=tl.PropagateNan.ALL) * w[None, :]
    logits = tl.sum(tl.reshape(scores, (CHUNK, NEXT_N_PAD, H)), axis=2) * s[:, None]  # [CHUNK, NEXT_N_PAD]
    logits = tl.where(real[:, None], logits, float("nan"))
    ptrs = out_rows + pos[:, None]
    if MASKED:
        logits = tl.where(pos[:, None] < visible[None, :], logits, float("-inf"))
        tl.store(ptrs, _as_output(ptrs, logits), mask=row_mask & (pos < end)[:, None])
    else:
        tl.store(ptrs, _as_output(ptrs, logits), mask=row_mask)


@triton.jit
def _score_chunks(lo, hi, s_next, start, q_t, w, visible, read_len, end, b, bt_ptr, bt_stride, num_blocks, kv_ptr,
                  scale_ptr, dim_offsets, out_rows, row_mask, H: tl.constexpr, D: tl.constexpr,
                  NEXT_N_PAD: tl.constexpr, BLOCK_SIZE: tl.constexpr, SHUFFLED: tl.constexpr, CHUNK: tl.constexpr,
                  DOT: tl.constexpr, MASKED: tl.constexpr):
    """Chunks ``lo .. hi-1`` of the program's run, each chunk's scales fetched one chunk ahead (``s_next`` holds
    chunk ``lo``'s); returns the scales of chunk ``hi``."""
    for i in range(lo, hi):
        first = start + i * CHUNK
        s = s_next
        s_next = _load_scales(first + CHUNK, read_len, b, bt_ptr, bt_stride, num_blocks, scale_ptr, BLOCK_SIZE, D,
                              CHUNK)
        _score_chunk(first, s, q_t, w, visible, read_len, end, b, bt_ptr, bt_stride, num_blocks, kv_ptr, dim_offsets,
                     out_rows, row_mask, H, D, NEXT_N_PAD, BLOCK_SIZE, SHUFFLED, CHUNK, DOT, MASKED)
    return s_next


@triton.jit
def program_share(kv_len, max_model_len, run, CHUNK: tl.constexpr):
    """This program's share of a row whose sequence reads ``kv_len`` positions: where its chunks start, where its
    reading ends, and the part of the row past the context it fills with -inf (``fill_start``, ``fill_end``).
    ``run`` > 0: a fixed run of that many positions, the ``program_id(1)``-th of the row. Else one of the row's
    ``num_programs(1)`` even shares of the chunks that hold the context, and as many of the chunks past them. Shares
    of different programs never overlap, and together they cover the row up to ``max_model_len``."""
    split, splits = tl.program_id(1), tl.num_programs(1)
    n_chunks = tl.cdiv(tl.maximum(tl.minimum(kv_len, max_model_len), 0), CHUNK)
    if run > 0:
        start = split * run
        run_end = tl.minimum(start + run, max_model_len)
        read_end = tl.minimum(run_end, kv_len)
        fill_start = tl.maximum(start, n_chunks * CHUNK)
        fill_end = run_end
    else:
        per = tl.cdiv(n_chunks, splits)
        start = split * per * CHUNK
        read_end = tl.minimum(tl.minimum(start + per * CHUNK, kv_len), max_model_len)
        tail = n_chunks * CHUNK
        tail_per = tl.cdiv(tl.cdiv(tl.maximum(max_model_len - tail, 0), CHUNK), splits)
        fill_start = tail + split * tail_per * CHUNK
        fill_end = tl.minimum(fill_start + tail_per * CHUNK, max_model_len)
    return start, read_end, fill_start, fill_end


@triton.jit
def _paged_mqa_logits_kernel(
    q_ptr, kv_ptr, scale_ptr, w_ptr, ctx_ptr, bt_ptr, out_ptr,
    bt_stride, table_tokens, num_blocks, out_stride, max_model_len, run,
    NEXT_N: tl.constexpr, NEXT_N_PAD: tl.constexpr, H: tl.constexpr, D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, SHUFFLED: tl.constexpr, CTX_2D: tl.constexpr, CHUNK: tl.constexpr,
    DOT: tl.constexpr, CLEAN: tl.constexpr,
):
    b = tl.program_id(0)

    # Queries transposed, [D, NEXT_N_PAD*H]: column c = j*H + h. Keys are the dot's left operand, so the
    # head reduction runs along the accumulator's columns, inside a warp. Padding columns (j >= NEXT_N)
    # hold zero queries and zero weights.
    cols = tl.arange(0, NEXT_N_PAD * H)
    col_ok = cols < NEXT_N * H
    dims = tl.arange(0, D)
    q_cols = b * NEXT_N * H + cols
    q_t = tl.load(q_ptr + q_cols[None, :] * D + dims[:, None], mask=col_ok[None, :], other=0)
    if DOT == "fp16-decode":
        q_t = _e4m3_over_256(q_t) * 256.0
    else:
        q_t = q_t.to(tl.float8e4nv, bitcast=True)
        if DOT == "fp16":
            q_t = q_t.to(tl.float16)
    w = tl.load(w_ptr + q_cols, mask=col_ok, other=0.0)

    # How many leading positions each row j may see, and how many the sequence reads at all.
    js = tl.arange(0, NEXT_N_PAD)
    if CTX_2D:
        visible = tl.load(ctx_ptr + b * NEXT_N + js, mask=js < NEXT_N, other=0)
        kv_len = tl.load(ctx_ptr + b * NEXT_N)
        for jj in tl.static_range(1, NEXT_N):
            kv_len = tl.maximum(kv_len, tl.load(ctx_ptr + b * NEXT_N + jj))
    else:
        kv_len = tl.load(ctx_ptr + b)
        visible = kv_len - NEXT_N + js + 1
    visible = tl.where(js < NEXT_N, visible, 0)
    start, read_end, fill_start, fill_end = program_share(kv_len, max_model_len, run, CHUNK)
    end = max_model_len  # a share's chunks end inside its row; only the row's last chunk reaches past its end
    out_rows = out_ptr + (b * NEXT_N + js).to(tl.int64)[None, :] * out_stride
    row_mask = (js < NEXT_N)[None, :]

    if SHUFFLED:
        dim_offsets = tl.max_contiguous(tl.multiple_of((dims // 16) * 256 + dims % 16, 16), 16)
    else:
        dim_offsets = dims
    tok = tl.arange(0, CHUNK)
    n_read = tl.cdiv(tl.maximum(read_end - start, 0), CHUNK)
    # Positions with a block-table entry: with unchecked inputs the context may run past the table row.
    read_len = tl.minimum(kv_len, table_tokens)
    # Chunks that every row sees in full need no masks; only the last few of a sequence do. With several
    # query rows the second copy of the loop costs more registers than the masks (fewer CTAs per SM).
    if NEXT_N == 1:
        n_full = tl.maximum(tl.minimum(read_end, read_len) - start, 0) // CHUNK
    else:
        n_full = 0
    # Triton software-pipelines the loads that feed the dot (num_stages) but leaves the scales alone, so they
    # are fetched one chunk ahead by hand.
    s_next = _load_scales(start, read_len, b, bt_ptr, bt_stride, num_blocks, scale_ptr, BLOCK_SIZE, D, CHUNK)
    s_next = _score_chunks(0, n_full, s_next, start, q_t, w, visible, read_len, end, b, bt_ptr, bt_stride, num_blocks,
                           kv_ptr, scale_ptr, dim_offsets, out_rows, row_mask, H, D, NEXT_N_PAD, BLOCK_SIZE,
                           SHUFFLED, CHUNK, DOT, MASKED=False)
    _score_chunks(n_full, n_read, s_next, start, q_t, w, visible, read_len, end, b, bt_ptr, bt_stride, num_blocks,
                  kv_ptr, scale_ptr, dim_offsets, out_rows, row_mask, H, D, NEXT_N_PAD, BLOCK_SIZE, SHUFFLED, CHUNK,
                  DOT, MASKED=True)

    if CLEAN:
        neg_inf = _as_output(out_rows, tl.full((CHUNK, NEXT_N_PAD), float("-inf"), tl.float32))
        for tail in range(fill_start, fill_end, CHUNK):
            pos = tail + tok
            tl.store(out_rows + pos[:, None], neg_inf, mask=row_mask & (pos < fill_end)[:, None])


def check_tiles(heads: int, head_dim: int, what: str) -> None:
    """Refuse query dimensions ``what`` (a Triton kernel) cannot tile: both are sizes of ``tl.arange`` (powers of
    two) and of ``tl.dot`` (16 or more)."""
    if heads < 16 or heads & (heads - 1) or head_dim < 16 or head_dim & (head_dim - 1):
        raise ValueError(f"{what} needs a power-of-two number of heads >= 16 and a power-of-two head_dim >= 16 "
                         f"(tl.dot's tiles), got {heads} heads of {head_dim}")


def portable_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, dims: CallDims, *,
                              layout: str, config: LaunchConfig, out: torch.Tensor, clean: bool = True):
    """Launch the portable kernel on inputs :func:`preshuffle.kernels.fp8_paged_mqa_logits` checked (``dims``:
    shapes and values; ``q`` e4m3, tensors on the kernels' device; ``out`` the checked output tensor, fp32 or bf16,
    its rows contiguous; ``clean``: write -inf past each row's context too)."""
    check_tiles(dims.heads, dims.head_dim, "the Triton kernel")
    run = config.tokens_per_program or 0
    splits = triton.cdiv(max_model_len, run) if run else config.splits or 1
    block_tables = block_tables.contiguous()
    if out.numel() == 0:
        return out
    grid = (dims.batch, splits)
    _paged_mqa_logits_kernel[grid](
        q.contiguous().view(torch.uint8), kv_cache, kv_cache.view(torch.float32), weights.contiguous(),
        context_lens.contiguous(), block_tables, out,
        block_tables.stride(0), dims.max_blocks * dims.block_size, dims.num_blocks, out.stride(0), max_model_len,
        run,
        NEXT_N=dims.next_n, NEXT_N_PAD=triton.next_power_of_2(dims.next_n), H=dims.heads, D=dims.head_dim,
        BLOCK_SIZE=dims.block_size, SHUFFLED=layout == "shuffle", CTX_2D=dims.ctx_2d, CHUNK=config.chunk,
        DOT=config.dot, CLEAN=clean, num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out


# The MMA for each precision: fp8 values widened to fp16 (exact products, fp32 sums), or fp8. A LaunchConfig may ask
# for fp16 on decoded values, the exact path a GPU without Triton's e4m3 type takes.
_DOT = {"exact": "fp16", "fp8": "fp8"}


def alignment(block_size: int) -> int:
    """Bytes the cache's start must be a multiple of: the kernel reads the scales as fp32 words."""
    return 4


def launch(q, kv_cache, weights, context_lens, block_tables, max_model_len, dims: CallDims, *, layout: str,
           precision: str, support, config: LaunchConfig | None, out: torch.Tensor, clean: bool = True):
    """:func:`portable_paged_mqa_logits` with ``config``'s MMA set for ``precision`` on ``support``'s device (the
    launch rule's config by default); it keeps no launch to repeat."""
    config = config or default_config(dims.batch)
    if precision == "exact" and not support.fp8_types:
        dot = "fp16-decode"
    else:
        dot = config.dot if dot_precision(config.dot) == precision else _DOT[precision]
    config = dataclasses.replace(config, dot=dot)
    return portable_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, dims,
                                     layout=layout, config=config, out=out, clean=clean), None
