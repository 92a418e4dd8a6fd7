"""The kernel grown in steps, for the workbook's kernel chapter. Each step is a working Triton kernel checked
against the reference there; the last step is :func:`preshuffle.kernels.fp8_paged_mqa_logits`.

Step 1 scores one query row against the tokens of one natural-layout block. Step 2 launches a grid of one
program per (sequence, block), which is the spec's "naive Triton" kernel (next_n = 1, no split of the work
beyond blocks, the output pre-filled with -inf on the host).
"""

from __future__ import annotations

import math

import torch

from .. import device  # noqa: F401  (sets TRITON_INTERPRET before the kernels below are decorated)
from ..contract import check_inputs

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _one_block_kernel(q_ptr, block_ptr, scale_ptr, w_ptr, out_ptr,
                      H: tl.constexpr, D: tl.constexpr, BLOCK_SIZE: tl.constexpr):
    heads = tl.arange(0, H)
    dims = tl.arange(0, D)
    tok = tl.arange(0, BLOCK_SIZE)
    q = tl.load(q_ptr + heads[:, None] * D + dims[None, :]).to(tl.float8e4nv, bitcast=True)
    k = tl.load(block_ptr + tok[:, None] * D + dims[None, :]).to(tl.float8e4nv, bitcast=True)
    s = tl.load(scale_ptr + (BLOCK_SIZE * D) // 4 + tok)                  # scales follow the B*D value bytes
    w = tl.load(w_ptr + heads)
    scores = tl.dot(q.to(tl.float16), tl.trans(k.to(tl.float16)))          # [H, BLOCK_SIZE], exact products
    scores = tl.maximum(scores * s[None, :], 0.0) * w[:, None]
    tl.store(out_ptr + tok, tl.sum(scores, axis=0))


def one_block_logits(q_row: torch.Tensor, block: torch.Tensor, weights_row: torch.Tensor) -> torch.Tensor:
    """Step 1: ``q_row`` fp8 ``[H, D]`` against one NORMAL block ``[block_size, 1, D + 4]`` (``kv_cache[n]``), with
    ``weights_row`` fp32 ``[H]``: fp32 logits ``[block_size]`` for every token of the block."""
    heads, head_dim = q_row.shape
    block_size = block.shape[0]
    if q_row.dtype != torch.float8_e4m3fn or block.dtype != torch.uint8 or weights_row.dtype != torch.float32:
        raise TypeError("q_row must be float8_e4m3fn, block uint8 and weights_row float32")
    if block_size < 16 or block_size & (block_size - 1) or block.shape[-1] != head_dim + 4:
        raise ValueError(f"block must be [block_size, 1, {head_dim + 4}] with a power-of-two block_size >= 16 "
                         f"(tl.dot needs 16 rows), got {list(block.shape)}")
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
        logits = tl.sum(tl.maximum(scores * s[None, :], 0.0) * w[:, None], axis=0)
        pos = j * BLOCK_SIZE + tok
        logits = tl.where(pos < ctx, logits, float("-inf"))
        tl.store(out_ptr + b.to(tl.int64) * out_stride + pos, logits)


def per_block_grid_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout="normal"):
    """Step 2: one program per (sequence, block), natural layout, next_n = 1, 1-D context lengths."""
    p = check_inputs(q, kv_cache, weights, context_lens, block_tables, max_model_len, layout)
    if p.next_n != 1 or p.ctx_2d or p.block_size < 16 or layout != "normal":
        raise ValueError("step 2 handles next_n = 1, 1-D context_lens, block sizes >= 16 and the normal layout "
                         f"only, got next_n {p.next_n}, {context_lens.dim()}-D context_lens, block size "
                         f"{p.block_size}, layout {layout!r}")
    width = p.max_blocks * p.block_size  # the grid covers whole blocks; the row is cut to max_model_len after
    out = torch.full((p.batch, max(width, max_model_len)), -math.inf, dtype=torch.float32, device=q.device)
    _per_block_grid_kernel[(p.batch, p.max_blocks)](
        q.contiguous().view(torch.uint8), kv_cache, kv_cache.view(torch.float32), weights.contiguous(),
        context_lens, block_tables.contiguous(), out, block_tables.stride(0), out.stride(0),
        H=p.heads, D=p.head_dim, BLOCK_SIZE=p.block_size)
    return out[:, :max_model_len]
