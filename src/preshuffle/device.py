"""Where kernels run: compiled on a CUDA GPU, or under Triton's interpreter on the CPU; and which kernel paths
a GPU can run.

Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, so this module must be imported before any
kernel module; ``preshuffle/__init__.py`` imports it first. An explicit ``TRITON_INTERPRET`` set by the user
wins.
"""

import os
import platform
from dataclasses import dataclass

import torch

from .precision import PRECISIONS

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Where tensors must live for the kernels of this process.
KERNEL_DEVICE = "cpu" if INTERPRETED else "cuda"


def keep_e4m3_nan_in_the_interpreter() -> None:
    """Make Triton's interpreter convert e4m3 NaN to NaN, as a GPU's conversion does
    (:func:`preshuffle.internals.keep_e4m3_nan`): without it a NaN in q or in the cache gave finite logits on the
    CPU only. The kernel modules call this where they import Triton; compiled, it does nothing."""
    if INTERPRETED:
        from .internals import keep_e4m3_nan

        keep_e4m3_nan()

# Compute capabilities, from Triton 3.6: its README supports NVIDIA GPUs from 8.0; its NVIDIA backend
# (backends/nvidia/compiler.py) admits float8e4nv, the e4m3 type of the cache, only from 8.9, for loads, for the
# conversion to fp16 (cvt.rn.f16x2.e4m3x2) and for tl.dot alike: below it the fp8 path cannot compile, and the
# exact path decodes e4m3 bytes with integer instructions instead; wgmma and the TMA of the Hopper kernel exist on
# sm90 alone (sm100 has tcgen05 instead, sm120 mma.sync).
TRITON_MIN = (8, 0)
FP8E4NV_MIN = (8, 9)
HOPPER = (9, 0)


@dataclass(frozen=True)
class KernelSupport:
    """What one device can run: the kernel paths (``precisions``, in preference order), whether the sm90
    TMA/WGMMA kernel can run, what it lacks, for error messages ("" when nothing is missing), and whether Triton
    has the e4m3 type there (``fp8_types``; without it the exact path decodes the bytes itself)."""

    device: str
    capability: tuple[int, int] | None
    precisions: tuple[str, ...]
    hopper: bool
    missing: str
    fp8_types: bool = True

    @property
    def default_precision(self) -> str:
        """fp8 where fp8 MMAs exist (sm89 and newer), else exact: under the interpreter (which computes both exactly)
        and on sm80-sm86."""
        if not self.precisions:
            raise ValueError(f"{self.device} can run no kernel path: it lacks {self.missing}")
        return self.precisions[0]


def kernel_support(capability: tuple[int, int] | None, name: str = "") -> KernelSupport:
    """What a GPU of compute ``capability`` (``None``: Triton's interpreter) can run. Pure: no GPU needed."""
    if capability is None:
        return KernelSupport("CPU (Triton interpreter)", None, ("exact", "fp8"), False,
                             "the sm90 TMA/WGMMA kernel, which only compiles for a Hopper GPU")
    if (not isinstance(capability, tuple) or len(capability) != 2
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in capability)):
        raise TypeError(f"capability must be None or a (major, minor) tuple of two ints >= 0, got {capability!r}")
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    device = f"{name or 'NVIDIA GPU'} (sm{capability[0]}{capability[1]})"
    lacks = []
    if capability < TRITON_MIN:
        lacks.append("compute capability 8.0, the oldest Triton supports")
        precisions = ()
    elif capability < FP8E4NV_MIN:
        lacks.append("compute capability 8.9, from which Triton compiles fp8 e4m3 (float8e4nv) loads, conversions "
                     "and dots: the fp8 path needs them (the exact path decodes e4m3 with integer instructions)")
        precisions = ("exact",)
    else:
        precisions = ("fp8", "exact")
    hopper = capability == HOPPER
    if not hopper:
        lacks.append("the sm90 TMA/WGMMA of the Hopper kernel")
    return KernelSupport(device, capability, precisions, hopper, "; ".join(lacks), capability >= FP8E4NV_MIN)


def current_support() -> KernelSupport:
    """What this process can run: the interpreter's support, or that of the current CUDA device."""
    if INTERPRETED:
        return kernel_support(None)
    return kernel_support(tuple(torch.cuda.get_device_capability()), torch.cuda.get_device_name())


def require_precision(precision: str, support: KernelSupport | None = None) -> None:
    """Raise ValueError unless ``precision`` names a kernel path that ``support`` (default: this process) runs."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    support = support or current_support()
    if precision not in support.precisions:
        raise ValueError(f"{support.device} cannot run the {precision} kernel path: it lacks {support.missing}")


def require_fp8_types(what: str, support: KernelSupport | None = None) -> None:
    """Raise ValueError unless Triton has the e4m3 type on this process's device (``support``): ``what`` (a kernel
    that views the cache as fp8) cannot compile without it."""
    support = support or current_support()
    if not support.fp8_types:
        raise ValueError(f"{what} views the cache as Triton's e4m3 type, which {support.device} lacks (compute "
                         f"capability 8.9): run it on the CPU (TRITON_INTERPRET=1), or call "
                         f"fp8_paged_mqa_logits(..., precision='exact'), which decodes e4m3 here")


def require_kernel_devices(**tensors: torch.Tensor) -> None:
    """Raise ValueError naming the first of ``tensors`` (by keyword) that cannot feed a kernel in this process."""
    for name, tensor in tensors.items():
        if INTERPRETED and tensor.device.type != "cpu":
            raise ValueError(f"{name} is on {tensor.device}, but kernels run under Triton's interpreter here: pass "
                             f"CPU tensors")
        if not INTERPRETED and tensor.device.type != "cuda":
            raise ValueError(f"{name} is on {tensor.device}, but kernels are compiled for CUDA in this process: pass "
                             f"CUDA tensors, or set TRITON_INTERPRET=1 before importing preshuffle to run on the CPU")


def memory_bytes(dev: torch.device) -> int | None:
    """The memory a device holds in all (a GPU's, or the machine's for the CPU); None for other devices."""
    if dev.type == "cuda":
        return torch.cuda.get_device_properties(dev).total_memory
    if dev.type == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return None


def describe() -> str:
    if INTERPRETED:
        return "Triton interpreter on the CPU (numpy semantics; timings are not kernel timings)"
    return f"compiled Triton on {torch.cuda.get_device_name()}"


def version_report(package_version: str) -> str:
    """What ``python -m preshuffle --version`` prints: versions, the device, and the kernel paths it runs."""
    import triton

    support = current_support()
    paths = ", ".join(p + (" (default)" if p == support.precisions[0] else "") for p in support.precisions)
    lines = [f"preshuffle {package_version} (Python {platform.python_version()})",
             f"torch {torch.__version__} ({f'CUDA {torch.version.cuda}' if torch.version.cuda else 'no CUDA'}), "
             f"Triton {triton.__version__}",
             f"device: {support.device}",
             f"kernels: {describe()}",
             f"kernel paths: {paths or 'none'}",
             f"Hopper TMA/WGMMA kernel: {'yes' if support.hopper else 'no'}"]
    if support.missing:
        lines.append(f"lacks: {support.missing}")
    return "\n".join(lines)
