"""The logits kernel grown in steps, one idea each. Each step is a working Triton kernel, checked against the
reference; the last step is :func:`preshuffle.kernels.fp8_paged_mqa_logits`. Steps 1 and 2 are the references in
Python and PyTorch (:mod:`preshuffle.reference`); the Triton steps are numbered after them.

Step 3 scores one query row against the tokens of one natural-layout block (:func:`one_block_logits`), then
launches a grid of one such program per (sequence, block), the naive Triton kernel (next_n = 1, no split of the work
beyond blocks, the output pre-filled with -inf on the host).

Steps 4-7 follow the ladder the portable kernel climbed on the H200 (docs/kernel-design.md).
:func:`chunked_logits` is its first rungs: a program walks a run of one sequence's row in chunks (version 1),
then three switches turn on the ideas of version 2 one at a time (:data:`RUNGS`); :func:`chunked_source` prints
the kernel of each rung as Triton compiles it. The later rungs live in the portable kernel itself, step 8, which
:func:`portable_logits` runs on any device.
"""

from __future__ import annotations

import math

import torch

from .. import device  # first: sets TRITON_INTERPRET before the kernels below are decorated
from .. import source
from ..contract import check_inputs
from ..kernels import fp8_paged_mqa_logits
from ..kernels.launch import LaunchConfig, default_config, fixed_run
from ..kernels.portable import check_tiles

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


# Every relu of the steps keeps NaN, as the reference's does: a NaN in q or in a key is no score of 0. The grid and
# the later steps are checked calls, which refuse a scale that is not finite and positive; the one-block kernel
# makes its logit NaN.
_KEEP_NAN = tl.constexpr(tl.PropagateNan.ALL)


