"""The top-k kernels, one row each: the devices a kernel runs on, the largest k it counts to, whether it takes an
empty launch, its launch config's type, its default launch and its launch. :func:`choose` reads the rows in order
and nothing else, so a top-k for another architecture is its module, its row and its tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..device import KernelSupport
from . import hopper, portable


@dataclass(frozen=True)
class TopKBackend:
    """One top-k kernel. ``default(rows, width, elem_bytes)`` is its launch for logits of that many rows, that
    wide, of elements that many bytes; ``narrow(config, width, elem_bytes)`` says why a launch cannot cover rows that
    wide (None where it can); ``launch(logits, lengths, out, k, next_n, ctx_2d, config)`` runs it on checked
    inputs."""

    name: str
    devices: str
    runs_on: Callable[[KernelSupport], bool]
    max_k: int | None
    takes_empty: bool
    config_type: type
    default: Callable
    narrow: Callable
    launch: Callable

    def refuses(self, rows: int, width: int, k: int) -> str | None:
        """Why this kernel does not take ``rows`` rows of logits ``width`` wide for a top-``k``, or None."""
        if self.max_k is not None and k > self.max_k:
            return f"k must be at most {self.max_k} for the {self.name} kernel, got {k}"
        if not self.takes_empty and not (rows and width):
            return f"the {self.name} kernel launches no empty grid ({rows} rows of {width} positions)"
        return None


HOPPER = TopKBackend(
    name="sm90", devices="an sm90 GPU (shared-memory atomics, thread-block clusters)",
    runs_on=lambda support: support.capability == (9, 0), max_k=hopper.MAX_K, takes_empty=False,
    config_type=hopper.HopperTopKConfig, default=hopper.default_config, launch=hopper.launch_topk_hopper,
    narrow=lambda config, width, elem_bytes: None if config.reach(elem_bytes) >= width else (
        f"config reaches {config.reach(elem_bytes)} positions a row (cluster x segment), fewer than the logits' "
        f"{width}"))

PORTABLE = TopKBackend(
    name="Triton", devices="every GPU Triton compiles for, and the CPU through its interpreter",
    runs_on=lambda support: True, max_k=None, takes_empty=True, config_type=portable.TopKConfig,
    default=lambda rows, width, elem_bytes: portable.default_config(width), launch=portable.launch_topk,
    narrow=lambda config, width, elem_bytes: None)

# In the order the default launch prefers them; the last takes every call.
BACKENDS: tuple[TopKBackend, ...] = (HOPPER, PORTABLE)


def owner(config) -> TopKBackend:
    """The kernel a launch config is for; TypeError names the types there are."""
    for backend in BACKENDS:
        if isinstance(config, backend.config_type):
            return backend
    names = " or a ".join(b.config_type.__name__ for b in BACKENDS)
    raise TypeError(f"config must be a {names}, got {type(config).__name__}")


def choose(support: KernelSupport, rows: int, width: int, k: int) -> TopKBackend:
    """The first kernel of :data:`BACKENDS` that runs on ``support``'s device and takes the call."""
    return next(b for b in BACKENDS if b.runs_on(support) and b.refuses(rows, width, k) is None)


def check_owner(config, support: KernelSupport, k: int, width: int, elem_bytes: int) -> TopKBackend:
    """``config``'s kernel, or ValueError where it cannot run on ``support``'s device, count to ``k`` or cover rows
    ``width`` wide of elements ``elem_bytes`` bytes."""
    backend = owner(config)
    if not backend.runs_on(support):
        others = " or a ".join(b.config_type.__name__ for b in BACKENDS if b.runs_on(support))
        raise ValueError(f"config is a {type(config).__name__}, for the {backend.name} kernel, which {support.device} "
                         f"cannot run: pass a {others}")
    if backend.max_k is not None and k > backend.max_k:
        raise ValueError(f"k must be at most {backend.max_k} for the {backend.name} kernel (config is a "
                         f"{type(config).__name__}), got {k}")
    reason = backend.narrow(config, width, elem_bytes)
    if reason:
        raise ValueError(reason)
    return backend
