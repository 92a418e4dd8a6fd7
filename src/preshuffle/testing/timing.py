"""GPU timers: ``triton.testing.do_bench`` medians with L2 flushed, CUDA-graph replays, and the HBM copy ceiling.
They refuse Triton's interpreter, whose timings are not kernel timings."""

from __future__ import annotations

import torch

from .. import device


def refuse_interpreter() -> None:
    if device.INTERPRETED:
        raise RuntimeError("refusing to time Triton's interpreter: interpreter timings are not kernel timings")


def time_ms(fn, *, graph: bool = True, warmup: int = 25, rep: int = 100) -> float:
    """Median milliseconds of ``fn`` by ``triton.testing.do_bench``, which flushes L2 before every run.

    With ``graph`` the call is captured once in a CUDA graph and its replays are timed, so the figure is the
    kernel's, not Python's launch overhead (vLLM runs decode under CUDA graphs too)."""
    refuse_interpreter()
    import triton.testing
    if graph:
        fn()  # compile outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        fn = g.replay
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def copy_bandwidth(nbytes: int = 4 << 30) -> float:
    """The HBM ceiling: a large device-to-device copy, bytes read + written per second."""
    refuse_interpreter()
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), graph=False, rep=200)
    return 2 * nbytes / (ms * 1e-3)