@triton.jit
def _one_block_kernel(q_ptr, block_ptr, scale_ptr, w_ptr, out_ptr,
                      H: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    heads = tl.arange(0, H)
    dims = tl.arange(0, D)
    tok = tl.arange(0, BLOCK_SIZE)
    q = tl.load(q_ptr + heads[:, None] * D + dims[None, :]).to(tl.float8e4nv, bitcast=True)
    k = tl.load(block_ptr + tok[:, None] * D + dims[None, :]).to(tl.float8e4nv, bitcast=True)
    s = tl.load(scale_ptr + (BLOCK_SIZE * D) // 4 + tok)                  # scales follow the B*D value bytes
    s = tl.where((s > 0.0) & (s < float("inf")), s, float("nan"))          # no finite wrong logit from a bad scale
    w = tl.load(w_ptr + heads)
    scores = tl.dot(q.to(tl.float16), tl.trans(k.to(tl.float16)))          # [H, BLOCK_SIZE], exact products
    scores = tl.maximum(scores * s[None, :], 0.0, propagate_nan=_KEEP_NAN) * w[:, None]
    tl.store(out_ptr + tok, tl.sum(scores, axis=0))


def _check_queries(what: str, q: torch.Tensor, heads: int, head_dim: int, name: str = "q", **tensors) -> None:
    """Refuse what the teaching kernel ``what`` cannot run: queries other than e4m3fn (their bytes are read as
    Triton's e4m3, so e4m3fnuz ones would be misread), dimensions it cannot tile, tensors off this process's kernel
    device, a GPU without Triton's e4m3 type."""
    if q.dtype != torch.float8_e4m3fn:
        raise TypeError(f"{name} must be torch.float8_e4m3fn for {what}, got {q.dtype}")
    check_tiles(heads, head_dim, what)
    device.require_kernel_devices(**{name: q}, **tensors)
    device.require_fp8_types(what)


def _tileable_block(block_size: int) -> bool:
    """Whether a block's tokens can be one tile of step 3's kernels: a ``tl.arange`` (a power of two) and a side of
    ``tl.dot`` (16 or more)."""
    return block_size >= 16 and not block_size & (block_size - 1)


def one_block_logits(q_row: torch.Tensor, block: torch.Tensor, weights_row: torch.Tensor) -> torch.Tensor:
    """Step 3, one block: ``q_row`` fp8 ``[H, D]`` against one NORMAL block ``[block_size, 1, D + 4]``
    (``kv_cache[n]``), with ``weights_row`` fp32 ``[H]``: fp32 logits ``[block_size]`` for every token of the block,
    NaN for a token whose scale is not finite and positive (one never written, in a zeroed cache)."""
    for name, t in {"q_row": q_row, "block": block, "weights_row": weights_row}.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")
    if block.dtype != torch.uint8 or weights_row.dtype != torch.float32:
        raise TypeError(f"block must be uint8 and weights_row float32, got {block.dtype} and {weights_row.dtype}")
    if q_row.dim() != 2:
        raise ValueError(f"q_row must be [heads, head_dim] (q[b, j]), got {list(q_row.shape)}")
    heads, head_dim = q_row.shape
    _check_queries("step 3's one-block kernel", q_row, heads, head_dim, name="q_row", block=block,
                   weights_row=weights_row)
    if tuple(weights_row.shape) != (heads,):
        raise ValueError(f"weights_row must be [heads] = [{heads}], got {list(weights_row.shape)}")
    if block.dim() != 3 or block.shape[1:] != (1, head_dim + 4) or not _tileable_block(block.shape[0]):
        raise ValueError(f"block must be [block_size, 1, {head_dim + 4}] with a power-of-two block_size >= 16 "
                         f"(tl.dot needs 16 rows), got {list(block.shape)}")
    block_size = block.shape[0]
    block = block.contiguous()
    out = torch.empty(block_size, dtype=torch.float32, device=block.device)
    _one_block_kernel[(1,)](q_row.contiguous().view(torch.uint8), block, block.view(torch.float32),
                            weights_row.contiguous(), out, H=heads, D=head_dim, BLOCK_SIZE=block_size)
    return out


@triton.jit
def _per_block_grid_kernel(q_ptr, kv_ptr, scale_ptr, w_ptr, ctx_ptr, bt_ptr, out_ptr, bt_stride, out_stride,
                           H: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    b = tl.program_id(0)
    j = tl.program_id(1)                        # the j-th block of sequence b
    ctx = tl.load(ctx_ptr + b)
    if j * BLOCK_SIZE < ctx:                    # blocks past the context stay -inf
        heads = tl.arange(0, H)
        dims = tl.arange(0, D)
        tok = tl.arange(0, BLOCK_SIZE)
        page = tl.load(bt_ptr + b * bt_stride + j).to(tl.int64)
        block_bytes: tl.constexpr = BLOCK_SIZE * (D + 4)
        q = tl.load(q_ptr + (b * H + heads)[:, None] * D + dims[None, :]).to(tl.float8e4nv, bitcast=True)
        k = tl.load(kv_ptr + page * block_bytes + tok[:, None] * D + dims[None, :]).to(tl.float8e4nv, bitcast=True)
        s = tl.load(scale_ptr + page * (block_bytes // 4) + (BLOCK_SIZE * D) // 4 + tok)
        w = tl.load(w_ptr + b * H + heads)
        scores = tl.dot(q.to(tl.float16), tl.trans(k.to(tl.float16)))
        logits = tl.sum(tl.maximum(scores * s[None, :], 0.0, propagate_nan=_KEEP_NAN) * w[:, None], axis=0)
        pos = j * BLOCK_SIZE + tok
        logits = tl.where(pos < ctx, logits, float("-inf"))
        tl.store(out_ptr + b.to(tl.int64) * out_stride + pos, logits)


def per_block_grid_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout="normal"):
    """Step 3, the grid: one program per (sequence, block), natural layout, next_n = 1, 1-D context lengths."""
    return _per_block_grid_launch(q, kv_cache, weights, context_lens, block_tables, max_model_len, layout=layout)()


def _per_block_grid_launch(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout="normal"):
    p = check_inputs(q, kv_cache, weights, context_lens, block_tables, max_model_len, layout)
    _check_queries("step 3's grid", q, p.heads, p.head_dim, kv_cache=kv_cache)
    if p.next_n != 1 or p.ctx_2d or not _tileable_block(p.block_size) or layout != "normal":
        raise ValueError("step 3's grid handles next_n = 1, 1-D context_lens, power-of-two block sizes >= 16 (a block "
                         f"is one tile) and the normal layout only, got next_n {p.next_n}, {context_lens.dim()}-D "
                         f"context_lens, block size {p.block_size}, layout {layout!r}")
    width = p.max_blocks * p.block_size  # the grid covers whole blocks; the row is cut to max_model_len after
    q8, w, tables = q.contiguous().view(torch.uint8), weights.contiguous(), block_tables.contiguous()

    def launch():
        out = torch.full((p.batch, max(width, max_model_len)), -math.inf, dtype=torch.float32, device=q.device)
        _per_block_grid_kernel[(p.batch, p.max_blocks)](
            q8, kv_cache, kv_cache.view(torch.float32), w, context_lens, tables, out, tables.stride(0), out.stride(0),
            H=p.heads, D=p.head_dim, BLOCK_SIZE=p.block_size)
        return out[:, :max_model_len]
    return launch


@triton.jit
def _chunk_scales(first, kv_len, b, bt_ptr, bt_stride, scale_ptr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr,
                  CHUNK: tl.constexpr):
    """fp32 scales of the CHUNK positions from ``first`` (0 past the context): a table read per position."""
    pos = first + tl.arange(0, CHUNK)
    page = tl.load(bt_ptr + b * bt_stride + pos // BLOCK_SIZE, mask=pos < kv_len, other=0).to(tl.int64)
    words_per_block: tl.constexpr = BLOCK_SIZE * (D + 4) // 4
    return tl.load(scale_ptr + page * words_per_block + (BLOCK_SIZE * D) // 4 + pos % BLOCK_SIZE,
                   mask=pos < kv_len, other=0.0)


@triton.jit
def _chunked_kernel(
    q_ptr, w_ptr, ctx_ptr,                                   # the queries, their weights, the context lengths
    kv_ptr, scale_ptr, bt_ptr, bt_stride,                    # the paged cache (bytes and fp32 view), block table
    out_ptr, out_stride, max_model_len, tokens_per_program,  # the output and each program's run of it
    NEXT_N: tl.constexpr, ROWS: tl.constexpr, H: tl.constexpr, D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, SHUFFLED: tl.constexpr, CTX_2D: tl.constexpr, CHUNK: tl.constexpr,
    KEYS_AS_A: tl.constexpr, SCALE_AFTER_SUM: tl.constexpr, SCALES_AHEAD: tl.constexpr,  # the ladder's switches
):
    b = tl.program_id(0)
    start = tl.program_id(1) * tokens_per_program             # this program's run of the row
    end = tl.minimum(start + tokens_per_program, max_model_len)

    # The queries of all next_n rows, [ROWS*H, D] transposed, and their weights: loaded once, kept in registers.
    # ROWS is next_n rounded up to a power of two; the padding rows hold zero queries and zero weights.
    cols = tl.arange(0, ROWS * H)
    dims = tl.arange(0, D)
    q_t = tl.load(q_ptr + (b * NEXT_N * H + cols)[None, :] * D + dims[:, None], mask=(cols < NEXT_N * H)[None, :],
                  other=0).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    w = tl.load(w_ptr + b * NEXT_N * H + cols, mask=cols < NEXT_N * H, other=0.0)

    # Row j sees its first visible[j] positions; the sequence reads the longest of them.
    js = tl.arange(0, ROWS)
    if CTX_2D:
        visible = tl.load(ctx_ptr + b * NEXT_N + js, mask=js < NEXT_N, other=0)
        kv_len = tl.max(visible, axis=0)
    else:
        kv_len = tl.load(ctx_ptr + b)
        visible = tl.where(js < NEXT_N, kv_len - NEXT_N + 1 + js, 0)
    rows_out = out_ptr + (b * NEXT_N + js).to(tl.int64)[None, :] * out_stride

    tok = tl.arange(0, CHUNK)
    n_read = tl.cdiv(tl.maximum(tl.minimum(end, kv_len) - start, 0), CHUNK)
    if SCALES_AHEAD:  # Triton pipelines only the loads that feed tl.dot; the scales are fetched a chunk early
        s_next = _chunk_scales(start, kv_len, b, bt_ptr, bt_stride, scale_ptr, BLOCK_SIZE, D, CHUNK)
    for i in range(n_read):
        first = start + i * CHUNK
        pos = first + tok
        page = tl.load(bt_ptr + b * bt_stride + pos // BLOCK_SIZE, mask=pos < kv_len, other=0).to(tl.int64)
        t = pos % BLOCK_SIZE
        if SHUFFLED:
            key_bytes = (t // 16) * (16 * D) + (t % 16) * 16        # the token's 16-byte run in its tile
            dim_bytes = (dims // 16) * 256 + dims % 16
        else:
            key_bytes = t * D
            dim_bytes = dims
        k = tl.load(kv_ptr + (page * (BLOCK_SIZE * (D + 4)) + key_bytes)[:, None] + dim_bytes[None, :],
                    mask=(pos < kv_len)[:, None], other=0).to(tl.float8e4nv, bitcast=True).to(tl.float16)
        if SCALES_AHEAD:
            s = s_next
            s_next = _chunk_scales(first + CHUNK, kv_len, b, bt_ptr, bt_stride, scale_ptr, BLOCK_SIZE, D, CHUNK)
        else:
            s = _chunk_scales(first, kv_len, b, bt_ptr, bt_stride, scale_ptr, BLOCK_SIZE, D, CHUNK)
        if KEYS_AS_A:  # K @ Q^T: a token per accumulator row, its heads along the row
            scores = tl.dot(k, q_t, out_dtype=tl.float32)
        else:          # Q @ K^T as in step 3 (heads down the accumulator), turned so the rest is shared
            scores = tl.trans(tl.dot(tl.trans(q_t), tl.trans(k), out_dtype=tl.float32))
        if SCALE_AFTER_SUM:  # s > 0, so relu(s x) = s relu(x): one multiply per token, not one per head
            logits = tl.sum(tl.reshape(tl.maximum(scores, 0.0, propagate_nan=_KEEP_NAN) * w[None, :], (CHUNK, ROWS, H)),
                            axis=2) * s[:, None]
        else:
            logits = tl.sum(tl.reshape(tl.maximum(scores * s[:, None], 0.0, propagate_nan=_KEEP_NAN) * w[None, :],
                                       (CHUNK, ROWS, H)), axis=2)
        logits = tl.where(pos[:, None] < visible[None, :], logits, float("-inf"))
        tl.store(rows_out + pos[:, None], logits, mask=(js < NEXT_N)[None, :] & (pos < end)[:, None])

    # Past the context: -inf, without reading the cache.
    for tail in range(start + n_read * CHUNK, end, CHUNK):
        pos = tail + tok
        tl.store(rows_out + pos[:, None], tl.full((CHUNK, ROWS), float("-inf"), tl.float32),
                 mask=(js < NEXT_N)[None, :] & (pos < end)[:, None])


# Steps 4-7: the switches of chunked_logits turned on one at a time, in the order the ladder climbed, under the
# names the benchmark gives their rows.
RUNGS = {
    "a program walks its row in chunks": {},
    "keys as the MMA's A operand": {"keys_as_a": True},
    "the scale after the head sum": {"keys_as_a": True, "scale_after_sum": True},
    "scales a chunk ahead": {"keys_as_a": True, "scale_after_sum": True, "scales_ahead": True},
}
_SWITCHES = {"keys_as_a": "KEYS_AS_A", "scale_after_sum": "SCALE_AFTER_SUM", "scales_ahead": "SCALES_AHEAD"}


def chunked_source(*, keys_as_a=False, scale_after_sum=False, scales_ahead=False) -> str:
    """The kernel of steps 4-7 with its switches fixed, as Triton compiles it (:func:`preshuffle.source.specialize`):
    the kernel a call of :func:`chunked_logits` with these switches runs, without the branches it does not take."""
    values = {"keys_as_a": keys_as_a, "scale_after_sum": scale_after_sum, "scales_ahead": scales_ahead}
    return source.specialize(_chunked_kernel, **{_SWITCHES[name]: value for name, value in values.items()})


def chunked_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout="normal",
                   config: LaunchConfig | None = None, keys_as_a=False, scale_after_sum=False, scales_ahead=False):
    """Steps 4-7: one program per (sequence, run of ``config.tokens_per_program`` positions), walking its run in
    chunks of ``config.chunk`` with all next_n query rows in one tile; any block size, either layout, 1-D or 2-D
    context lengths. With every switch off it computes ``Q @ K^T`` and scales before the head reduction
    (the ladder's version 1); ``keys_as_a``, ``scale_after_sum`` and ``scales_ahead`` are version 2's ideas."""
    return _chunked_launch(q, kv_cache, weights, context_lens, block_tables, max_model_len, layout=layout,
                           config=config, keys_as_a=keys_as_a, scale_after_sum=scale_after_sum,
                           scales_ahead=scales_ahead)()


def _chunked_launch(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout="normal",
                    config: LaunchConfig | None = None, keys_as_a=False, scale_after_sum=False, scales_ahead=False):
    p = check_inputs(q, kv_cache, weights, context_lens, block_tables, max_model_len, layout)
    _check_queries("the teaching kernel", q, p.heads, p.head_dim, kv_cache=kv_cache)
    for name, value in (("keys_as_a", keys_as_a), ("scale_after_sum", scale_after_sum), ("scales_ahead", scales_ahead)):
        if not isinstance(value, bool):  # a constexpr: "no" would switch the idea on
            raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    config = config or default_config(p.batch)
    if config.dot != "fp16":
        raise ValueError(f"config.dot must be 'fp16' for the teaching kernel, got {config.dot!r}")
    run = config.tokens_per_program or fixed_run(max_model_len, config.splits or 1, config.chunk)
    q8, w, lens, tables = (q.contiguous().view(torch.uint8), weights.contiguous(), context_lens.contiguous(),
                           block_tables.contiguous())

    def launch():
        # NaN, not empty: an element the kernel failed to write cannot pass for a logit.
        out = torch.full((p.batch * p.next_n, max_model_len), math.nan, dtype=torch.float32, device=q.device)
        if out.numel() == 0:
            return out
        _chunked_kernel[(p.batch, triton.cdiv(max_model_len, run))](
            q8, w, lens, kv_cache, kv_cache.view(torch.float32), tables, tables.stride(0),
            out, out.stride(0), max_model_len, run,
            NEXT_N=p.next_n, ROWS=triton.next_power_of_2(p.next_n), H=p.heads, D=p.head_dim,
            BLOCK_SIZE=p.block_size, SHUFFLED=layout == "shuffle", CTX_2D=p.ctx_2d, CHUNK=config.chunk,
            KEYS_AS_A=keys_as_a, SCALE_AFTER_SUM=scale_after_sum, SCALES_AHEAD=scales_ahead,
            num_warps=config.num_warps, num_stages=config.num_stages)
        return out
    return launch


def checked_launch(step, q, kv_cache, weights, context_lens, block_tables, max_model_len, **options):
    """Step 3's grid or steps 4-7's call (``step``: :func:`per_block_grid_logits` or :func:`chunked_logits`) on inputs
    checked once, values included, as a function of no arguments that launches the kernel again: what a CUDA graph
    captures to time a step, with no host sync inside. The inputs must not change after the check."""
    launches = {per_block_grid_logits: _per_block_grid_launch, chunked_logits: _chunked_launch}
    if step not in launches:
        raise ValueError(f"step must be per_block_grid_logits or chunked_logits, got {step!r}")
    return launches[step](q, kv_cache, weights, context_lens, block_tables, max_model_len, **options)


def portable_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout="normal",
                    config: LaunchConfig | None = None):
    """Step 8: the package's portable kernel (kernels/portable.py) with exact products, on any device, with
    ``config`` or its launch rule. (On an sm90 GPU the entry point would otherwise run the Hopper kernel.)"""
    dims = check_inputs(q, kv_cache, weights, context_lens, block_tables, max_model_len, layout)
    config = config or default_config(dims.batch)
    # The values are checked above: the entry point need not read them on the host again.
    return fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, layout=layout,
                                precision="exact", config=config, check_values=False)
