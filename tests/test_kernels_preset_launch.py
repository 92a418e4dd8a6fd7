"""The preset launch: the Hopper kernel's parameters laid out once, and the C module's refusals (built here with
Triton's builder; it opens libcuda only to launch)."""

import shutil
import sysconfig
import types
from pathlib import Path

import pytest

from preshuffle.kernels import preset_launch
from preshuffle.kernels.hopper import sm90a_source

BUILDS = (shutil.which("gcc") or shutil.which("clang")) and Path(sysconfig.get_paths()["include"], "Python.h").exists()
needs_compiler = pytest.mark.skipif(not BUILDS, reason="needs a C compiler and Python's headers (as Triton on a GPU)")


@pytest.mark.parametrize("block_size", [64, 1])
def test_the_hopper_kernels_parameters_are_laid_out_in_its_launchers_order(block_size):
    """Descriptors (pages TMA can copy) or pointers (gathered pages), the five addresses a call gives, five i32
    dimensions, no constexprs, and the two empty scratch pointers Triton's launcher appends."""
    signature = sm90a_source(block_size=block_size)[0].signature
    types = preset_launch.expanded_types(signature)
    if block_size == 64:
        assert types[:14] == ["*fp8e4nv", "nvTmaDesc", "i32", "i32", "i32", "i64", "i64", "i64",
                              "nvTmaDesc", "i32", "i32", "i64", "i64", "*fp32"]
        cache = ("map", 1, 64, 128, 8448, 128, 1, "map", 1, 2112, 2112, 1)
    else:
        assert types[:4] == ["*fp8e4nv", "*fp8e4nv", "*fp32", "*fp32"]
        cache = (0x1000, 0x1000)
    dims = (7, 8, 9, 10, 11)
    constexprs = (0,) * (len(types) - 1 - len(cache) - 4 - len(dims))
    params, slots = preset_launch.parameters(types, (None, *cache, None, None, None, None, *dims, *constexprs))
    assert slots == (0, 1 + len(cache), 2 + len(cache), 3 + len(cache), 4 + len(cache))
    assert len(params) == 1 + len(cache) + 4 + len(dims) + 2
    assert [p for p in params if p == "map"] == (["map", "map"] if block_size == 64 else [])
    assert params[-7:-2] == tuple(d.to_bytes(4, "little") for d in dims)
    assert params[-2:] == (bytes(8), bytes(8))
    if block_size == 64:
        assert params[2:8] == (b"\x01\0\0\0", b"@\0\0\0", b"\x80\0\0\0", (8448).to_bytes(8, "little"),
                               (128).to_bytes(8, "little"), (1).to_bytes(8, "little"))


def test_parameters_refuse_what_they_cannot_lay_out():
    with pytest.raises(ValueError, match="2 values for 1 parameters"):
        preset_launch.parameters(["i32"], (1, 2))
    with pytest.raises(ValueError, match="no layout for a parameter of type 'bf16'"):
        preset_launch.parameters(["bf16"], (1.0,))


def test_preset_refuses_a_kernel_of_clusters_before_reading_anything_else():
    compiled = types.SimpleNamespace(metadata=types.SimpleNamespace(num_ctas=2))  # no signature, no function
    with pytest.raises(ValueError, match="^a preset launch takes kernels of one CTA a cluster$"):
        preset_launch.preset(compiled, (), (1, 1), 0)


@needs_compiler
def test_the_module_refuses_bad_presets_and_calls_without_a_driver_or_with_the_wrong_addresses():
    mod = preset_launch.module()
    preset = mod.make(1, 2, 3, 256, 1024, 0, (b"\x01" * 8, b"\x02" * 4, bytes(8)), (0, 2))
    with pytest.raises(TypeError, match="launch: 2 addresses, got 1"):
        mod.launch(preset, 0, 5)
    with pytest.raises(TypeError, match=r"launch\(preset, stream, \*addresses\)"):
        mod.launch(preset)
    for params, slots, error, message in [
            ((b"",), (), ValueError, r"params\[0\]: 1 to 128 bytes, got 0"),
            ((b"x" * 129,), (), ValueError, r"params\[0\]: 1 to 128 bytes, got 129"),
            ((1,), (), TypeError, r"params\[0\]: bytes or a Triton tensor map of this Triton's layout, got int"),
            ((b"x",), (1,), ValueError, r"address_slots\[0\]: an index of params, got 1"),
            ((b"x",), (-1,), ValueError, r"address_slots\[0\]: an index of params, got -1"),
            ((b"x",), (0,) * 9, ValueError, r"address_slots: at most 8, got 9")]:
        with pytest.raises(error, match=message):
            mod.make(1, 1, 1, 32, 0, 0, params, slots)
    if shutil.which("nvidia-smi") is None:
        with pytest.raises(RuntimeError, match="cannot open libcuda.so.1"):
            mod.launch(preset, 0, 5, 6)
