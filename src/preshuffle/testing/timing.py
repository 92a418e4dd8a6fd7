"""GPU timers: ``triton.testing.do_bench`` medians with L2 flushed, CUDA-graph replays, and the HBM copy ceiling.
They refuse Triton's interpreter, whose timings are not kernel timings."""

from __future__ import annotations

import torch

from .. import device


def refuse_interpreter() -> None:
    if device.INTERPRETED:
        raise RuntimeError("refusing to time Triton's interpreter: interpreter timings are not kernel timings")


def time_ms(fn, *, graph: bool = True, clean_l2: bool = False, warmup: int = 25, rep: int = 100) -> float:
    """Median milliseconds of ``fn`` by ``triton.testing.do_bench``, which flushes L2 before every run.

    With ``graph`` the call is captured once in a CUDA graph and its replays are timed, so the figure is the
    kernel's, not Python's launch overhead (vLLM runs decode under CUDA graphs too). do_bench flushes by writing
    zeros over a 256 MB buffer, which leaves L2 full of dirty lines that the timed kernel's reads must first write
    back; ``clean_l2`` flushes by reading that buffer instead (L2 as cold for the kernel's data, but clean), to
    measure what the write-backs cost."""
    refuse_interpreter()
    import triton.testing
    from triton.runtime import driver

    if graph:
        fn()  # compile outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        fn = g.replay
    if not clean_l2:
        return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    active = driver.active
    writing = active.clear_cache
    active.clear_cache = lambda cache: cache.sum()
    try:
        return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    finally:
        active.clear_cache = writing


def host_us(fn, calls: int = 100, batch: int = 10) -> float:
    """Microseconds of host time per call of ``fn`` (what Python and the launcher cost, the GPU left to itself):
    after a warm-up, ``calls`` calls in batches of ``batch``, each batch timed on the host and the GPU drained
    between batches, so that a queue of pending kernels never holds a launch back; the median batch's time per
    call."""
    refuse_interpreter()
    import statistics
    import time

    for _ in range(5):
        fn()
    per_call = []
    for _ in range(calls // batch):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(batch):
            fn()
        per_call.append((time.perf_counter() - start) / batch)
    torch.cuda.synchronize()
    return statistics.median(per_call) * 1e6


def floor_ms(**kwargs) -> float:
    """What :func:`time_ms` gives a kernel that does nothing (one element, replayed from a CUDA graph): the launch
    and the timer, under which no kernel's time falls."""
    one = torch.zeros(1, device="cuda")
    return time_ms(lambda: one.add_(1.0), **kwargs)


def copy_bandwidth(nbytes: int = 4 << 30) -> float:
    """The HBM ceiling: a large device-to-device copy, bytes read + written per second."""
    refuse_interpreter()
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), graph=False, rep=200)
    return 2 * nbytes / (ms * 1e-3)
