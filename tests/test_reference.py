import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from preshuffle.problem import kernel_args, random_problem
from preshuffle.reference import (
    calc_diff, compare_logits, fp8_paged_mqa_logits_loops, fp8_paged_mqa_logits_ref, fp8_paged_mqa_logits_torch,
    logits_magnitude,
)


def test_one_token_one_head_by_hand():
    problem = random_problem([1], heads=16, block_size=1, seed=0)
    q, kv, w, ctx, bt, L = kernel_args(problem)
    out = fp8_paged_mqa_logits_ref(q, kv, w, ctx, bt, L)
    k = kv[bt[0, 0].item(), 0, 0, :128].view(torch.float8_e4m3fn).double()
    s = kv[bt[0, 0].item(), 0, 0, 128:].view(torch.float32).double()
    expected = sum(w[0, h].item() * max(s.item() * float(q[0, 0, h].double() @ k), 0.0) for h in range(16))
    assert out[0, 0].item() == pytest.approx(expected, rel=1e-12)
    assert torch.isneginf(out[0, 1:]).all()


@settings(max_examples=15)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=2), st.integers(1, 3),
       st.sampled_from([(1, "normal"), (16, "normal"), (16, "shuffle"), (32, "shuffle")]), st.booleans(),
       st.integers(0, 999))
def test_loops_vectorised_and_torch_agree(lens, next_n, block, ctx_2d, seed):
    block_size, layout = block
    problem = random_problem(lens, next_n=next_n, heads=16, block_size=block_size, layout=layout, ctx_2d=ctx_2d,
                             seed=seed)
    args = kernel_args(problem)
    ref = fp8_paged_mqa_logits_ref(*args, layout=layout)
    magnitude = logits_magnitude(*args, layout=layout)
    assert compare_logits(fp8_paged_mqa_logits_loops(*args, layout=layout), ref, magnitude)["max_rel_error"] < 1e-12
    verdict = compare_logits(fp8_paged_mqa_logits_torch(*args, layout=layout), ref, magnitude)
    assert verdict["same_inf_pattern"] and verdict["max_rel_error"] < 1e-5


def test_mtp_rows_see_one_more_position_each():
    problem = random_problem([10], next_n=3, block_size=16, max_model_len=12, seed=1)
    out = fp8_paged_mqa_logits_ref(*kernel_args(problem))
    assert [int(torch.isfinite(row).sum()) for row in out] == [8, 9, 10]


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
