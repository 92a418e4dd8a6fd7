"""GPU timers: ``triton.testing.do_bench`` medians with L2 flushed, CUDA-graph replays, and the HBM copy ceiling;
the host's time per call, with what else the host did meanwhile. They refuse Triton's interpreter, whose timings
are not kernel timings."""

from __future__ import annotations

import os
import statistics
import threading
import time

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

    from ..internals import reading_l2_flush

    if graph:
        fn()  # compile outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        fn = g.replay
    if not clean_l2:
        return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")
    with reading_l2_flush():
        return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def host_us(fn, calls: int = 100, batch: int = 10) -> float:
    """Microseconds of host time per call of ``fn`` (what Python and the launcher cost, the GPU left to itself):
    after a warm-up, ``calls`` calls in batches of ``batch``, each batch timed on the host and the GPU drained
    between batches, so that a queue of pending kernels never holds a launch back; the median batch's time per
    call."""
    return host_profile(fn, calls, batch)["us"]


def host_profile(fn, calls: int = 100, batch: int = 10) -> dict:
    """:func:`host_us` (``us``) with what the host did meanwhile, to tell a slow call from a busy host:
    ``cpu_share``, the calling thread's CPU time over the batches' wall time (below 1: it was preempted or
    blocked while timed); ``python_loop_us``, the median time of a fixed loop of 200 Python additions timed after
    each batch (the host's speed: a call and this loop slow down together on a slow host); and, where Linux's /proc
    is readable (None elsewhere), ``preempted``, the calling thread's involuntary context switches over the whole
    measurement, and ``other_threads_cpu_ms``, the CPU time the process's other threads used meanwhile (a busy
    worker can share the timed thread's core)."""
    refuse_interpreter()
    for _ in range(5):
        fn()
    before = _thread_activity()
    wall, cpu, loop = [], [], []
    for _ in range(calls // batch):
        torch.cuda.synchronize()
        start, start_cpu = time.perf_counter(), time.thread_time()
        for _ in range(batch):
            fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.thread_time() - start_cpu)
        start = time.perf_counter()
        _python_loop()
        loop.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    after = _thread_activity()
    profile = {"us": statistics.median(wall) / batch * 1e6, "cpu_share": sum(cpu) / sum(wall),
               "python_loop_us": statistics.median(loop) * 1e6, "preempted": None, "other_threads_cpu_ms": None}
    if before and after:
        profile["preempted"] = after["preempted"] - before["preempted"]
        profile["other_threads_cpu_ms"] = sum(ticks - before["others"].get(tid, 0)
                                              for tid, ticks in after["others"].items()) * 1e3 / before["hz"]
    return profile


def _python_loop() -> int:
    total = 0
    for i in range(200):
        total += i
    return total


def _thread_activity() -> dict | None:
    """This thread's involuntary context switches and the CPU clock ticks of every other thread of the process,
    from /proc; None where it cannot be read."""
    me = threading.get_native_id()
    try:
        others = {}
        for tid in os.listdir("/proc/self/task"):
            if int(tid) != me:
                with open(f"/proc/self/task/{tid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                others[int(tid)] = int(fields[11]) + int(fields[12])  # utime + stime
        with open(f"/proc/self/task/{me}/status") as f:
            preempted = next(int(line.split()[1]) for line in f if line.startswith("nonvoluntary_ctxt_switches"))
        return {"preempted": preempted, "others": others, "hz": os.sysconf("SC_CLK_TCK")}
    except (OSError, ValueError, StopIteration):  # a thread that ended meanwhile, or no /proc
        return None


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
