import pytest
import torch
from hypothesis import given, settings, strategies as st

from preshuffle.reference import (
    fp8_paged_mqa_logits_loops, fp8_paged_mqa_logits_ref, fp8_paged_mqa_logits_torch, logits_magnitude,
    reference_and_magnitude,
)
from preshuffle import contract
from preshuffle.testing.inputs import key_record, random_problem, with_nan_key, with_nan_query, with_scale
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


REFERENCES = {"ref": fp8_paged_mqa_logits_ref, "loops": fp8_paged_mqa_logits_loops, "magnitude": logits_magnitude,
              "ref_and_magnitude": reference_and_magnitude}


@pytest.fixture
def small():
    return random_problem([20, 0, 37], next_n=2, heads=16, block_size=16, seed=5)


@pytest.mark.parametrize("scale", [-1.0, 0.0, float("nan"), float("inf")])
@pytest.mark.parametrize("name", REFERENCES)
def test_the_checked_references_refuse_a_bad_scale_naming_block_and_token(small, name, scale):
    # Before, a negative scale gave relu(s * q.k): finite numbers the kernels (which factor s out) disagreed with.
    bad = with_scale(small, 2, 33, scale)
    block, token = key_record(bad, 2, 33)
    with pytest.raises(ValueError, match=rf"^kv_cache holds scale {scale} at block {block}, token {token} \(position "
                                         r"33 of sequence 2\): scales must be finite and positive$"):
        bad.call(REFERENCES[name])


@pytest.mark.parametrize("scale", [-1.0, 0.0, float("nan"), float("inf")])
def test_fp8_paged_mqa_logits_torch_gives_nan_at_a_bad_scale(small, scale):
    # Before, an infinite scale gave inf (the kernels' NaN against the reference's inf), a negative one numbers.
    bad = with_scale(small, 2, 33, scale)
    verdict = check_unchecked_logits(bad.call(fp8_paged_mqa_logits_torch), bad, bad.context_lens, bad.block_tables)
    assert verdict["nan_exact"] and verdict["nan"] == 2 and verdict["max_rel_error"] <= RTOL, verdict


@pytest.mark.parametrize("name", [*REFERENCES, "torch"])
def test_the_references_give_nan_wherever_a_nan_in_q_or_a_key_enters(small, name):
    fn = REFERENCES.get(name, fp8_paged_mqa_logits_torch)
    for poisoned, rows in ((with_nan_query(small, 0, 1, 4, 3), [1]), (with_nan_key(small, 2, 10, 9), [4, 5])):
        out = poisoned.call(fn)
        outs = out if isinstance(out, tuple) else (out,)
        for out in outs:
            nan = torch.isnan(out)
            assert nan.any(dim=1).nonzero().flatten().tolist() == rows, name
            assert not nan[:, 40:].any() and torch.isfinite(out[~nan.any(dim=1)][:, :20]).any()


def test_the_reference_counts_its_float64_outputs_against_memory(small, monkeypatch):
    # The guard counted fp32 logits while the reference allocates float64 ones (two with its magnitudes). A device
    # of 64 MiB here, so that a guard that lets the call through allocates little.
    monkeypatch.setattr(contract, "memory_bytes", lambda dev: 64 << 20)
    rows = small.batch * small.next_n
    too_long = (64 << 20) // (8 * rows) + 1
    assert too_long * 4 * rows <= 64 << 20   # fp32 logits would fit
    with pytest.raises(ValueError, match=rf"^max_model_len {too_long} asks for {rows} rows of {too_long} float64 "
                                         r"logits"):
        small.replace(max_model_len=too_long).call(fp8_paged_mqa_logits_ref)
    with pytest.raises(ValueError, match=rf"^max_model_len {too_long // 2} asks for {2 * rows} rows of "
                                         rf"{too_long // 2} float64 logits"):
        small.replace(max_model_len=too_long // 2).call(reference_and_magnitude)
