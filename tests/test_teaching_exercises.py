"""exercises.py: each checker passes the package's answer on fresh random inputs and catches a wrong kernel."""

import re

import pytest
import triton
import triton.language as tl

from preshuffle.teaching import exercises


@pytest.mark.parametrize("name", exercises.CHECKERS)
@pytest.mark.parametrize("seed", [0, 5])
def test_every_checker_passes_the_packages_answer(name, seed):
    verdict = exercises.CHECKERS[name](exercises.ANSWERS[name], seed=seed)
    assert verdict.passed and str(verdict).startswith("passed: "), verdict


# Each exercise's signature with an empty body, as the chapter hands it to the reader.
@triton.jit
def _rows_left_alone(scores_ptr, out_ptr, context_len, L, NEXT_N: tl.constexpr, BLOCK: tl.constexpr):
    pass


@triton.jit
def _scales_left_alone(scale_ptr, bt_ptr, out_ptr, first, context_len, BLOCK_SIZE: tl.constexpr, D: tl.constexpr,
                       CHUNK: tl.constexpr):
    pass


@triton.jit
def _block_left_alone(block_ptr, out_ptr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr):
    pass


@triton.jit
def _logits_left_alone(k_ptr, s_ptr, q_ptr, w_ptr, out_ptr, CHUNK: tl.constexpr, H: tl.constexpr, D: tl.constexpr):
    pass


@triton.jit
def _visible_one_too_many(scores_ptr, out_ptr, context_len, L, NEXT_N: tl.constexpr, BLOCK: tl.constexpr):
    pos = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    for j in tl.static_range(NEXT_N):
        scores = tl.load(scores_ptr + j * L + pos, mask=pos < L)
        tl.store(out_ptr + j * L + pos, tl.where(pos <= context_len - NEXT_N + 1 + j, scores, float("-inf")),
                 mask=pos < L)


@triton.jit
def _scales_at_the_token(scale_ptr, bt_ptr, out_ptr, first, context_len, BLOCK_SIZE: tl.constexpr, D: tl.constexpr,
                         CHUNK: tl.constexpr):
    pos = first + tl.arange(0, CHUNK)
    page = tl.load(bt_ptr + pos // BLOCK_SIZE, mask=pos < context_len, other=0)
    # as if each token's scale followed its own values (the [num_blocks, B, 1, 132] shape read literally)
    s = tl.load(scale_ptr + page * (BLOCK_SIZE * (D + 4) // 4) + (pos % BLOCK_SIZE) * (D + 4) // 4 + D // 4,
                mask=pos < context_len, other=0.0)
    tl.store(out_ptr + tl.arange(0, CHUNK), s)


@triton.jit
def _block_read_naturally(block_ptr, out_ptr, BLOCK_SIZE: tl.constexpr, D: tl.constexpr):
    t = tl.arange(0, BLOCK_SIZE)[:, None]
    d = tl.arange(0, D)[None, :]
    tl.store(out_ptr + t * D + d, tl.load(block_ptr + t * D + d))


@triton.jit
def _logits_without_relu(k_ptr, s_ptr, q_ptr, w_ptr, out_ptr, CHUNK: tl.constexpr, H: tl.constexpr,
                         D: tl.constexpr):
    tok = tl.arange(0, CHUNK)
    heads = tl.arange(0, H)
    dims = tl.arange(0, D)
    k = tl.load(k_ptr + tok[:, None] * D + dims[None, :]).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    q_t = tl.load(q_ptr + heads[None, :] * D + dims[:, None]).to(tl.float8e4nv, bitcast=True).to(tl.float16)
    scores = tl.dot(k, q_t, out_dtype=tl.float32)
    logits = tl.sum(scores * tl.load(w_ptr + heads)[None, :], axis=1) * tl.load(s_ptr + tok)
    tl.store(out_ptr + tok, logits)


@pytest.mark.parametrize("name, wrong, message", [
    ("visible rows", _visible_one_too_many, r"^not yet: next_n 1, .* elements differ, the first at row 0, position "
                                            r"\d+: got .*, expected -inf$"),
    ("chunk scales", _scales_at_the_token, r"^not yet: block size 16, .* elements differ, the first at chunk "
                                           r"position \d+"),
    ("shuffled block", _block_read_naturally, r"^not yet: block size 16: \d+ of 2048 elements differ, the first at "
                                              r"token 0, dim \d+"),
    ("chunk logits", _logits_without_relu, r"^not yet: CHUNK 64, H 64: logit \d+ is .*, the float64 value"),
    ("visible rows", _rows_left_alone, r"elements were never written \(still NaN\)$"),
    ("chunk scales", _scales_left_alone, r"elements were never written \(still NaN\)$"),
    ("shuffled block", _block_left_alone, r"^not yet: block size 16: \d+ of 2048 elements differ"),
    ("chunk logits", _logits_left_alone, r"64 of 64 logits were never written \(still NaN\)$"),
])
def test_every_checker_catches_a_wrong_kernel(name, wrong, message):
    verdict = exercises.CHECKERS[name](wrong)
    assert not verdict.passed
    assert re.search(message, str(verdict)), str(verdict)


@pytest.mark.parametrize("name", exercises.CHECKERS)
def test_every_checker_refuses_what_is_no_kernel_and_a_bad_seed(name):
    check = exercises.CHECKERS[name]
    with pytest.raises(TypeError, match="^kernel must be a @triton.jit function, got function$"):
        check(lambda: None)
    with pytest.raises(TypeError, match="^seed must be a non-negative int, got str 'a'$"):
        check(exercises.ANSWERS[name], seed="a")
    with pytest.raises(ValueError, match="^seed must be a non-negative int, got -1$"):
        check(exercises.ANSWERS[name], seed=-1)
