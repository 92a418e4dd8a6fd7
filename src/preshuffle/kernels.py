"""FP8 paged MQA logits in Triton: one kernel, specialised at compile time into the three variants vLLM
chooses between.

* kernel block size 1: every token has its own block-table entry and its 128 values start at a 132-byte
  stride, so a program gathers CHUNK scattered rows with 4-byte-aligned loads;
* natural-layout blocks (``BLOCK_SIZE`` >= 2): one table entry serves a contiguous run of ``BLOCK_SIZE*128``
  bytes whose base is 16-byte aligned when ``BLOCK_SIZE % 4 == 0``, so loads are 16 bytes wide;
* preshuffled blocks (multiples of 16): the same bytes in 16x16 tiles; one token's 16 dims of a tile are
  still 16 contiguous bytes, so the loads keep their width.

Each program owns one sequence and a run of ``tokens_per_program`` positions of its output row. It keeps
the sequence's queries ``[next_n*H, D]`` and weights in registers, then for each CHUNK of positions loads
the fp8 keys and their scales, computes ``relu(s * q.k)`` with one ``tl.dot``, reduces over heads with the
weights, and stores the logits (-inf outside each row's visible prefix). Positions past the context are
filled with -inf without touching the cache, so the output is fully defined up to ``max_model_len``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from . import device  # noqa: F401  (sets TRITON_INTERPRET before the kernel below is decorated)
from .contract import check_inputs

import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _paged_mqa_logits_kernel(
    q_ptr, kv_ptr, scale_ptr, w_ptr, ctx_ptr, bt_ptr, out_ptr,
    bt_stride, out_stride, max_model_len, tokens_per_program,
    NEXT_N: tl.constexpr, NEXT_N_PAD: tl.constexpr, H: tl.constexpr, D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr, SHUFFLED: tl.constexpr, CTX_2D: tl.constexpr, CHUNK: tl.constexpr,
):
    b = tl.program_id(0)
    start = tl.program_id(1) * tokens_per_program
    end = tl.minimum(start + tokens_per_program, max_model_len)

    # Row r = j*H + h of the query tile; rows of j >= NEXT_N are padding (zero queries, zero weights).
    rows = tl.arange(0, NEXT_N_PAD * H)
    row_ok = rows < NEXT_N * H
    dims = tl.arange(0, D)
    q_rows = b * NEXT_N * H + rows
    q = tl.load(q_ptr + q_rows[:, None] * D + dims[None, :], mask=row_ok[:, None], other=0)
    q = q.to(tl.float8e4nv, bitcast=True)
    w = tl.load(w_ptr + q_rows, mask=row_ok, other=0.0)

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
    out_rows = out_ptr + (b * NEXT_N + js).to(tl.int64)[:, None] * out_stride
    row_mask = (js < NEXT_N)[:, None]

    block_bytes: tl.constexpr = BLOCK_SIZE * (D + 4)
    if SHUFFLED:
        dim_offsets = (dims // 16) * 256 + dims % 16
    else:
        dim_offsets = dims
    tok = tl.arange(0, CHUNK)
    read_end = tl.minimum(end, kv_len)
    n_read = tl.cdiv(tl.maximum(read_end - start, 0), CHUNK)
    for i in range(n_read):
        pos = start + i * CHUNK + tok
        in_ctx = pos < kv_len
        page = tl.load(bt_ptr + b * bt_stride + pos // BLOCK_SIZE, mask=in_ctx, other=0).to(tl.int64)
        t = pos % BLOCK_SIZE
        if SHUFFLED:
            token_offsets = (t // 16) * (16 * D) + (t % 16) * 16
        else:
            token_offsets = t * D
        k = tl.load(kv_ptr + (page * block_bytes + token_offsets)[:, None] + dim_offsets[None, :],
                    mask=in_ctx[:, None], other=0)
        k = k.to(tl.float8e4nv, bitcast=True)
        # The cache viewed as fp32: the scale of token t sits at word (block_bytes + ... ) / 4.
        s = tl.load(scale_ptr + page * (block_bytes // 4) + (BLOCK_SIZE * D) // 4 + t, mask=in_ctx, other=0.0)
        scores = tl.dot(q, tl.trans(k), out_dtype=tl.float32)                   # [NEXT_N_PAD*H, CHUNK]
        scores = tl.maximum(scores * s[None, :], 0.0) * w[:, None]
        logits = tl.sum(tl.reshape(scores, (NEXT_N_PAD, H, CHUNK)), axis=1)      # [NEXT_N_PAD, CHUNK]
        logits = tl.where(pos[None, :] < visible[:, None], logits, float("-inf"))
        tl.store(out_rows + pos[None, :], logits, mask=row_mask & (pos < end)[None, :])

    neg_inf = tl.full((NEXT_N_PAD, CHUNK), float("-inf"), tl.float32)
    for tail in range(start + n_read * CHUNK, end, CHUNK):
        pos = tail + tok
        tl.store(out_rows + pos[None, :], neg_inf, mask=row_mask & (pos < end)[None, :])


@dataclass(frozen=True)
class LaunchConfig:
    """How one call is cut into programs: ``chunk`` positions per ``tl.dot``, ``tokens_per_program``
    positions per program (a multiple of ``chunk``), and Triton's ``num_warps``/``num_stages``."""

    chunk: int = 64
    tokens_per_program: int | None = None
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self):
        if self.chunk < 16 or self.chunk & (self.chunk - 1):
            raise ValueError(f"chunk must be a power of two >= 16, got {self.chunk}")
        if self.tokens_per_program is not None and (self.tokens_per_program <= 0
                                                    or self.tokens_per_program % self.chunk):
            raise ValueError(f"tokens_per_program must be a positive multiple of chunk {self.chunk}, "
                             f"got {self.tokens_per_program}")


