"""The benchmark's logic on the CPU, with the GPU timers replaced (they refuse the interpreter)."""

import pytest
import torch

from preshuffle import benchmark, deepgemm, device, provenance, report
from preshuffle.kernels import launch
from preshuffle.reference import reference_and_magnitude
from preshuffle.shapes import ANCHOR_SHAPES, MTP_SHAPES, VARIANTS, Shape
from preshuffle.testing import inputs, timing

needs_interpreter = pytest.mark.skipif(not device.INTERPRETED, reason="checks the harness logic without a GPU timer")


@pytest.fixture
def stub_timer(monkeypatch):
    monkeypatch.setattr(timing, "time_ms", lambda fn, graph=True, clean_l2=False: 0.5)
    monkeypatch.setattr(benchmark, "REPEATS", 2)  # a run is slow under the interpreter


@pytest.fixture
def reference(small_benchmark_problem):
    return small_benchmark_problem.call(reference_and_magnitude)


@needs_interpreter
def test_measure_holds_each_precision_to_its_own_contract(small_benchmark_problem, reference, stub_timer):
    problem = small_benchmark_problem
    good = benchmark.kernel_fn(problem, "exact")
    row = benchmark.measure(good, problem, reference, precision="exact", copy_bytes_per_s=4e12)
    assert row["meets_contract"] and row["us"] == 500.0 and row["bytes"] == problem.bytes
    assert row["pct_copy"] == pytest.approx(100 * problem.bytes / 5e-4 / 4e12)
    nudged = lambda: good() * 1.0001  # noqa: E731 (1e-4 of each logit: outside exact, inside fp8)
    exact = benchmark.measure(nudged, problem, reference, precision="exact", copy_bytes_per_s=4e12)
    assert not exact["meets_contract"] and "us" not in exact
    assert benchmark.measure(nudged, problem, reference, precision="fp8", copy_bytes_per_s=4e12)["meets_contract"]


@needs_interpreter
def test_measure_records_a_run_that_does_not_repeat(small_benchmark_problem, reference, stub_timer):
    good, calls = benchmark.kernel_fn(small_benchmark_problem, "exact"), []

    def drifting():
        calls.append(None)
        out = good()
        out[0, 0] += 1e-3 * len(calls)  # a visible position: each run differs from the one before
        return out

    row = benchmark.measure(drifting, small_benchmark_problem, reference, precision="fp8", copy_bytes_per_s=4e12)
    assert row["bitwise_repeatable"] is False


@needs_interpreter
def test_measure_masks_positions_deepgemm_leaves_unwritten(small_benchmark_problem, reference, stub_timer):
    good = benchmark.kernel_fn(small_benchmark_problem, "exact")
    garbage = lambda: torch.where(torch.isneginf(good()), 7.0, good())  # noqa: E731
    kwargs = dict(precision="fp8", copy_bytes_per_s=4e12)
    assert not benchmark.measure(garbage, small_benchmark_problem, reference, **kwargs)["meets_contract"]
    assert benchmark.measure(garbage, small_benchmark_problem, reference, masked=True, **kwargs)["meets_contract"]


@needs_interpreter
def test_measure_holds_another_split_to_the_checked_output(small_benchmark_problem, reference, stub_timer):
    good = benchmark.kernel_fn(small_benchmark_problem, "exact")
    checked = good()
    row = benchmark.measure(good, small_benchmark_problem, reference, precision="exact", copy_bytes_per_s=4e12,
                            checked=checked)
    assert row["bitwise_equal_to_rule"] and row["meets_contract"]
    off = checked.clone()
    off[0, 0] = torch.nextafter(off[0, 0], torch.tensor(float("inf")))
    row = benchmark.measure(good, small_benchmark_problem, reference, precision="exact", copy_bytes_per_s=4e12,
                            checked=off)
    assert not row["bitwise_equal_to_rule"] and not row["meets_contract"] and "us" not in row


