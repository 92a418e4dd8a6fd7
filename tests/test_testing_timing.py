"""The host-time profile's account of what else ran: its GPU parts stubbed, a call timed on the CPU."""

import threading
import time

import pytest

from preshuffle.testing import timing


@pytest.fixture
def cpu_timing(monkeypatch):
    monkeypatch.setattr(timing, "refuse_interpreter", lambda: None)
    monkeypatch.setattr(timing.torch.cuda, "synchronize", lambda: None)


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.skipif(timing._thread_activity() is None, reason="needs Linux's /proc")
def test_host_profile_counts_a_busy_thread_beside_the_timed_one(cpu_timing):
    # 0.1 s of calls, ten of the 10 ms clock ticks the CPU share is counted in (a shorter run can fall between them).
    quiet = timing.host_profile(lambda: spin(1e-3), calls=100, batch=10)
    assert quiet["us"] >= 1000 and 0.5 < quiet["cpu_share"] <= 1.01 and 0 < quiet["python_loop_us"] < quiet["us"]
    stop = threading.Event()
    worker = threading.Thread(target=lambda: [spin(1e-3) for _ in iter(stop.is_set, True)])
    worker.start()
    try:
        busy = timing.host_profile(lambda: spin(1e-3), calls=100, batch=10)  # 0.1 s: the worker spins throughout
    finally:
        stop.set()
        worker.join()
    assert busy["other_threads_cpu_ms"] >= 30, busy  # clock ticks are 10 ms: the worker's ~100 ms shows
    assert isinstance(quiet["preempted"], int) and isinstance(busy["preempted"], int)


def test_host_profile_without_proc_still_times(cpu_timing, monkeypatch):
    monkeypatch.setattr(timing, "_thread_activity", lambda: None)
    profile = timing.host_profile(lambda: spin(1e-4), calls=10, batch=5)
    assert profile["us"] >= 100 and profile["preempted"] is None and profile["other_threads_cpu_ms"] is None
