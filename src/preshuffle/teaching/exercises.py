"""Exercises on the logits kernel: four small Triton kernels for the reader to write, each with a checker that runs the
reader's kernel on fresh random inputs (under Triton's interpreter on a CPU, in seconds) and compares every element
with a reference computed here in PyTorch, exactly, or in float64 for the logits.

Each checker takes the reader's ``@triton.jit`` function and returns a :class:`Verdict`; it fills the output with NaN
first, so an element the kernel never wrote shows as one. The package's own answers are :data:`ANSWERS` (read one
with ``preshuffle.source.source``); the tests hold every checker to pass them and to catch a wrong kernel.

1. :func:`check_visible_rows`: the -inf pattern of next_n query rows.
2. :func:`check_chunk_scales`: a chunk's scales through the block table, in the block-flat cache.
3. :func:`check_shuffled_block`: a preshuffled block's values read back in natural order.
4. :func:`check_chunk_logits`: one chunk's logits, keys as the MMA's A operand and the scale after the head sum.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .. import device  # first: sets TRITON_INTERPRET before the kernels below are decorated
from ..arguments import non_negative_int
from ..cache import allocate_k_cache, write_k_cache
from ..testing.inputs import random_problem
from ..testing.numeric import compare_logits

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

HEAD_DIM = 128
TRIALS = 3  # fresh random inputs a checker draws, each of a different size


@dataclass(frozen=True)
class Verdict:
    """What a checker found: ``passed``, and a sentence saying what it compared or the first thing that was wrong."""

    passed: bool
    message: str

    def __str__(self) -> str:
        return ("passed: " if self.passed else "not yet: ") + self.message


def _check_kernel(kernel) -> None:
    if not isinstance(kernel, triton.runtime.KernelInterface):  # compiled or interpreted, a launchable kernel
        raise TypeError(f"kernel must be a @triton.jit function, got {type(kernel).__name__}")


def _generator(seed) -> torch.Generator:
    return torch.Generator().manual_seed(non_negative_int(seed, "seed"))


def _first_difference(got: torch.Tensor, want: torch.Tensor, names: tuple[str, ...]) -> str | None:
    """None where ``got`` holds exactly ``want`` (the same -inf and NaN too), else the first element that differs."""
    same = (got == want) | (torch.isnan(got) & torch.isnan(want)) if got.is_floating_point() else got == want
    if bool(same.all()):
        return None
    where = tuple(int(i) for i in (~same).nonzero()[0])
    unwritten = int(torch.isnan(got).sum()) if got.is_floating_point() else 0
    at = ", ".join(f"{name} {i}" for name, i in zip(names, where))
    note = f"; {unwritten} of {got.numel()} elements were never written (still NaN)" if unwritten else ""
    return (f"{int((~same).sum())} of {got.numel()} elements differ, the first at {at}: got {got[where].item()!r}, "
            f"expected {want[where].item()!r}{note}")


# 1. The -inf pattern: row j of a sequence with context_len tokens and next_n query rows sees positions
# p <= context_len - next_n + j (the reference's visibility rule); the rest of its row is -inf.

@triton.jit
def _visible_rows_answer(scores_ptr, out_ptr, context_len, L, NEXT_N: tl.constexpr, BLOCK: tl.constexpr):
    pos = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    for j in tl.static_range(NEXT_N):
        scores = tl.load(scores_ptr + j * L + pos, mask=pos < L)
        visible = pos < context_len - NEXT_N + 1 + j
        tl.store(out_ptr + j * L + pos, tl.where(visible, scores, float("-inf")), mask=pos < L)


def check_visible_rows(kernel, seed: int = 0) -> Verdict:
    """``kernel(scores_ptr, out_ptr, context_len, L, NEXT_N: tl.constexpr, BLOCK: tl.constexpr)``, launched on a grid
    of ``cdiv(L, BLOCK)`` programs with BLOCK = 64: copy the fp32 scores ``[NEXT_N, L]`` (row-major) to ``out``,
    -inf wherever row j may not see position p, that is where ``p > context_len - NEXT_N + j``."""
    _check_kernel(kernel)
    g = _generator(seed)
    for trial, next_n in enumerate((1, 3, 2)[:TRIALS]):
        L = int(torch.randint(65, 300, (1,), generator=g))
        context_len = int(torch.randint(next_n, L + 1, (1,), generator=g))
        scores = torch.randn(next_n, L, generator=g)
        want = scores.clone()
        for j in range(next_n):
            want[j, context_len - next_n + 1 + j:] = float("-inf")
        got = torch.full_like(scores, float("nan"))
        scores_d, got_d = scores.to(device.KERNEL_DEVICE), got.to(device.KERNEL_DEVICE)
        kernel[(triton.cdiv(L, 64),)](scores_d, got_d, context_len, L, NEXT_N=next_n, BLOCK=64)
        wrong = _first_difference(got_d.cpu(), want, ("row", "position"))
        if wrong:
            return Verdict(False, f"next_n {next_n}, L {L}, context_len {context_len}: {wrong}")
    return Verdict(True, f"{TRIALS} random rows of scores, next_n 1-3: every element as expected, -inf exactly where "
                         "a row may not see its position")


# 2. A chunk's scales: a block of B tokens is B x 128 value bytes, then the B fp32 scales; the block table maps a
# position's block index p // B to a page of the cache.

@triton.jit
def _chunk_scales_answer(scale_ptr, bt_ptr, out_ptr, first, context_len, BLOCK_SIZE: tl.constexpr,
                         D: tl.constexpr, CHUNK: tl.constexpr):
    pos = first + tl.arange(0, CHUNK)
    inside = pos < context_len
    page = tl.load(bt_ptr + pos // BLOCK_SIZE, mask=inside, other=0)
    words_per_block: tl.constexpr = BLOCK_SIZE * (D + 4) // 4
    s = tl.load(scale_ptr + page * words_per_block + BLOCK_SIZE * D // 4 + pos % BLOCK_SIZE, mask=inside, other=0.0)
    tl.store(out_ptr + tl.arange(0, CHUNK), s)


def check_chunk_scales(kernel, seed: int = 0) -> Verdict:
    """``kernel(scale_ptr, bt_ptr, out_ptr, first, context_len, BLOCK_SIZE: tl.constexpr, D: tl.constexpr,
    CHUNK: tl.constexpr)``, one program, CHUNK = 64, D = 128: ``out[c]`` is the fp32 scale of position
    ``first + c`` of one sequence, 0.0 past its ``context_len``. ``scale_ptr`` is the paged cache viewed as fp32
    words, ``bt_ptr`` the sequence's int32 block-table row."""
    _check_kernel(kernel)
    g = _generator(seed)
    for trial, block_size in enumerate((16, 64, 1)[:TRIALS]):
        context_len = int(torch.randint(70, 400, (1,), generator=g))
        problem = random_problem([context_len], heads=16, block_size=block_size, seed=int(torch.randint(1 << 30, (1,),
                                                                                                      generator=g)))
        kv, table = problem.kv_cache.cpu(), problem.block_tables[0].cpu()
        first = 64 * int(torch.randint(0, context_len // 64 + 1, (1,), generator=g))
        pos = first + torch.arange(64)
        page = table[(pos // block_size).clamp(max=table.numel() - 1)].long()
        words = kv.view(kv.shape[0], -1).view(torch.float32)
        want = words[page, block_size * HEAD_DIM // 4 + pos % block_size]
        want = torch.where(pos < context_len, want, torch.zeros(()))
        got = torch.full((64,), float("nan"), device=device.KERNEL_DEVICE)
        kernel[(1,)](problem.kv_cache.view(torch.float32), problem.block_tables[0].contiguous(), got, first,
                     context_len, BLOCK_SIZE=block_size, D=HEAD_DIM, CHUNK=64)
        wrong = _first_difference(got.cpu(), want, ("chunk position",))
        if wrong:
            return Verdict(False, f"block size {block_size}, context_len {context_len}, first {first}: {wrong}")
    return Verdict(True, f"{TRIALS} random caches of 16-, 64- and 1-token blocks: every scale of the chunk read "
                         "through the block table, 0 past the context")


# 3. A preshuffled block: value (t, d) of a block of B tokens sits at byte
# (t // 16) * 16 * D + (d // 16) * 256 + (t % 16) * 16 + d % 16 (:mod:`preshuffle.layout`).

@triton.jit
def _shuffled_block_answer(block_ptr, out_ptr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr):
    t = tl.arange(0, BLOCK_SIZE)[:, None]
    d = tl.arange(0, D)[None, :]
    offsets = (t // 16) * (16 * D) + (d // 16) * 256 + (t % 16) * 16 + d % 16
    tl.store(out_ptr + t * D + d, tl.load(block_ptr + offsets))


def check_shuffled_block(kernel, seed: int = 0) -> Verdict:
    """``kernel(block_ptr, out_ptr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr)``, one program, D = 128: ``block_ptr``
    holds one preshuffled block's bytes (values, then scales); write its value bytes to ``out`` ``[BLOCK_SIZE, D]``
    uint8 in natural order, token by token."""
    _check_kernel(kernel)
    g = _generator(seed)
    for trial, block_size in enumerate((16, 32, 64)[:TRIALS]):
        keys = torch.randn(block_size, HEAD_DIM, generator=g) * 4
        cache = allocate_k_cache(1, block_size, device="cpu")
        write_k_cache(cache, keys, torch.arange(block_size), layout="normal")
        want = cache[0].reshape(-1)[:block_size * HEAD_DIM].reshape(block_size, HEAD_DIM).clone()
        shuffled = allocate_k_cache(1, block_size, device="cpu")
        write_k_cache(shuffled, keys, torch.arange(block_size), layout="shuffle")
        got = torch.zeros(block_size, HEAD_DIM, dtype=torch.uint8, device=device.KERNEL_DEVICE)
        kernel[(1,)](shuffled[0].reshape(-1).to(device.KERNEL_DEVICE), got, BLOCK_SIZE=block_size, D=HEAD_DIM)
        wrong = _first_difference(got.cpu(), want, ("token", "dim"))
        if wrong:
            return Verdict(False, f"block size {block_size}: {wrong}")
    return Verdict(True, f"{TRIALS} random preshuffled blocks of 16, 32 and 64 tokens: every value byte back in "
                         "natural order")


# 4. One chunk's logits: K @ Q^T (a token per row), relu, the weights, the sum over heads, then the scale.

@triton.jit
def _chunk_logits_answer(k_ptr, s_ptr, q_ptr, w_ptr, out_ptr, CHUNK: tl.constexpr, H: tl.constexpr,
                         D: tl.constexpr):
    tok = tl.arange(0, CHUNK)
    heads = tl.arange(0, H)
    dims = tl.arange(0, D)
    k = tl.load(k_ptr + tok[:, None] * D + dims[None, :]).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    q_t = tl.load(q_ptr + heads[None, :] * D + dims[:, None]).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    scores = tl.dot(k, q_t, out_dtype=tl.float32)                                    # [CHUNK, H]
    w = tl.load(w_ptr + heads)
    logits = tl.sum(tl.maximum(scores, 0.0) * w[None, :], axis=1) * tl.load(s_ptr + tok)
    tl.store(out_ptr + tok, logits)


def check_chunk_logits(kernel, seed: int = 0) -> Verdict:
    """``kernel(k_ptr, s_ptr, q_ptr, w_ptr, out_ptr, CHUNK: tl.constexpr, H: tl.constexpr, D: tl.constexpr)``, one
    program, D = 128: fp8 keys ``[CHUNK, D]`` and queries ``[H, D]`` as bytes (uint8), positive fp32 scales
    ``[CHUNK]`` and fp32 weights ``[H]``; ``out[c] = sum_h w[h] * relu(s[c] * (q[h] . k[c]))``, within 1e-5 of each
    logit's sum of |terms| of the float64 value."""
    _check_kernel(kernel)
    g = _generator(seed)
    for trial, (chunk, heads) in enumerate(((64, 64), (32, 16), (16, 32))[:TRIALS]):
        k = (torch.randn(chunk, HEAD_DIM, generator=g) * 8).to(torch.float8_e4m3fn)
        q = (torch.randn(heads, HEAD_DIM, generator=g) * 8).to(torch.float8_e4m3fn)
        s = torch.rand(chunk, generator=g) * 0.1 + 1e-3
        w = torch.randn(heads, generator=g)
        terms = w.double()[None, :] * torch.relu(s.double()[:, None] * (k.double() @ q.double().T))
        want, magnitude = terms.sum(1), terms.abs().sum(1)
        got = torch.full((chunk,), float("nan"), device=device.KERNEL_DEVICE)
        dev = device.KERNEL_DEVICE
        kernel[(1,)](k.view(torch.uint8).to(dev), s.to(dev), q.view(torch.uint8).to(dev), w.to(dev), got,
                     CHUNK=chunk, H=heads, D=HEAD_DIM)
        got = got.cpu()
        verdict = compare_logits(got, want, magnitude)
        if torch.isnan(got).any() or verdict["max_rel_error"] >= 1e-5:
            unwritten = int(torch.isnan(got).sum())
            worst = int(((got.double() - want).abs() / magnitude).nan_to_num(float("inf")).argmax())
            return Verdict(False, f"CHUNK {chunk}, H {heads}: logit {worst} is {got[worst].item():.6g}, the float64 "
                                  f"value {want[worst].item():.6g}" + (f"; {unwritten} of {chunk} logits were never "
                                                                       "written (still NaN)" if unwritten else ""))
    return Verdict(True, f"{TRIALS} random chunks (CHUNK x H of 64 x 64, 32 x 16, 16 x 32): every logit within 1e-5 "
                         "of its sum of |terms| of the float64 value")


CHECKERS = {"visible rows": check_visible_rows, "chunk scales": check_chunk_scales,
            "shuffled block": check_shuffled_block, "chunk logits": check_chunk_logits}
ANSWERS = {"visible rows": _visible_rows_answer, "chunk scales": _chunk_scales_answer,
           "shuffled block": _shuffled_block_answer, "chunk logits": _chunk_logits_answer}
