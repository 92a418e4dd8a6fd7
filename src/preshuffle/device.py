"""Where kernels run: compiled on a CUDA GPU, or under Triton's interpreter on the CPU.

Triton reads ``TRITON_INTERPRET`` when a kernel is decorated, so this module must be imported before any
kernel module; ``preshuffle/__init__.py`` imports it first. An explicit ``TRITON_INTERPRET`` set by the user
wins.
"""

import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") == "1"
# Where tensors must live for the kernels of this process.
KERNEL_DEVICE = "cpu" if INTERPRETED else "cuda"


def kernel_device_error(tensor: torch.Tensor, name: str) -> str | None:
    """Why ``tensor`` cannot feed a kernel in this process, or None when it can."""
    if INTERPRETED and tensor.device.type != "cpu":
        return f"{name} is on {tensor.device}, but kernels run under Triton's interpreter here: pass CPU tensors"
    if not INTERPRETED and tensor.device.type != "cuda":
        return (f"{name} is on {tensor.device}, but kernels are compiled for CUDA in this process: pass CUDA "
                f"tensors, or set TRITON_INTERPRET=1 before importing preshuffle to run on the CPU")
    return None


def describe() -> str:
    if INTERPRETED:
        return "Triton interpreter on the CPU (numpy semantics; timings are not kernel timings)"
    return f"compiled Triton on {torch.cuda.get_device_name()}"
