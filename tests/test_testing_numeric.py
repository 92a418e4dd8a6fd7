import math

import pytest
import torch

from preshuffle.kernels import fp8_paged_mqa_logits
from preshuffle.reference import fp8_paged_mqa_logits_ref
from preshuffle.testing.inputs import random_problem
from preshuffle.reference import reference_and_magnitude
from preshuffle.testing.numeric import (
    BF16_CONTRACTS, BF16_ROUNDING, CALC_DIFF_MIN_LOGITS, CONTRACTS, RTOL, assert_bitwise_equal, bitwise_equal,
    calc_diff, check_logits, check_repeatable, check_unchecked_logits, compare_logits, contract, meets_contract,
)


def test_compare_logits_catches_mistakes():
    ref = torch.tensor([[1.0, -math.inf], [2.0, 3.0]], dtype=torch.float64)
    magnitude = ref.abs().nan_to_num(posinf=0, neginf=0) + 1
    assert compare_logits(ref.float(), ref, magnitude)["max_rel_error"] == 0
    wrong_mask = ref.clone()
    wrong_mask[1, 1] = -math.inf
    assert not compare_logits(wrong_mask, ref, magnitude)["same_inf_pattern"]
    off = ref.clone()
    off[1, 0] += 0.5
    assert compare_logits(off, ref, magnitude)["max_rel_error"] == pytest.approx(0.5 / 3)
    nan = ref.clone()
    nan[0, 0] = math.nan
    assert compare_logits(nan, ref, magnitude)["max_rel_error"] == 1.0


def test_calc_diff():
    x = torch.tensor([1.0, 2.0, -math.inf])
    assert calc_diff(x, x) == pytest.approx(0.0, abs=1e-15)
    assert calc_diff(x, -x.nan_to_num(neginf=0)) == pytest.approx(2.0)
    for bad in (math.nan, math.inf):  # nothing a NaN or +inf logit could pass
        assert math.isnan(calc_diff(torch.tensor([1.0, 2.0, bad]), x.nan_to_num(neginf=0)))


def test_the_fp8_contract_holds_calc_diff_to_outputs_of_a_chunk_of_logits():
    """One logit that nearly cancels (1% of its sum of |terms|), off by 1.7e-5 of that sum: within the per-logit
    clause, yet its calc_diff is about 1.4e-6. Alone it meets the fp8 contract; a chunk of such logits does not."""
    magnitude = torch.full((1, CALC_DIFF_MIN_LOGITS), 100.0, dtype=torch.float64)
    ref = torch.ones_like(magnitude)
    out = ref + 1.7e-3
    for n in (1, CALC_DIFF_MIN_LOGITS - 1):
        verdict = compare_logits(out[:, :n], ref[:, :n], magnitude[:, :n])
        assert verdict["max_rel_error"] == pytest.approx(1.7e-5) and verdict["calc_diff"] > 1e-6
        assert meets_contract(verdict, "fp8") and not meets_contract(verdict, "exact")
    verdict = compare_logits(out, ref, magnitude)
    assert verdict["calc_diff"] > 1e-6 and not meets_contract(verdict, "fp8")
    far = compare_logits(out[:, :1] + 0.2, ref[:, :1], magnitude[:, :1])  # 2.0e-3 of its terms: the per-logit clause
    assert not meets_contract(far, "fp8")


def test_check_logits_judges_a_kernel_output_against_the_reference():
    problem = random_problem([50, 3], next_n=2, heads=16, block_size=16, seed=4)
    out = problem.call(fp8_paged_mqa_logits, precision="exact")  # the default on a GPU is fp8, outside 1e-5
    verdict = check_logits(out, problem)
    assert verdict["same_inf_pattern"] and verdict["max_rel_error"] <= RTOL
    assert verdict["finite"] == (49 + 50) + (2 + 3)  # row j of a sequence sees ctx - next_n + j + 1 positions
    nudged = out.clone()
    nudged[0, 5] += 1.0
    assert check_logits(nudged, problem)["max_rel_error"] > RTOL


def test_assert_bitwise_equal_names_the_first_differing_coordinate():
    a = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    b = a.clone()
    b[1, 2, 0], b[1, 2, 3] = 7.5, -1.0
    with pytest.raises(AssertionError, match=r"2 of 24 elements differ; the first at \[1, 2, 0\]: 20\.0 against 7\.5"):
        assert_bitwise_equal(a, b)
    assert_bitwise_equal(a, a.clone())


def test_assert_bitwise_equal_compares_bits_not_values():
    nan = torch.tensor([math.nan, 1.0])
    assert_bitwise_equal(nan, nan.clone())                          # NaN is bitwise equal to itself
    with pytest.raises(AssertionError, match=r"the first at \[0\]: 0\.0 against -0\.0"):
        assert_bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0]))
    with pytest.raises(AssertionError, match=r"dtype or shape differ: torch.float32 \[2\] against torch.float64 \[2\]"):
        assert_bitwise_equal(nan, nan.double())
    # The same test as a value, where a NaN output must not count as a difference (torch.equal says it does).
    assert bitwise_equal(nan, nan.clone()) and not torch.equal(nan, nan.clone())
    assert not bitwise_equal(torch.tensor([0.0]), torch.tensor([-0.0])) and not bitwise_equal(nan, nan.double())