@needs_interpreter
def test_run_measures_every_cache_and_precision_and_report_reads_it(monkeypatch, stub_timer):
    shape = Shape(2, 1, 100)
    monkeypatch.setattr(timing, "refuse_interpreter", lambda: None)
    monkeypatch.setattr(timing, "copy_bandwidth", lambda: 4e12)
    monkeypatch.setattr(timing, "host_us", lambda fn: 9.0)
    profile = {"us": 9.5, "cpu_share": 1.0, "python_loop_us": 3.0, "preempted": 0, "other_threads_cpu_ms": 0.0}
    monkeypatch.setattr(timing, "host_profile", lambda fn: profile)
    monkeypatch.setattr(timing, "floor_ms", lambda: 0.004)
    monkeypatch.setattr(launch, "multiprocessor_count", lambda: 132)
    monkeypatch.setattr(deepgemm, "load", lambda: None)
    monkeypatch.setattr(benchmark, "LADDER_SHAPES", (shape,))
    monkeypatch.setattr(benchmark, "HOST_SHAPES", (shape,))
    monkeypatch.setattr(benchmark, "benchmark_problem",
                        lambda s, block_size, layout, **kw: inputs.benchmark_problem(s, block_size, layout, heads=16,
                                                                                     **kw))
    record = benchmark.run([shape], ("block1", "block64-normal"))
    rows = record["rows"]
    loops = [r for r in rows if r["kernel"] == "loops"]
    assert len(loops) == 1 and loops[0]["meets_contract"] and loops[0]["us"] > 0  # timed on the host, not stubbed
    assert loops[0]["positions"] == benchmark.LOOPS_POSITIONS and loops[0]["finite"] <= benchmark.LOOPS_POSITIONS
    assert all(r["meets_contract"] and r["us"] == 500.0 for r in rows if r["kernel"] != "loops")
    rules = [(r["variant"], r["precision"], r["timing"]) for r in rows if r.get("rule")]
    assert rules == [("block1", "fp8", "graph"), ("block1", "exact", "graph"), ("block64-normal", "fp8", "graph"),
                     ("block64-normal", "exact", "graph"), ("block64-normal", "fp8", "eager"),
                     ("block64-normal", "fp8", "graph-clean-l2")]
    chapter3 = [step for step, _, _, _ in benchmark.triton_ladder(inputs.random_problem([5]))]
    assert [(r["chapter"], r["step"]) for r in rows if r.get("step")] == [
        (3, "scalar loops (Python)"), (3, "vectorised PyTorch, float64 (the reference)"),
        (3, "vectorised PyTorch, fp32"), *((3, step) for step in chapter3),
        (5, "chapter 3's kernel (exact)"), (5, "fp8 MMA")]
    assert [r["kernel"] for r in rows if not r.get("rule") and not r.get("step")] == []  # the baseline is a step
    assert [s["step"] for s in report.ladder(record, shape, chapter=3)][-1] == "scales a chunk ahead"
    # The portable kernel launches through Triton's JIT every call: no kept launch whose parts to time alone.
    # The call's time and its profile are one measurement.
    assert [{k: v for k, v in h.items() if k != "sha256"} for h in record["host_us"]] == [
        {"shape": {"batch": 2, "next_n": 1, "avg_ctx": 100}, "kernel": "portable", "us": 9.5,
         "parts": {"call_through_problem": 9.0, "call_with_out": 9.0}, "profile": profile}]
    # Tied to its code and inputs: the kernels' digest, each row's seed and inputs, every figure sealed.
    assert record["provenance"]["kernels"] == provenance.kernels_record("bench")
    assert provenance.broken_record_seals(record) == []
    block1 = inputs.benchmark_problem(shape, 1, "normal", heads=16, seed=benchmark.SEED)
    assert {r["inputs_sha256"] for r in rows if r["variant"] == "block1"} == {inputs.input_digest(block1)}
    assert record["timer_floor_us"] == 4.0
    summary = report.summary(record)[0]
    assert summary["block1_over_block64"] == 1.0 and summary["deepgemm_us"] is None
    assert summary["eager_minus_graph_us"] == 0.0 and summary["torch_over_fp8"] == 1.0


