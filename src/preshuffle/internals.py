"""Every private Triton and PyTorch internal the package reaches, in one place, and the releases it was written for.

None of these is an API: Triton or PyTorch may move or change any of them in a minor release, and a change shows
up as wrong numbers or a crash far from its cause. So the package reaches them only here (and in
``kernels/preset_launch.c``, which copies Triton's tensor-map object by its layout), and importing this module
checks the releases first: on any other Triton or PyTorch it raises a RuntimeError that names what it found and
what the code was written for. ``pyproject.toml`` admits the same releases.

What is reached, and why:

* Triton's interpreter's float conversion, which widens e4m3 NaN to 480 (:func:`keep_e4m3_nan`).
* Gluon's ``GluonASTSource`` and ``constexpr_function``: compiling a Gluon kernel for sm90a without a GPU, and
  constexpr helpers of the Gluon kernels.
* The C builder Triton builds its launchers with, and its CUDA headers (:func:`build_c_module`).
* A compiled kernel's launch metadata and Triton's tensor-descriptor encoding (:func:`launch_metadata`,
  :func:`encode_descriptor`), which the preset launch lays out once; Triton's own launcher called on a compiled
  kernel, for cluster launches (:func:`run_compiled`).
* PyTorch's current raw CUDA stream (:data:`raw_stream`) and the C++ ``TensorGuards`` that ``torch.compile``
  guards graphs with (:func:`tensor_guard`): 2 us a call cheaper than reading a tensor's attributes in Python.
* The driver's L2 flush inside ``triton.testing.do_bench`` (:func:`reading_l2_flush`).
"""

from __future__ import annotations

import contextlib
import re

import torch
import triton

# The oldest and newest (major, minor) release of each the code has run on.
WRITTEN_FOR = {"triton": ((3, 6), (3, 6)), "torch": ((2, 11), (2, 13))}


def release(version: str) -> tuple[int, int]:
    """(major, minor) of a version string such as ``2.13.0+cpu`` or ``3.6.0``."""
    if not isinstance(version, str):
        raise TypeError(f"version must be a str, got {type(version).__name__}")
    found = re.match(r"(\d+)\.(\d+)", version)
    if not found:
        raise ValueError(f"version must start with major.minor, got {version!r}")
    return int(found.group(1)), int(found.group(2))


def check_versions(versions: dict[str, str]) -> None:
    """Raise RuntimeError unless every package of ``versions`` (name -> version string) is a release of
    :data:`WRITTEN_FOR`."""
    for name, version in versions.items():
        if name not in WRITTEN_FOR:
            raise ValueError(f"versions names {name!r}, which is none of {sorted(WRITTEN_FOR)}")
        lo, hi = WRITTEN_FOR[name]
        if not lo <= release(version) <= hi:
            span = f"{lo[0]}.{lo[1]}" + ("" if lo == hi else f" to {hi[0]}.{hi[1]}")
            raise RuntimeError(f"preshuffle's kernels reach private {name} internals written for {name} {span}, and "
                               f"this process has {name} {version}: install {name} {span} (pyproject.toml admits "
                               f"it), or port preshuffle/internals.py to {version}")


check_versions({"triton": triton.__version__, "torch": torch.__version__})

from triton.runtime.jit import constexpr_function  # noqa: E402

# (device index) -> the handle of that device's current stream, as an int; None in a build of torch without CUDA
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)

__all__ = ["WRITTEN_FOR", "build_c_module", "check_versions", "cluster_ctas", "constexpr_function", "encode_descriptor",
           "gluon_source", "keep_e4m3_nan", "launch_metadata", "load_compiled", "raw_stream", "reading_l2_flush",
           "release", "run_compiled", "tensor_guard"]


def tensor_guard(*tensors: torch.Tensor):
    """A guard whose ``check(*tensors)`` holds where tensors match these in dtype, device, sizes and strides."""
    from torch._C._dynamo.guards import TensorGuards

    return TensorGuards(*tensors, dynamic_dims_sizes=None, dynamic_dims_strides=None)


