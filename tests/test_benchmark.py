"""The benchmark's logic on the CPU, with the GPU timer replaced (it refuses the interpreter)."""

import pytest

from preshuffle import benchmark, device
from preshuffle.kernels import LaunchConfig
from preshuffle.shapes import ANCHOR_SHAPES
from preshuffle.testing import timing
from preshuffle.testing.numeric import RTOL

needs_interpreter = pytest.mark.skipif(not device.INTERPRETED, reason="checks the harness logic without a GPU timer")


@pytest.fixture
def stub_timer(monkeypatch):
    monkeypatch.setattr(timing, "time_ms", lambda fn, graph=True: 0.5)


@needs_interpreter
def test_measure_splits_checks_the_first_then_compares_bitwise(small_benchmark_problem, stub_timer):
    configs = [LaunchConfig(64, 64), LaunchConfig(64, 128), LaunchConfig(64, 192)]
    rows = benchmark.measure_splits(small_benchmark_problem, configs, copy_bytes_per_s=4e12)
    assert [r["meets_rtol"] for r in rows] == [True] * 3
    assert "bitwise_equal_to_checked_split" not in rows[0]
    assert all(r["bitwise_equal_to_checked_split"] and r["bitwise_repeatable"] for r in rows[1:])
    assert all(r["us"] == 500.0 and r["pct_copy"] == pytest.approx(100 * r["bytes"] / 5e-4 / 4e12) for r in rows)
    assert all(r["bytes"] == small_benchmark_problem.bytes for r in rows)


@needs_interpreter
def test_measure_does_not_time_an_inaccurate_variant(small_benchmark_problem, stub_timer):
    good = benchmark.kernel_fn(small_benchmark_problem)
    row = benchmark.measure(lambda: good() * 1.001, small_benchmark_problem, copy_bytes_per_s=4e12)
    assert not row["meets_rtol"] and "us" not in row
    timed = benchmark.measure(lambda: good() * 1.001, small_benchmark_problem, copy_bytes_per_s=4e12,
                              require_accuracy=False)
    assert timed["us"] == 500.0 and timed["max_rel_error"] > RTOL


@needs_interpreter
def test_measure_records_a_run_that_does_not_repeat(small_benchmark_problem, stub_timer):
    good, calls = benchmark.kernel_fn(small_benchmark_problem), []

    def drifting():
        calls.append(None)
        out = good()
        out[0, 0] += 1e-3 * len(calls)  # a visible position: each run differs from the one before
        return out

    row = benchmark.measure(drifting, small_benchmark_problem, copy_bytes_per_s=4e12, require_accuracy=False)
    assert row["bitwise_repeatable"] is False
    assert benchmark.measure(good, small_benchmark_problem, copy_bytes_per_s=4e12)["bitwise_repeatable"] is True


def test_torch_baseline_fits_only_where_its_keys_and_scores_fit():
    # B * 1.3 ctx * (128 + 2 * next_n * 64) fp32 values: B=4096 ctx 8K and B=256 next_n=2 ctx 64K exceed 24 GiB.
    fits = [benchmark.torch_baseline_fits(shape) for shape in ANCHOR_SHAPES]
    assert fits == [True, True, True, True, False, True, True, False]


@pytest.mark.skipif(not device.INTERPRETED, reason="a GPU process may time kernels")
def test_run_refuses_the_interpreter():
    with pytest.raises(RuntimeError, match="refusing to time Triton's interpreter"):
        benchmark.run(ANCHOR_SHAPES[:1])
