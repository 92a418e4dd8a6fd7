"""The top-k's backend table: where each kernel runs, what it takes, and the default launch read from it."""

import pytest

from preshuffle import device
from preshuffle.topk import backends, hopper, portable
from preshuffle.topk.backends import BACKENDS, HOPPER, PORTABLE, check_owner, choose

SM90, SM89, CPU = device.kernel_support((9, 0)), device.kernel_support((8, 9)), device.kernel_support(None)


def test_choose_takes_the_sm90_kernel_on_sm90_for_what_it_counts_to():
    assert choose(SM90, 64, 10_000, 2048) is HOPPER
    assert choose(SM90, 64, 10_000, hopper.MAX_K + 1) is PORTABLE
    assert choose(SM90, 0, 10_000, 2048) is choose(SM90, 64, 0, 2048) is PORTABLE  # no empty grid
    assert choose(SM89, 64, 10_000, 2048) is choose(CPU, 64, 10_000, 2048) is PORTABLE


def test_each_row_gives_its_own_config_type_as_its_default():
    for backend in BACKENDS:
        assert isinstance(backend.default(64, 10_000, 4), backend.config_type), backend.name


def test_check_owner_says_why_a_config_cannot_run():
    small = hopper.HopperTopKConfig(warps=4, chunks=1, candidates=128, rank_limit=64)
    assert check_owner(small, SM90, 8, small.reach(4), 4) is HOPPER
    assert check_owner(portable.default_config(100), CPU, 10**6, 100, 4) is PORTABLE
    with pytest.raises(ValueError, match=r"^config is a HopperTopKConfig, for the sm90 kernel, which .* cannot run: "
                                         r"pass a TopKConfig$"):
        check_owner(small, CPU, 8, 64, 4)
    with pytest.raises(ValueError, match=r"^k must be at most 32767 for the sm90 kernel \(config is a "):
        check_owner(small, SM90, hopper.MAX_K + 1, 64, 4)
    with pytest.raises(ValueError, match=r"^config reaches \d+ positions a row \(cluster x segment\)"):
        check_owner(small, SM90, 8, small.reach(4) + 1, 4)
    with pytest.raises(TypeError, match="^config must be a HopperTopKConfig or a TopKConfig, got dict$"):
        backends.owner({})