def default_config(batch: int, max_model_len: int) -> LaunchConfig:
    """Under the interpreter every program costs Python overhead, so one program per sequence; compiled, split
    each row so that the grid has a few programs per SM."""
    if device.INTERPRETED:
        chunk = 64
        return LaunchConfig(chunk, triton.cdiv(max_model_len, chunk) * chunk)
    from .tuning import choose_config
    return choose_config(batch, max_model_len)


def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout="normal",
                         check_values=True, config: LaunchConfig | None = None):
    """Triton FP8 paged MQA logits: same contract and output as
    :func:`preshuffle.reference.fp8_paged_mqa_logits_ref`, fp32 ``[B * next_n, max_model_len]``.

    The kernel block size is read from ``kv_cache.shape[1]``. ``check_values=False`` skips the checks that read
    context lengths and block ids on the host (a device sync), for benchmarking known-good inputs."""
    p = check_inputs(q, kv_cache, weights, context_lens, block_tables, max_model_len, layout,
                     check_values=check_values)
    if q.dtype != torch.float8_e4m3fn:
        raise TypeError(f"the Triton kernel takes q as torch.float8_e4m3fn, got {q.dtype}")
    if p.heads < 16 or p.heads & (p.heads - 1):
        raise ValueError(f"the Triton kernel needs a power-of-two number of heads >= 16, got {p.heads}")
    if p.head_dim & (p.head_dim - 1):
        raise ValueError(f"the Triton kernel needs a power-of-two head_dim, got {p.head_dim}")
    for name, tensor in (("q", q), ("kv_cache", kv_cache)):
        problem = device.kernel_device_error(tensor, name)
        if problem:
            raise ValueError(problem)
    config = config or default_config(p.batch, max_model_len)
    tokens_per_program = config.tokens_per_program or triton.cdiv(max_model_len, config.chunk) * config.chunk
    block_tables = block_tables.contiguous()
    out = torch.empty((p.batch * p.next_n, max_model_len), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out
    grid = (p.batch, triton.cdiv(max_model_len, tokens_per_program))
    _paged_mqa_logits_kernel[grid](
        q.contiguous().view(torch.uint8), kv_cache, kv_cache.view(torch.float32), weights.contiguous(),
        context_lens.contiguous(), block_tables, out,
        block_tables.stride(0), out.stride(0), max_model_len, tokens_per_program,
        NEXT_N=p.next_n, NEXT_N_PAD=triton.next_power_of_2(p.next_n), H=p.heads, D=p.head_dim,
        BLOCK_SIZE=p.block_size, SHUFFLED=layout == "shuffle", CTX_2D=p.ctx_2d, CHUNK=config.chunk,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out

