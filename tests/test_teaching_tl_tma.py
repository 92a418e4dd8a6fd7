"""Chapter 5's first Hopper step (plain Triton through a TMA descriptor): compiled only, so what runs here is what it
refuses, before any descriptor is built."""

import pytest

from preshuffle.teaching.tl_tma import tl_tma_logits
from preshuffle.testing.inputs import random_problem


@pytest.mark.parametrize("kwargs, got", [
    ({"block_size": 16}, "got normal blocks of 16, head_dim 128, next_n 1"),
    ({"layout": "shuffle"}, "got shuffle blocks of 64, head_dim 128, next_n 1"),
    ({"head_dim": 64}, "got normal blocks of 64, head_dim 64, next_n 1"),
    ({"next_n": 3}, "got normal blocks of 64, head_dim 128, next_n 3"),
    ({"next_n": 2, "ctx_2d": True}, "got normal blocks of 64, head_dim 128, next_n 2")])
def test_tl_tma_logits_refuses_what_the_step_does_not_take(kwargs, got):
    problem = random_problem([70], **{"block_size": 64, "heads": 16, "device": "cpu", **kwargs})
    with pytest.raises(ValueError, match=r"^the tl TMA step takes natural 64-token blocks, head_dim 128, next_n a "
                                         rf"power of two and 1-D context_lens, {got}$"):
        problem.call(tl_tma_logits, tokens_per_program=64)
