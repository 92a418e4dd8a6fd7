"""A launch whose parameters are laid out once: a call passes its stream and its tensors' addresses, six integers,
and the rest of the kernel's parameters are already in place (``preset_launch.c``).

Triton's C launcher parses every argument on every call: 50 for the Hopper kernel on 64-token pages (its 37,
constexprs and the tensor maps' shapes included, and 13 of the launcher's own). On the H200's host that cost 4.9-6.5
us a launch, this one 4.2-4.5; Triton's launcher on a kernel of one argument takes 4.0-5.3, most of it the driver's
(docs/kernel-design.md, "Host path"). The module is built by Triton's own builder, as Triton builds its launchers (a C
compiler and Python's headers, which Triton needs on a GPU machine anyway); it opens libcuda on the first launch, so
it also builds where there is no GPU."""

from __future__ import annotations

import functools
import re
import struct
from pathlib import Path

from ..internals import build_c_module, cluster_ctas, launch_metadata

# How each scalar parameter type of a Triton signature is laid out in the kernel's parameter space.
_FORMATS = {"i1": "<b", "i8": "<b", "i16": "<h", "i32": "<i", "i64": "<q", "u1": "<B", "u8": "<B", "u16": "<H",
            "u32": "<I", "u64": "<Q", "fp32": "<f", "fp64": "<d"}


@functools.cache
def module():
    """The compiled module (built once per source and platform, then loaded from Triton's cache)."""
    source = Path(__file__).with_name("preset_launch.c").read_text()
    return build_c_module(source, "preshuffle_preset_launch")


def expanded_types(signature: dict) -> list[str]:
    """The kernel's parameters in the order Triton's launcher passes them: a tensor descriptor becomes its tensor map
    (``nvTmaDesc``), then its shape (i32) and strides (i64); constexprs stay, to be skipped."""
    types = []
    for sig in signature.values():
        if sig.startswith("tensordesc"):
            ndim = re.match(r"tensordesc<[^[>]*\[([^]]*)\]", sig).group(1).count(",") + 1
            types += ["nvTmaDesc"] + ["i32"] * ndim + ["i64"] * ndim
        else:
            types.append(sig)
    return types


def parameters(types: list[str], values: tuple) -> tuple[tuple, tuple[int, ...]]:
    """Each non-constexpr parameter as bytes (a tensor map as Triton's object, copied by the module), with two
    empty scratch pointers at the end as Triton's launcher passes them; and the indices of the parameters whose value
    is None, the addresses each call fills in."""
    if len(types) != len(values):
        raise ValueError(f"{len(values)} values for {len(types)} parameters")
    params, slots = [], []
    for ty, value in zip(types, values):
        if ty == "constexpr":
            continue
        if value is None:
            slots.append(len(params))
            params.append(bytes(8))
        elif ty == "nvTmaDesc":
            params.append(value)
        elif ty.startswith("*"):
            params.append(struct.pack("<Q", value))
        elif ty in _FORMATS:
            params.append(struct.pack(_FORMATS[ty], value))
        else:
            raise ValueError(f"no layout for a parameter of type {ty!r}")
    return (*params, bytes(8), bytes(8)), tuple(slots)


def preset(compiled, values: tuple, grid: tuple[int, int], device: int):
    """``launch(stream, *addresses)`` for Triton's ``compiled`` kernel on ``grid``: ``values`` are its arguments
    in its signature's order, None where a call gives an address."""
    if cluster_ctas(compiled) != 1:
        raise ValueError("a preset launch takes kernels of one CTA a cluster")
    meta = launch_metadata(compiled)
    params, slots = parameters(expanded_types(meta["signature"]), values)
    mod = module()
    capsule = mod.make(meta["function"], grid[0], grid[1], 32 * meta["num_warps"], meta["shared"], device, params,
                       slots)
    return functools.partial(mod.launch, capsule)
