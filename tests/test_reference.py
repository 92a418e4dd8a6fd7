import pytest
import torch
from hypothesis import given, settings, strategies as st

from preshuffle.reference import (
    fp8_paged_mqa_logits_loops, fp8_paged_mqa_logits_ref, fp8_paged_mqa_logits_torch, logits_magnitude,
    reference_and_magnitude,
)
from preshuffle.testing.inputs import random_problem
from preshuffle.testing.numeric import RTOL, assert_bitwise_equal, check_unchecked_logits, compare_logits


def test_fp8_paged_mqa_logits_ref_one_token_by_hand():
    problem = random_problem([1], heads=16, block_size=1, seed=0)
    q, kv, w, ctx, bt, L = problem.args
    out = problem.call(fp8_paged_mqa_logits_ref)
    k = kv[bt[0, 0].item(), 0, 0, :128].view(torch.float8_e4m3fn).double()
    s = kv[bt[0, 0].item(), 0, 0, 128:].view(torch.float32).double()
    expected = sum(w[0, h].item() * max(s.item() * float(q[0, 0, h].double() @ k), 0.0) for h in range(16))
    assert out[0, 0].item() == pytest.approx(expected, rel=1e-12)
    assert torch.isneginf(out[0, 1:]).all()


@settings(max_examples=15)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=2), st.integers(1, 3),
       st.sampled_from([(1, "normal"), (16, "normal"), (16, "shuffle"), (32, "shuffle")]), st.booleans(),
       st.integers(0, 999))
def test_fp8_paged_mqa_logits_loops_and_torch_agree_with_ref(lens, next_n, block, ctx_2d, seed):
    block_size, layout = block
    problem = random_problem(lens, next_n=next_n, heads=16, block_size=block_size, layout=layout, ctx_2d=ctx_2d,
                             seed=seed)
    ref = problem.call(fp8_paged_mqa_logits_ref)
    magnitude = problem.call(logits_magnitude)
    assert compare_logits(problem.call(fp8_paged_mqa_logits_loops), ref, magnitude)["max_rel_error"] < 1e-12
    verdict = compare_logits(problem.call(fp8_paged_mqa_logits_torch), ref, magnitude)
    assert verdict["same_inf_pattern"] and verdict["max_rel_error"] < 1e-5


def test_fp8_paged_mqa_logits_ref_mtp_rows_see_one_more_position_each():
    problem = random_problem([10], next_n=3, block_size=16, max_model_len=12, seed=1)
    out = problem.call(fp8_paged_mqa_logits_ref)
    assert [int(torch.isfinite(row).sum()) for row in out] == [8, 9, 10]


def test_reference_and_magnitude_is_the_reference_and_logits_magnitude():
    problem = random_problem([30, 7], next_n=2, heads=16, block_size=16, layout="shuffle", seed=2)
    ref, magnitude = problem.call(reference_and_magnitude)
    assert_bitwise_equal(ref, problem.call(fp8_paged_mqa_logits_ref))
    assert_bitwise_equal(magnitude, problem.call(logits_magnitude))
    finite = torch.isfinite(ref)
    assert (magnitude[finite] >= ref[finite].abs()).all() and (magnitude[finite] > 0).any()


def test_logits_magnitude_by_hand():
    """Each logit's sum of |terms|, sum_h |w[r, h]| relu(s_p q[j, h] . k_p), term by term from the cache's bytes
    (blocks of one token: block id n holds its token at kv[n, 0, 0]), for two query rows of three tokens."""
    problem = random_problem([3], next_n=2, heads=16, block_size=1, seed=5)
    q, kv, w, ctx, bt, L = problem.args
    magnitude = problem.call(logits_magnitude)
    _, together = problem.call(reference_and_magnitude)
    for j in range(2):
        for p in range(2 + j):  # row j sees positions <= 3 - 2 + j
            record = kv[bt[0, p].item(), 0, 0]
            k, s = record[:128].view(torch.float8_e4m3fn).double(), record[128:].view(torch.float32).item()
            terms = [w[j, h].item() * max(s * float(q[0, j, h].double() @ k), 0.0) for h in range(16)]
            expected = sum(abs(t) for t in terms)
            assert expected > abs(sum(terms)) * 1.01  # signed weights: the magnitude is not |logit|
            assert magnitude[j, p].item() == pytest.approx(expected, rel=1e-12)
            assert together[j, p].item() == pytest.approx(expected, rel=1e-12)
        assert torch.isneginf(magnitude[j, 2 + j:]).all() and torch.isneginf(together[j, 2 + j:]).all()


@settings(max_examples=10)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=2), st.integers(1, 3),
       st.sampled_from([(1, "normal"), (16, "normal"), (16, "shuffle")]), st.booleans(), st.integers(0, 999))
def test_ref_and_magnitude_are_the_specs_sums_of_terms_and_of_their_magnitudes(lens, next_n, block, ctx_2d, seed):
    block_size, layout = block
    problem = random_problem(lens, next_n=next_n, heads=16, block_size=block_size, layout=layout, ctx_2d=ctx_2d,
                             seed=seed)
    ref, together = problem.call(reference_and_magnitude)
    # The scalar loops compute sum_h w relu(s q.k) term by term (on the host); with |w| that is each logit's
    # magnitude.
    logits = problem.call(fp8_paged_mqa_logits_loops).to(ref.device)
    magnitudes = problem.replace(weights=problem.weights.abs()).call(fp8_paged_mqa_logits_loops).to(ref.device)
    for got, expected in ((ref, logits), (problem.call(logits_magnitude), magnitudes), (together, magnitudes)):
        assert torch.equal(torch.isneginf(got), torch.isneginf(expected))
        finite = torch.isfinite(expected)
        assert torch.isfinite(got[finite]).all()
        assert ((got[finite] - expected[finite]).abs() <= 1e-12 * magnitudes[finite]).all()


@pytest.mark.parametrize("dtype", [torch.int64, torch.bool, "float64", None])
def test_fp8_paged_mqa_logits_ref_refuses_a_dtype_that_is_not_floating(dtype):
    problem = random_problem([5], heads=16, seed=0)
    with pytest.raises(TypeError, match="dtype must be a floating-point torch.dtype"):
        problem.call(fp8_paged_mqa_logits_ref, dtype=dtype)


def test_fp8_paged_mqa_logits_torch_gives_nan_where_a_block_cannot_be_read():
    problem = random_problem([40, 21, 9], next_n=2, heads=16, block_size=16, seed=4, max_model_len=80)
    tables, lens = problem.block_tables.clone(), problem.context_lens.clone()
    tables[0, 1], tables[1, 0] = problem.num_blocks + 3, -2
    lens[2] = 16 * tables.shape[1] + 20      # longer than its table row
    out = problem.replace(context_lens=lens, block_tables=tables).call(fp8_paged_mqa_logits_torch)
    verdict = check_unchecked_logits(out, problem, lens, tables)
    assert verdict["nan_exact"] and verdict["nan"] > 0, verdict
    assert verdict["same_inf_pattern"] and verdict["max_rel_error"] <= RTOL, verdict
