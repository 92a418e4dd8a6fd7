"""The first step towards the Hopper kernel, in plain Triton (``tl``): the cache read through a TMA tensor descriptor,
fp8 ``tl.dot`` on the tiles, Triton's own software pipeline. Kernel block size 64, natural layout, next_n a power of
two: enough to measure what TMA alone buys before the Gluon kernel (:mod:`.hopper`) adds a loader warp, an explicit
mbarrier ring and every block size. Compiled only: the benchmark times it on a GPU.

A 64-token block is exactly 66 rows of 128 bytes (64 rows of values, then 2 rows of scales), so the cache viewed
as a 2-D fp8 tensor ``[num_blocks * 66, 128]`` holds page p's values at rows ``66p .. 66p + 63``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from ..kernels.launch import CHUNK


@triton.jit
def _tl_tma_kernel(q_desc, kv_desc, scale_ptr, w_ptr, ctx_ptr, bt_ptr, out_ptr, bt_stride, out_stride,
                   max_model_len, tokens_per_program, NEXT_N: tl.constexpr, H: tl.constexpr, STAGES: tl.constexpr):
    CHUNK_: tl.constexpr = 64
    b = tl.program_id(0)
    start = tl.program_id(1) * tokens_per_program
    end = tl.minimum(start + tokens_per_program, max_model_len)
    kv_len = tl.load(ctx_ptr + b)
    n_read = tl.cdiv(tl.maximum(tl.minimum(end, kv_len) - start, 0), CHUNK_)
    q = q_desc.load([b * NEXT_N * H, 0])                                   # [NEXT_N*H, 128]
    w = tl.load(w_ptr + b * NEXT_N * H + tl.arange(0, NEXT_N * H))
    tok = tl.arange(0, CHUNK_)
    js = tl.arange(0, NEXT_N)
    visible = kv_len - NEXT_N + js + 1
    rows = out_ptr + (b * NEXT_N + js).to(tl.int64)[None, :] * out_stride
    for i in tl.range(0, n_read, num_stages=STAGES):
        first = start + i * CHUNK_
        page = tl.load(bt_ptr + b * bt_stride + first // CHUNK_)
        k = kv_desc.load([page * 66, 0])
        s = tl.load(scale_ptr + page * 2112 + 2048 + tok)                  # word 2048 of the page's 2112
        scores = tl.maximum(tl.dot(k, tl.trans(q)), 0.0) * w[None, :]     # fp8 MMA, [64, NEXT_N*H]
        logits = tl.sum(tl.reshape(scores, (CHUNK_, NEXT_N, H)), axis=2) * s[:, None]
        pos = first + tok
        logits = tl.where(pos[:, None] < visible[None, :], logits, float("-inf"))
        tl.store(rows + pos[:, None], logits, mask=(pos < end)[:, None])
    for first in range(start + n_read * CHUNK_, end, CHUNK_):
        pos = first + tok
        tl.store(rows + pos[:, None], tl.full((CHUNK_, NEXT_N), float("-inf"), tl.float32), mask=(pos < end)[:, None])


def tl_tma_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout: str = "normal",
                  tokens_per_program: int, stages: int = 6) -> torch.Tensor:
    """The step's logits for a checked, block-64, natural-layout problem with 1-D context lengths (the benchmark's
    inputs); ``tokens_per_program`` positions per program."""
    batch, next_n, heads, head_dim = q.shape
    if (layout != "normal" or kv_cache.shape[1] != CHUNK or head_dim != 128 or next_n & (next_n - 1)
            or context_lens.dim() != 1):
        raise ValueError("the tl TMA step takes natural 64-token blocks, head_dim 128, next_n a power of two and "
                         f"1-D context_lens, got {layout} blocks of {kv_cache.shape[1]}, head_dim {head_dim}, "
                         f"next_n {next_n}")
    q2 = q.reshape(-1, head_dim)
    rows = kv_cache.view(torch.float8_e4m3fn).view(-1, head_dim)
    out = torch.empty(batch * next_n, max_model_len, dtype=torch.float32, device=q.device)
    grid = (batch, triton.cdiv(max_model_len, tokens_per_program))
    _tl_tma_kernel[grid](TensorDescriptor.from_tensor(q2, [next_n * heads, head_dim]),
                         TensorDescriptor.from_tensor(rows, [CHUNK, head_dim]), kv_cache.view(torch.float32),
                         weights, context_lens, block_tables, out, block_tables.stride(0), out.stride(0),
                         max_model_len, tokens_per_program, NEXT_N=next_n, H=heads, STAGES=stages, num_warps=4)
    return out
