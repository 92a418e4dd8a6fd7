"""Which build of torch ``make setup`` puts into .venv. Prints one of ``cpu``, ``cuda`` or ``system``.

The Makefile asks before anything is installed, so this file imports nothing but the standard library (no
torch, no preshuffle). ``TORCH`` (the argument) says what the user wants:

* ``auto`` (the default): ``cuda`` where ``nvidia-smi -L`` lists a GPU, else ``cpu``;
* ``cpu``: the pins of constraints-cpu.txt, torch 2.13.0 (a CPU build where one is on the machine) and the
  Triton 3.6.0 whose interpreter the notebooks' outputs were recorded with;
* ``cuda``: PyPI's torch, a CUDA build on Linux x86_64, with the Triton it pins;
* ``system``: a venv that sees the system's site-packages, so pip keeps a torch and Triton already installed.
"""

from __future__ import annotations

import subprocess
import sys

REQUESTS = ("auto", "cpu", "cuda", "system")


def nvidia_gpu_listed(run=subprocess.run) -> bool:
    """Whether ``nvidia-smi -L`` runs and lists at least one GPU (no driver, no GPU or a hung driver: False)."""
    try:
        listing = run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return listing.returncode == 0 and any(line.startswith("GPU ") for line in listing.stdout.splitlines())


def choose(request: str, gpu_listed: bool) -> str:
    """The build for ``request`` (one of REQUESTS) on a machine where a GPU is listed or not. Pure."""
    if request not in REQUESTS:
        raise ValueError(f"TORCH must be one of {', '.join(REQUESTS)}, got {request!r}")
    if request == "auto":
        return "cuda" if gpu_listed else "cpu"
    return request


def main(argv: list[str]) -> int:
    request = argv[0] if argv else "auto"
    try:
        # Only "auto" needs the probe: an explicit choice never waits on nvidia-smi.
        print(choose(request, request == "auto" and nvidia_gpu_listed()))
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
