"""The DeepGEMM adapter on the CPU: which problems it refuses, what it hands DeepGEMM (through a stand-in module
that records its arguments), the flattened next_n = 1 problem, and the masking of unwritten positions."""

import types

import pytest
import torch

from preshuffle import deepgemm
from preshuffle.contract import kv_lengths
from preshuffle.reference import reference_and_magnitude
from preshuffle.testing.inputs import random_problem
from preshuffle.testing.numeric import check_logits, compare_logits


def problem_of(**kwargs):
    spec = dict(block_size=64, heads=32, seed=5, device="cpu")
    return random_problem([70, 130, 3], **{**spec, **kwargs})


@pytest.mark.parametrize("kwargs, reason", [
    (dict(block_size=16), "block size 16 normal: DeepGEMM takes 64-token natural blocks"),
    (dict(layout="shuffle"), "block size 64 shuffle: DeepGEMM takes 64-token natural blocks"),
    (dict(next_n=3), "next_n 3, 32 heads: its SM90 kernel takes next_n 1-2, 32 or 64 heads"),
    (dict(heads=16), "next_n 1, 16 heads: its SM90 kernel takes next_n 1-2, 32 or 64 heads"),
    (dict(next_n=2, ctx_2d=True), "2-D context lengths (this adapter takes 1-D)"),
])
def test_refusal_names_what_deepgemm_cannot_take(kwargs, reason):
    assert deepgemm.refusal(problem_of(**kwargs)) == reason
    with pytest.raises(ValueError, match=r"DeepGEMM cannot take this problem: " + reason.replace("(", r"\(")
                       .replace(")", r"\)")):
        deepgemm.logits_fn(types.SimpleNamespace(), problem_of(**kwargs))


@pytest.mark.parametrize("next_n", [1, 2])
def test_logits_fn_passes_each_row_its_visible_length_and_the_schedule(next_n):
    problem = problem_of(next_n=next_n)
    assert deepgemm.refusal(problem) is None
    seen = {}

    def metadata(visible, block_size, sms):
        seen["metadata"] = (visible.clone(), block_size, sms)
        return "schedule"

    def logits(q_pair, kv_cache, weights, visible, block_tables, schedule, max_model_len, clean):
        seen["call"] = (q_pair, kv_cache, weights, visible, block_tables, schedule, max_model_len, clean)
        return "logits"

    fake = types.SimpleNamespace(get_paged_mqa_logits_metadata=metadata, get_num_sms=lambda: 132,
                                 fp8_fp4_paged_mqa_logits=logits)
    fn = deepgemm.logits_fn(fake, problem)
    visible, block_size, sms = seen["metadata"]
    lens = problem.context_lens.tolist()
    assert visible.dtype == torch.int32 and visible.is_contiguous()
    assert visible.tolist() == [[n - next_n + j + 1 for j in range(next_n)] for n in lens]
    assert (block_size, sms) == (64, 132)
    assert fn() == "logits"
    q_pair, kv_cache, weights, passed, block_tables, schedule, max_model_len, clean = seen["call"]
    assert q_pair[0] is problem.q and q_pair[1] is None and kv_cache is problem.kv_cache
    assert weights is problem.weights and block_tables is problem.block_tables
    assert torch.equal(passed, visible) and schedule == "schedule"
    assert max_model_len == problem.max_model_len and clean is False


@pytest.mark.parametrize("next_n", [2, 3])
def test_flattened_rows_have_the_original_logits(next_n):
    problem = problem_of(next_n=next_n, heads=16)
    flat = deepgemm.flattened(problem)
    assert (flat.batch, flat.next_n) == (problem.batch * next_n, 1)
    assert flat.context_lens.tolist() == kv_lengths(problem.context_lens, next_n).reshape(-1).tolist()
    ref, magnitude = problem.call(reference_and_magnitude)
    verdict = compare_logits(flat.call(reference_and_magnitude)[0], ref, magnitude)
    assert verdict["same_inf_pattern"] and verdict["max_rel_error"] == 0.0 and verdict["finite"] > 0


def test_masked_like_sets_only_the_reference_masked_positions():
    problem = problem_of(next_n=2)
    ref, _ = problem.call(reference_and_magnitude)
    garbage = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float32)
    written = torch.where(torch.isneginf(ref), garbage, ref.float())
    assert not check_logits(written, problem)["same_inf_pattern"]
    masked = deepgemm.masked_like(written, ref)
    assert masked.dtype == torch.float32 and torch.equal(torch.isneginf(masked), torch.isneginf(ref))
    assert torch.equal(masked[torch.isfinite(ref)], written[torch.isfinite(ref)])
