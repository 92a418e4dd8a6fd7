"""benchmarks/deepgemm_test_gpu.py's logic on the CPU: small cases and shapes, a stand-in DeepGEMM, the GPU timers
replaced (they refuse the interpreter)."""

import json

import pytest
import torch

from preshuffle import benchmark, deepgemm, device, provenance
from preshuffle.report import RESULTS
from preshuffle.shapes import Shape
from preshuffle.testing import deepgemm_checks, inputs, timing


@pytest.mark.skipif(not device.INTERPRETED, reason="checks the script's logic without a GPU timer")
def test_the_script_checks_every_case_times_both_and_writes_json_and_a_log(load_benchmark, monkeypatch, tmp_path,
                                                                            stand_in_deepgemm, capsys):
    script = load_benchmark("deepgemm_test_gpu")
    monkeypatch.setattr(timing, "refuse_interpreter", lambda: None)
    monkeypatch.setattr(timing, "copy_bandwidth", lambda: 4e12)
    monkeypatch.setattr(timing, "time_ms", lambda fn, graph=True, clean_l2=False: 0.5)
    monkeypatch.setattr(benchmark, "REPEATS", 2)
    monkeypatch.setenv("PRESHUFFLE_DEEPGEMM_BRANCH", "main")
    monkeypatch.setenv("PRESHUFFLE_DEEPGEMM_COMMIT", "54e2261")
    monkeypatch.setattr(deepgemm, "load", lambda: stand_in_deepgemm)
    small = (deepgemm_checks.PagedCase(2, 1, 32, 100), deepgemm_checks.PagedCase(2, 3, 32, 100, block_kv=16))
    monkeypatch.setattr(script, "cases", lambda which: small)
    monkeypatch.setattr(script, "TIMED_SHAPES", (Shape(2, 1, 100),))
    monkeypatch.setattr(script, "VLLM_SHAPE", Shape(2, 2, 100))
    monkeypatch.setattr(script, "VLLM_MAX_MODEL_LEN", 256)
    monkeypatch.setattr(script, "benchmark_problem",
                        lambda s, block_size, layout: inputs.benchmark_problem(s, block_size, layout, heads=32))
    assert script.main([str(tmp_path), "--reruns", "2"]) == 0
    record = json.loads((tmp_path / "deepgemm-test-main.json").read_text())
    assert record["provenance"]["kernels"] == provenance.kernels_record("logits")
    assert provenance.broken_record_seals(record) == []
    assert record["deepgemm"]["commit"] == "54e2261" and record["provenance"]["torch"] == torch.__version__
    first, second = record["checks"]
    assert first["ours"]["passed"] and first["deepgemm"]["passed"]
    assert second["ours"]["passed"] and "deepgemm" not in second
    assert second["deepgemm_refused"].startswith("block size 16 normal")
    timed = {(r["shape"]["next_n"], r["max_model_len"] == 256, r["who"], r["logits"], r["clean_logits"])
             for r in record["timings"] if r["us"] == 500.0 and r["meets_contract"]}
    for next_n, vllm in ((1, False), (2, True)):
        assert {(next_n, vllm, who, dtype, False) for who in ("ours", "deepgemm") for dtype in ("fp32", "bf16")} | {
            (next_n, vllm, "ours", "fp32", True)} <= timed
    out = capsys.readouterr().out
    table = out[out.index("shape "):]
    assert "ours passed 2 of 2 cases; DeepGEMM passed 1 of 1 it takes" in table
    assert "B=2 next_n=2 ctx=100 L=256" in table and (tmp_path / "deepgemm-test-main.log").read_text().strip()


def test_the_script_runs_deepgemms_cases_and_ours(load_benchmark):
    script = load_benchmark("deepgemm_test_gpu")
    assert script.cases("all") == deepgemm_checks.SM90_CASES + deepgemm_checks.OUR_CASES
    assert script.cases("sm90") == deepgemm_checks.SM90_CASES and script.cases("ours") == deepgemm_checks.OUR_CASES
    assert script.cases("none") == ()
    assert len(script.TIMED_SHAPES) == 8 and sum(s.next_n == 1 for s in script.TIMED_SHAPES) == 6


def test_the_committed_run_passed_deepgemms_test_on_every_case_beside_deepgemm():
    """results/h200-deepgemm-test.json (and its log): every SM90 case DeepGEMM enumerates and ours, on an H200."""
    run = json.loads((RESULTS / "h200-deepgemm-test.json").read_text())
    labels = [row["label"] for row in run["checks"]]
    assert labels == [case.label for case in deepgemm_checks.SM90_CASES + deepgemm_checks.OUR_CASES]
    assert all(row["ours"]["passed"] and row["ours"]["bitwise_repeatable"] for row in run["checks"])
    native = [row for row in run["checks"] if "deepgemm" in row]
    assert len(native) == len(deepgemm_checks.SM90_CASES) and all(row["deepgemm"]["passed"] for row in native)
    assert run["deepgemm"]["branch"] == "main" and run["provenance"]["gpu"] == "NVIDIA H200"
    # Every timing was checked against float64 by its contract before it was timed, and both wrote bf16 logits
    # with the same error.
    assert run["timings"] and all(t["meets_contract"] and "us" in t for t in run["timings"])
    bf16 = {(json.dumps(t["shape"]), t.get("max_model_len"), t["who"]): t["max_rel_error"] for t in run["timings"]
            if t["logits"] == "bf16"}
    for (shape, length, who), error in bf16.items():
        if who == "ours" and (shape, length, "deepgemm") in bf16:
            assert error <= 1.1 * bf16[(shape, length, "deepgemm")]
    log = (RESULTS / "h200-deepgemm-test.log").read_text()
    assert f"ours passed {len(labels)} of {len(labels)} cases" in log