def gluon_source(kernel, signature: dict, constexprs: dict, attrs: dict):
    """What ``triton.compile`` takes for a Gluon kernel of this signature, constexprs and attributes."""
    from triton.experimental.gluon._runtime import GluonASTSource

    return GluonASTSource(kernel, signature, constexprs, attrs)


def build_c_module(source: str, name: str):
    """A Python extension module built from C ``source`` with the CUDA headers, as Triton builds its launchers
    (once per source and platform, then loaded from Triton's cache)."""
    from triton.backends.nvidia.driver import include_dirs
    from triton.runtime.build import compile_module_from_src

    return compile_module_from_src(source, name, include_dirs=include_dirs)


def cluster_ctas(compiled) -> int:
    """CTAs a cluster of Triton's ``compiled`` kernel."""
    return compiled.metadata.num_ctas


def launch_metadata(compiled) -> dict:
    """What a launch of Triton's ``compiled`` kernel needs: the CUfunction, the signature, warps, dynamic shared
    memory, scratch bytes, and each tensor descriptor's encoding metadata (None for a tensor)."""
    num_warps, _, shared = compiled.packed_metadata
    return {"function": compiled.function, "signature": compiled.src.signature, "num_warps": num_warps,
            "shared": shared, "scratch": compiled.run.global_scratch_size + compiled.run.profile_scratch_size,
            "tensordesc_meta": compiled.metadata.tensordesc_meta}


def load_compiled(compiled) -> None:
    """Load Triton's ``compiled`` kernel onto the current CUDA device (what its first launch would do)."""
    compiled._init_handles()


def run_compiled(compiled, grid: tuple[int, int, int], cluster: int, stream: int, *args) -> None:
    """Launch Triton's loaded ``compiled`` kernel through its own launcher on ``grid``, in clusters of ``cluster``
    CTAs: ``args`` its arguments in its signature's order, constexprs included."""
    meta = (compiled.metadata.num_warps, cluster, compiled.metadata.shared)
    compiled.run(*grid, stream, compiled.function, meta, None, None, None, *args)


def encode_descriptor(descriptor, meta) -> list:
    """A host tensor descriptor as the launcher passes it: the CUDA tensor map, then its shape and strides."""
    from triton.backends.nvidia.driver import make_tensordesc_arg

    return make_tensordesc_arg(descriptor, meta)


@contextlib.contextmanager
def reading_l2_flush():
    """Within the block, ``triton.testing.do_bench`` flushes L2 by reading its buffer instead of writing zeros over
    it: L2 as cold for the kernel's data, but clean."""
    from triton.runtime import driver

    active = driver.active
    writing = active.clear_cache
    active.clear_cache = lambda cache: cache.sum()
    try:
        yield
    finally:
        active.clear_cache = writing


def keep_e4m3_nan() -> None:
    """Make Triton's interpreter convert e4m3 NaN (bytes 0x7F and 0xFF) to NaN, as a GPU's conversion does.

    Triton 3.6's interpreter widens fp8 by moving bit fields, with no case for NaN: an e4m3 NaN became 480 (-480),
    in casts and in ``tl.dot`` alike. The conversion is wrapped once; every other value converts exactly as
    before."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    convert = interpreter._convert_float
    if getattr(convert, "keeps_e4m3_nan", False):
        return

    def convert_keeping_nan(input, input_dtype, output_dtype, rounding_mode):
        output = convert(input, input_dtype, output_dtype, rounding_mode)
        if input_dtype == tl.float8e4nv and output_dtype.primitive_bitwidth > 8:
            nan = (input.view(np.uint8) & 0x7F) == 0x7F
            if nan.any():
                mantissa = output_dtype.fp_mantissa_width
                exponent = output_dtype.primitive_bitwidth - mantissa - 1
                quiet_nan = ((1 << exponent) - 1) << mantissa | 1 << (mantissa - 1)
                output = np.where(nan, output.dtype.type(quiet_nan), output)
        return output

    convert_keeping_nan.keeps_e4m3_nan = True
    interpreter._convert_float = convert_keeping_nan
