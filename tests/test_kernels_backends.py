"""The backend table: what each kernel takes, and dispatch reading it."""

import pytest

from preshuffle import device
from preshuffle.kernels import backends, hopper, launch
from preshuffle.kernels.backends import BACKENDS, HOPPER, PORTABLE, choose

SM90, SM89 = device.kernel_support((9, 0), "H200"), device.kernel_support((8, 9), "L4")
CPU = device.kernel_support(None)


def test_the_hopper_row_names_what_it_cannot_take():
    supports = HOPPER.refuses
    assert supports(16, 64, 128, 4) is None and supports(256, 16, 128, 1) is None
    assert supports(1, 64, 128, 1) is None and supports(24, 32, 128, 2) is None  # gathered by cp.async
    assert supports(64, 64, 64, 1) == "head_dim 64 is not 128"
    assert supports(64, 24, 128, 1) == "24 heads is not 16, 32, 64 or 128 (WGMMA's N)"
    assert supports(64, 64, 128, 5) == "next_n 5 is above 4"
    assert supports(48, 64, 128, 1) is None and supports(192, 64, 128, 1, "shuffle") is None
    assert supports(48, 64, 128, 1, "shuffle") == ("preshuffled pages of 48 tokens would be gathered, and the gather "
                                                   "reads natural pages only")



def test_the_hopper_row_holds_the_kernels_own_dimensions():
    assert HOPPER.head_dims == (hopper.HEAD_DIM,)
    assert HOPPER.config_type is launch.HopperConfig and PORTABLE.config_type is launch.LaunchConfig


def test_every_row_names_a_module_that_launches_it():
    for backend in BACKENDS:
        kernel = backend.kernel()
        assert callable(kernel.launch) and kernel.alignment(64) in (4, 16), backend.name


def test_rows_say_where_they_run():
    assert [b.name for b in BACKENDS if b.runs_on(SM90)] == ["hopper", "portable"]
    assert [b.name for b in BACKENDS if b.runs_on(SM89)] == [b.name for b in BACKENDS if b.runs_on(CPU)] == ["portable"]
    assert not any(b.runs_on(device.kernel_support((7, 5))) for b in BACKENDS)


def test_choose_takes_the_first_row_that_takes_the_call():
    assert choose(SM90, 64, 64, 128, 1) is HOPPER
    assert choose(SM90, 64, 64, 128, 5) is PORTABLE
    assert choose(CPU, 64, 64, 128, 1) is PORTABLE
    assert choose(SM90, 64, 64, 128, 1, precision="exact") is HOPPER


def test_choose_with_a_config_takes_its_kernel_or_says_why_not():
    assert choose(SM90, 64, 64, 128, 5, config=launch.LaunchConfig()) is PORTABLE
    needs = r"^a HopperConfig needs an sm90 GPU .*; L4 \(sm89\) runs the portable kernel$"
    with pytest.raises(ValueError, match=needs):
        choose(SM89, 64, 64, 128, 1, config=launch.HopperConfig(1))
    with pytest.raises(ValueError, match="^the Hopper kernel cannot take this call: next_n 5 is above 4$"):
        choose(SM90, 64, 64, 128, 5, config=launch.HopperConfig(1))
    with pytest.raises(TypeError, match="^config must be a HopperConfig or a LaunchConfig, got dict$"):
        choose(SM90, 64, 64, 128, 1, config={})


def test_choose_refuses_a_device_no_row_runs_on():
    with pytest.raises(ValueError, match=r"^no kernel takes this call on .*sm75.*the portable kernel needs every GPU"):
        choose(device.kernel_support((7, 5)), 64, 64, 128, 1)


def test_a_row_refuses_what_it_does_not_list():
    assert PORTABLE.refuses(64, 64, 128, 1, "tiled") == "the tiled layout is not one of ('normal', 'shuffle')"
    assert backends.Backend.refuses(HOPPER, 64, 64, 128, 1, precision="fp4") == (
        "the fp4 precision is not one of ('fp8', 'exact')")
