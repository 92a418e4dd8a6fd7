import pytest

from preshuffle import device
from preshuffle.kernels.steps import one_block_logits, per_block_grid_logits
from preshuffle.reference import fp8_paged_mqa_logits_ref, logits_magnitude
from preshuffle.testing.inputs import random_problem
from preshuffle.testing.numeric import check_logits, compare_logits

DEV = device.KERNEL_DEVICE


@pytest.fixture
def problem():
    return random_problem([40, 17, 0], block_size=16, seed=7, device=DEV)


def test_per_block_grid_logits_matches_the_reference(problem):
    verdict = check_logits(problem.call(per_block_grid_logits), problem)
    assert verdict["same_inf_pattern"] and verdict["max_rel_error"] < 1e-5
    with pytest.raises(ValueError, match="step 2 handles next_n = 1"):
        random_problem([5], next_n=2, block_size=16, device=DEV).call(per_block_grid_logits)
    with pytest.raises(ValueError, match="the normal layout only, got .* layout 'shuffle'"):
        random_problem([5], block_size=16, layout="shuffle", device=DEV).call(per_block_grid_logits)


def test_one_block_logits_matches_the_reference(problem):
    q, kv, w, _, bt, _ = problem.args
    block = one_block_logits(q[0, 0], kv[bt[0, 0]], w[0])
    ref, magnitude = problem.call(fp8_paged_mqa_logits_ref), problem.call(logits_magnitude)
    assert compare_logits(block, ref[0, :16], magnitude[0, :16])["max_rel_error"] < 1e-5
    with pytest.raises(TypeError, match="q_row must be float8_e4m3fn"):
        one_block_logits(q[0, 0].float(), kv[0], w[0])
