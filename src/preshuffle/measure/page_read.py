"""A kernel that reads a call's cache pages through its block table and does nothing else: the floor under any
kernel of the same cache layout. It loads every value and scale word a paged-MQA-logits call reads (the same
positions, the same block-table lookups, the widest loads the addresses allow) and folds them with XOR into one
word a program, so nothing is written that a kernel would not write and no load can be dropped.

What it measures is what the memory system charges for a layout. A 64-token page is one run of 8448 bytes whose
rows are 16-byte aligned; a one-token page is a 132-byte record at a random place, 4-byte aligned, that spans
three 64-byte segments of memory. The block-1 target (at most 1.5x block 64) is a claim about that charge; timing this
kernel on both caches tests it without any MMA or pipeline in the way (``benchmarks/page_read.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..arguments import positive_int
from ..cache import cache_geometry

WORDS_PER_TOKEN = 33  # 128 value bytes and a 4-byte scale


@triton.jit
def _page_read_kernel(words_ptr, ctx_ptr, bt_ptr, out_ptr, bt_stride, bt_width, num_blocks, max_model_len,
                      BLOCK_SIZE: tl.constexpr, TOKENS: tl.constexpr):
    b = tl.program_id(0)
    pos = tl.program_id(1) * TOKENS + tl.arange(0, TOKENS)
    kv_len = tl.minimum(tl.load(ctx_ptr + b), max_model_len)          # a call reads no position past its output row
    ok = (pos < kv_len) & (pos // BLOCK_SIZE < bt_width)
    ids = tl.load(bt_ptr + b * bt_stride + pos // BLOCK_SIZE, mask=ok, other=0)
    ok = ok & (ids >= 0) & (ids < num_blocks)                          # an id outside the cache reads nothing
    page = ids.to(tl.int64) * (BLOCK_SIZE * 33)                       # words; a page is BLOCK_SIZE * 33 of them
    t = pos % BLOCK_SIZE
    w = tl.arange(0, 32)
    values = tl.load(words_ptr + (page + t * 32)[:, None] + w[None, :], mask=ok[:, None], other=0)
    scales = tl.load(words_ptr + page + BLOCK_SIZE * 32 + t, mask=ok, other=0)
    folded = tl.xor_sum(values, axis=1) ^ scales
    tl.store(out_ptr + b * tl.num_programs(1) + tl.program_id(1), tl.xor_sum(folded, axis=0))


def page_read(kv_cache: torch.Tensor, context_lens: torch.Tensor, block_tables: torch.Tensor, max_model_len: int,
              *, tokens: int = 64, num_warps: int = 4) -> torch.Tensor:
    """Read positions ``[0, min(ctx_b, max_model_len))`` of every sequence b through ``block_tables``: int32
    ``[B, cdiv(max_model_len, tokens)]``, the XOR of the value and scale words of each program's ``tokens``
    positions (:func:`page_read_reference` computes the same). Positions past the table, and block ids outside the
    cache, read nothing."""
    num_blocks, block_size, head_dim = cache_geometry(kv_cache)
    if head_dim != 4 * WORDS_PER_TOKEN - 4:
        raise ValueError(f"kv_cache must hold head_dim {4 * WORDS_PER_TOKEN - 4} (132-byte tokens), got {head_dim}")
    for name, t in (("context_lens", context_lens), ("block_tables", block_tables)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32:
            raise TypeError(f"{name} must be an int32 tensor, got "
                            f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
    if context_lens.dim() != 1:
        raise ValueError(f"context_lens must be [B], got {list(context_lens.shape)}")
    if block_tables.dim() != 2 or block_tables.shape[0] != context_lens.shape[0]:
        raise ValueError(f"block_tables must be [B={context_lens.shape[0]}, width], got {list(block_tables.shape)}")
    if {context_lens.device, block_tables.device} != {kv_cache.device}:
        raise ValueError(f"context_lens and block_tables must be on kv_cache's device {kv_cache.device}")
    max_model_len = positive_int(max_model_len, "max_model_len")
    tokens = positive_int(tokens, "tokens")
    if tokens < 16 or tokens & (tokens - 1):
        raise ValueError(f"tokens must be a power of two >= 16, got {tokens}")
    batch = context_lens.shape[0]
    out = torch.empty(batch, triton.cdiv(max_model_len, tokens), dtype=torch.int32, device=kv_cache.device)
    _page_read_kernel[out.shape](kv_cache.view(torch.int32), context_lens, block_tables, out,
                                 block_tables.stride(0), block_tables.shape[1], num_blocks, max_model_len,
                                 BLOCK_SIZE=block_size, TOKENS=tokens, num_warps=num_warps)
    return out


def page_read_reference(kv_cache: torch.Tensor, context_lens: torch.Tensor, block_tables: torch.Tensor,
                        max_model_len: int, *, tokens: int = 64) -> torch.Tensor:
    """:func:`page_read`'s output computed with torch, sequence by sequence."""
    block_size = kv_cache.shape[1]
    pages = kv_cache.view(torch.int32).reshape(kv_cache.shape[0], block_size * WORDS_PER_TOKEN).cpu()
    out = torch.zeros(context_lens.shape[0], triton.cdiv(max_model_len, tokens), dtype=torch.int32)
    for b, n in enumerate(context_lens.tolist()):
        n = max(0, min(n, max_model_len, block_tables.shape[1] * block_size))
        pos = torch.arange(n)
        ids = block_tables[b].cpu().long()[pos // block_size]
        t = pos % block_size
        valid = (ids >= 0) & (ids < kv_cache.shape[0])
        ids = torch.where(valid, ids, 0)
        words = torch.cat([pages[ids[:, None], t[:, None] * 32 + torch.arange(32)[None, :]],
                           pages[ids, block_size * 32 + t][:, None]], dim=1) * valid[:, None]   # [n, 33]
        out[b, :triton.cdiv(n, tokens)] = xor_groups(words.reshape(-1), tokens * WORDS_PER_TOKEN)
    return out.to(kv_cache.device)


def xor_groups(words: torch.Tensor, per: int) -> torch.Tensor:
    """XOR of every ``per`` consecutive words along the last dimension (zeros past its end)."""
    padded = torch.nn.functional.pad(words, (0, -words.shape[-1] % per))
    return xor_fold(padded.unflatten(-1, (-1, per)))


def xor_fold(words: torch.Tensor) -> torch.Tensor:
    """XOR over the last dimension of integer ``words``, on their device (0 for an empty one): halves XORed
    pairwise, an odd one out paired with zero."""
    if words.shape[-1] == 0:
        return words.new_zeros(words.shape[:-1])
    while words.shape[-1] > 1:
        if words.shape[-1] % 2:
            words = torch.cat([words, words.new_zeros(*words.shape[:-1], 1)], dim=-1)
        words = words[..., 0::2] ^ words[..., 1::2]
    return words[..., 0]
