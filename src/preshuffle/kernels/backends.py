"""The logits kernels, one row each: what a kernel takes (devices, precisions, layouts, query rows, heads, head dims,
page sizes) and the module that launches it. :func:`choose` reads the rows in order and nothing else, so a kernel for
another architecture is its module, its row and its tests.

A kernel's module provides ``launch(q, kv_cache, weights, context_lens, block_tables, max_model_len, dims, *,
layout, precision, support, config, out, clean) -> (out, repeat)``, where ``repeat`` launches the same call again
from the five tensors' addresses (None where the kernel keeps no launch), and ``alignment(block_size)``, the bytes
the cache's start must be a multiple of. Its module is imported on the first call it takes."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from ..device import KernelSupport
from .launch import HopperConfig, LaunchConfig, gathers


@dataclass(frozen=True)
class Backend:
    """One kernel: ``name`` (what :func:`preshuffle.kernels.kernel_for` answers), ``title`` (for messages), the
    devices it runs on in words and as a test of :class:`~preshuffle.device.KernelSupport`, what it takes (``None``:
    any), ``pages`` (why it cannot read pages of a size in a layout, or None), its launch config's type and the
    module that launches it."""

    name: str
    title: str
    devices: str
    runs_on: Callable[[KernelSupport], bool]
    precisions: tuple[str, ...]
    layouts: tuple[str, ...]
    max_next_n: int | None
    heads: tuple[int, ...] | None
    head_dims: tuple[int, ...] | None
    page_sizes: str
    pages: Callable[[int, str], str | None]
    config_type: type
    module: str

    def refuses(self, block_size: int, heads: int, head_dim: int, next_n: int, layout: str = "normal",
                precision: str | None = None) -> str | None:
        """Why this kernel cannot take a call of these dimensions, layout and precision, or None when it can."""
        if layout not in self.layouts:
            return f"the {layout} layout is not one of {self.layouts}"
        if precision is not None and precision not in self.precisions:
            return f"the {precision} precision is not one of {self.precisions}"
        if self.head_dims is not None and head_dim not in self.head_dims:
            return f"head_dim {head_dim} is not {' or '.join(map(str, self.head_dims))}"
        if self.heads is not None and heads not in self.heads:
            return f"{heads} heads is not {', '.join(map(str, self.heads[:-1]))} or {self.heads[-1]} (WGMMA's N)"
        if self.max_next_n is not None and next_n > self.max_next_n:
            return f"next_n {next_n} is above {self.max_next_n}"
        return self.pages(block_size, layout)

    def kernel(self):
        """The module that launches this kernel."""
        return importlib.import_module(self.module)


def _hopper_pages(block_size: int, layout: str) -> str | None:
    if layout == "shuffle" and gathers(block_size):
        return f"preshuffled pages of {block_size} tokens would be gathered, and the gather reads natural pages only"
    return None


HOPPER = Backend(
    name="hopper", title="Hopper", devices="an sm90 GPU (TMA, mbarriers, WGMMA)",
    runs_on=lambda support: support.capability == (9, 0), precisions=("fp8", "exact"),
    layouts=("normal", "shuffle"), max_next_n=4, heads=(16, 32, 64, 128), head_dims=(128,),
    page_sizes="natural pages of any size (16, 32 and multiples of 64 tokens through TMA, others gathered by "
               "cp.async); preshuffled pages through TMA only",
    pages=_hopper_pages, config_type=HopperConfig, module="preshuffle.kernels.hopper")

PORTABLE = Backend(
    name="portable", title="portable", devices="every GPU from sm80, and the CPU through Triton's interpreter",
    runs_on=lambda support: bool(support.precisions), precisions=("fp8", "exact"), layouts=("normal", "shuffle"),
    max_next_n=None, heads=None, head_dims=None,
    page_sizes="any size; preshuffled pages in multiples of 16 tokens (the cache's own check)",
    pages=lambda block_size, layout: None, config_type=LaunchConfig, module="preshuffle.kernels.portable")

# In the order dispatch prefers them; the last takes every call its device runs, so a call always has a kernel.
BACKENDS: tuple[Backend, ...] = (HOPPER, PORTABLE)


def config_types() -> tuple[type, ...]:
    return tuple(b.config_type for b in BACKENDS)


def owner(config) -> Backend:
    """The kernel a launch config is for; TypeError names the types there are."""
    for backend in BACKENDS:
        if isinstance(config, backend.config_type):
            return backend
    names = " or a ".join(t.__name__ for t in config_types())
    raise TypeError(f"config must be a {names}, got {type(config).__name__}")


def choose(support: KernelSupport, block_size: int, heads: int, head_dim: int, next_n: int, *,
           layout: str = "normal", precision: str | None = None, config=None) -> Backend:
    """The first kernel of :data:`BACKENDS` that runs on ``support``'s device and takes the call; with a ``config``,
    its kernel, or ValueError saying why it cannot run the call here."""
    if config is not None:
        wanted = owner(config)
        if not wanted.runs_on(support):
            raise ValueError(f"a {type(config).__name__} needs {wanted.devices}; {support.device} runs the "
                             f"{choose(support, block_size, heads, head_dim, next_n, layout=layout).name} kernel")
        reason = wanted.refuses(block_size, heads, head_dim, next_n, layout, precision)
        if reason:
            raise ValueError(f"the {wanted.title} kernel cannot take this call: {reason}")
        return wanted
    reasons = []
    for backend in BACKENDS:
        if backend.runs_on(support):
            reason = backend.refuses(block_size, heads, head_dim, next_n, layout, precision)
            if reason is None:
                return backend
            reasons.append(f"the {backend.title} kernel: {reason}")
        else:
            reasons.append(f"the {backend.title} kernel needs {backend.devices}")
    raise ValueError(f"no kernel takes this call on {support.device}: {'; '.join(reasons)}")
