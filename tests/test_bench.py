"""The benchmark harness's logic on the CPU, with the GPU timer replaced (it refuses the interpreter)."""

import pytest

from preshuffle import bench, device
from preshuffle.kernels import LaunchConfig


@pytest.fixture
def inputs():
    return bench.build_inputs(bench.Shape(3, 2, 120), 16, "shuffle", heads=16)


def test_inputs_follow_the_spec(inputs):
    ctx = inputs["context_lens"]
    assert ((ctx >= int(0.7 * 120)) & (ctx <= int(1.3 * 120))).all()
    tables = inputs["block_tables"]
    used = [tables[b, :-(-int(n) // 16)] for b, n in enumerate(ctx)]
    ids = sorted(int(i) for row in used for i in row)
    assert ids == list(range(inputs["kv_cache"].shape[0]))          # every block used once: a permutation
    assert inputs["kv_cache"].ne(0).any(dim=-1).all()               # no all-zero records


def test_bytes_and_flops_are_counted_as_the_spec_says(inputs):
    q, w, bt, n = inputs["q"], inputs["weights"], inputs["block_tables"], inputs["sum_ctx"]
    assert bench.count_bytes(inputs) == n * 132 + q.numel() + w.numel() * 4 + bt.numel() * 4 + n * 2 * 4
    assert bench.count_flops(inputs) == 2 * n * 2 * 16 * 128


@pytest.mark.skipif(not device.INTERPRETED, reason="checks the harness logic without a GPU timer")
def test_splits_are_checked_then_compared_bitwise(inputs, monkeypatch):
    monkeypatch.setattr(bench, "time_ms", lambda fn, graph=True: 0.5)
    configs = [LaunchConfig(64, 64), LaunchConfig(64, 128), LaunchConfig(64, 192)]
    rows = bench.measure_splits(inputs, configs, copy_bytes_per_s=4e12)
    assert [r["meets_rtol"] for r in rows] == [True] * 3
    assert "bitwise_equal_to_checked_split" not in rows[0]
    assert all(r["bitwise_equal_to_checked_split"] for r in rows[1:])
    assert all(r["us"] == 500.0 and r["pct_copy"] == pytest.approx(100 * r["bytes"] / 5e-4 / 4e12) for r in rows)


@pytest.mark.skipif(not device.INTERPRETED, reason="checks the harness logic without a GPU timer")
def test_an_inaccurate_variant_is_not_timed(inputs, monkeypatch):
    monkeypatch.setattr(bench, "time_ms", lambda fn, graph=True: 0.5)
    good = bench.kernel_fn(inputs)
    row = bench.measure(lambda: good() * 1.001, inputs, copy_bytes_per_s=4e12)
    assert not row["meets_rtol"] and "us" not in row
    timed = bench.measure(lambda: good() * 1.001, inputs, copy_bytes_per_s=4e12, require_accuracy=False)
    assert timed["us"] == 500.0 and timed["max_rel_error"] > bench.RTOL