@needs_interpreter
@pytest.mark.parametrize("branch, native", [("nv_dev", {1, 4}), ("main", {1})])
def test_run_times_deepgemm_natively_where_its_build_takes_next_n_and_flattened_elsewhere(monkeypatch, stub_timer,
                                                                                          stand_in_deepgemm, branch,
                                                                                          native):
    """nv_dev takes next_n = 4 natively, on one scheduler slot per two SMs; main, and every build at next_n = 3, get
    the rows flattened to next_n = 1. The record names the build."""
    monkeypatch.setattr(timing, "refuse_interpreter", lambda: None)
    monkeypatch.setattr(timing, "copy_bandwidth", lambda: 4e12)
    monkeypatch.setattr(timing, "floor_ms", lambda: 0.004)
    monkeypatch.setenv("PRESHUFFLE_DEEPGEMM_BRANCH", branch)
    monkeypatch.setenv("PRESHUFFLE_DEEPGEMM_COMMIT", "0123abc")
    calls = stand_in_deepgemm.calls
    monkeypatch.setattr(deepgemm, "load", lambda: stand_in_deepgemm)
    monkeypatch.setattr(benchmark, "benchmark_problem",
                        lambda s, block_size, layout, **kw: inputs.benchmark_problem(s, block_size, layout, heads=32,
                                                                                     **kw))
    shapes = [Shape(2, 1, 100), Shape(2, 3, 100), Shape(2, 4, 100)]
    record = benchmark.run(shapes, ("block64-normal",), steps=False, torch_baseline=False)
    assert record["deepgemm"] == {"version": "2.5.0", "branch": branch, "commit": "0123abc", "source": "environment"}
    rows = {r["shape"]["next_n"]: r for r in record["rows"] if r["kernel"].startswith("deepgemm")}
    assert {n for n, r in rows.items() if r["kernel"] == "deepgemm"} == native
    assert {n for n, r in rows.items() if r["kernel"] == "deepgemm-flattened"} == {3, 4} - native
    assert all(r["meets_contract"] for r in rows.values())
    assert rows[4]["schedule_slots"] == (66 if branch == "nv_dev" else 132) and rows[3]["schedule_slots"] == 132
    assert {next_n for next_n, _ in calls} == ({1, 4} if branch == "nv_dev" else {1})
    assert report.summary(record)[2]["deepgemm"] == ("deepgemm" if branch == "nv_dev" else "deepgemm-flattened")


def test_the_benchmark_runs_multi_token_prediction_on_deepgemms_cache_and_16_token_pages():
    jobs = benchmark._jobs([Shape(64, 2, 8192), Shape(64, 4, 8192)], VARIANTS)
    assert [name for shape, name in jobs if shape.next_n == 2] == list(VARIANTS)
    assert [name for shape, name in jobs if shape.next_n == 4] == ["block16-normal", "block16-shuffle",
                                                                   "block64-normal"]
    assert MTP_SHAPES == (Shape(64, 3, 8192), Shape(256, 3, 8192), Shape(64, 4, 8192), Shape(256, 4, 8192))


def test_torch_baseline_fits_only_where_its_keys_and_scores_fit():
    # B * 1.3 ctx * (128 + 2 * next_n * 64) fp32 values: B=4096 ctx 8K and B=256 next_n=2 ctx 64K exceed 24 GiB.
    fits = [benchmark.torch_baseline_fits(shape) for shape in ANCHOR_SHAPES]
    assert fits == [True, True, True, True, False, True, True, False]


@pytest.mark.skipif(not device.INTERPRETED, reason="a GPU process may time kernels")
def test_run_refuses_the_interpreter():
    with pytest.raises(RuntimeError, match="refusing to time Triton's interpreter"):
        benchmark.run(ANCHOR_SHAPES[:1])


def test_chapter_5_ladder_runs_a_program_a_sequence_before_its_split_step():
    problem = inputs.random_problem([70, 129], block_size=64, seed=2)
    steps = benchmark.ladder(problem)
    # On other caches the ladder stops at the portable steps: its plain TMA step reads natural 64-token pages.
    assert len(benchmark.ladder(inputs.random_problem([70, 129], seed=2))) == 2
    split = [(name, programs) for name, _, _, _, programs in steps]
    assert split[:2] == [("chapter 3's kernel (exact)", 1), ("fp8 MMA", 1)]
    if device.current_support().hopper:  # the Gluon steps too, the launch rule's split last
        assert len(split) > 3 and all(p == 1 for _, p in split[:-1]) and split[-1][1] > 1, split
    else:
        assert len(split) == 2, split
    reference = problem.call(reference_and_magnitude)[0]
    for _, _, precision, fn, _ in steps:
        out = fn()
        assert torch.equal(torch.isinf(out), torch.isinf(reference.to(out.device)))