def test_check_repeatable_runs_until_a_run_differs():
    calls = []

    def drifting():
        calls.append(None)
        return torch.tensor([1.0, 2.0 if len(calls) < 3 else 2.5])

    assert_bitwise_equal(check_repeatable(lambda: torch.ones(3), runs=4), torch.ones(3))
    with pytest.raises(AssertionError, match=r"run 3 of 5 differs from run 1: .* at \[1\]: 2\.0 against 2\.5"):
        check_repeatable(drifting, runs=5)
    assert len(calls) == 3
    with pytest.raises(ValueError, match="runs must be at least 2"):
        check_repeatable(drifting, runs=1)


def test_compare_logits_bad_arguments():
    ref = torch.zeros(2, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"magnitude has shape \[3\], the reference \[2, 3\]"):
        compare_logits(ref, ref, ref[0])
    with pytest.raises(TypeError, match="out must be a tensor, got list"):
        compare_logits(ref.tolist(), ref, ref)


def test_meets_contract_refuses_an_unknown_precision():
    verdict = {"same_inf_pattern": True, "max_rel_error": 0.0, "finite": 1}
    with pytest.raises(ValueError, match=r"^precision must be one of \('exact', 'fp8'\), got 'fp16'$"):
        meets_contract(verdict, "fp16")
    with pytest.raises(ValueError, match=r"^logits_dtype must be torch.float32 or torch.bfloat16, got torch.float16$"):
        meets_contract(verdict, "exact", torch.float16)


@pytest.mark.parametrize("precision", ["exact", "fp8"])
def test_the_bf16_contract_is_the_fp32_one_plus_one_rounding(precision):
    """Each bf16 clause holds the fp32 clause plus a rounding to nearest even (at most 2**-8 of a logit of at most
    (1 + its fp32 error) times its sum of |terms|), and is the next round number above that."""
    fp32, bf16 = CONTRACTS[precision], BF16_CONTRACTS[precision]
    assert contract(precision) == fp32 and contract(precision, torch.bfloat16) == bf16
    per_logit = fp32["max_rel_error"] + BF16_ROUNDING * (1 + fp32["max_rel_error"])
    assert per_logit <= bf16["max_rel_error"] < per_logit + 1e-4
    if "calc_diff" in fp32:
        whole = (math.sqrt(fp32["calc_diff"]) + BF16_ROUNDING / math.sqrt(2)) ** 2
        assert whole <= bf16["calc_diff"] < whole + 1e-6


def test_bf16_logits_rounded_to_nearest_even_meet_the_bf16_contract_and_not_the_fp32_one():
    problem = random_problem([300, 200], next_n=2, heads=16, block_size=16, seed=8)
    ref, magnitude = problem.call(reference_and_magnitude)
    rounded = ref.to(torch.bfloat16)
    verdict = compare_logits(rounded, ref, magnitude)
    assert verdict["max_rel_error"] > CONTRACTS["fp8"]["max_rel_error"] and not meets_contract(verdict, "fp8")
    assert meets_contract(verdict, "exact", torch.bfloat16) and meets_contract(verdict, "fp8", torch.bfloat16)
    # Logits 1e-2 of their sum of |terms| off stay more than 5e-3 off after any rounding (at most 2**-8 of 1.01x it).
    off = torch.where(torch.isfinite(ref), ref + 1e-2 * magnitude, ref).to(torch.bfloat16)
    assert not meets_contract(compare_logits(off, ref, magnitude), "fp8", torch.bfloat16)


def test_calc_diff_refuses_shapes_that_differ():
    x = torch.randn(2, 3)
    with pytest.raises(ValueError, match=r"x has shape \[3\] but y \[2, 3\]"):
        calc_diff(x[0], x)
    with pytest.raises(TypeError, match="x must be a tensor, got list"):
        calc_diff([1.0], x)


def test_check_unchecked_logits_wants_nan_exactly_where_no_key_can_be_read():
    problem = random_problem([30, 12], next_n=2, heads=16, block_size=16, seed=6, max_model_len=40)
    tables = problem.block_tables.clone()
    tables[0, 1] = -1                                  # positions 16..29 of sequence 0
    right = problem.call(fp8_paged_mqa_logits_ref).float()
    right[0:2, 16:30] = math.nan
    right[0, 29] = -math.inf                           # row 0 sees positions <= 28 only
    verdict = check_unchecked_logits(right, problem, problem.context_lens, tables)
    assert verdict["nan_exact"] and verdict["nan"] == 13 + 14 and verdict["max_rel_error"] <= RTOL, verdict
    missing = right.clone()
    missing[1, 20] = 0.0
    assert not check_unchecked_logits(missing, problem, problem.context_lens, tables)["nan_exact"]
    extra = right.clone()
    extra[2, 3] = math.nan
    assert not check_unchecked_logits(extra, problem, problem.context_lens, tables)["nan_exact"]
