"""benchmarks/input_contract_gpu.py's logic on the CPU: the kernels as they were loaded from their files and run
beside the current ones, the GPU timers and the test run replaced (the timers refuse the interpreter)."""

import json
import subprocess

import pytest

from preshuffle import device, provenance
from preshuffle.kernels import launch
from preshuffle.shapes import Shape
from preshuffle.testing import inputs, timing

pytestmark = pytest.mark.skipif(not device.INTERPRETED, reason="checks the script's logic without a GPU timer")


def test_the_script_times_the_kernels_as_they_are_and_were_and_writes_json(load_benchmark, monkeypatch, tmp_path,
                                                                            capsys):
    script = load_benchmark("input_contract_gpu")
    baseline = tmp_path / "baseline"
    baseline.mkdir()
    for name in ("hopper", "portable"):  # what the lead's checkout holds at the script's base commit
        source = subprocess.run(["git", "show", f"{script.BASE}:src/preshuffle/kernels/{name}.py"],
                                cwd=script.ROOT, capture_output=True, text=True, check=True).stdout
        (baseline / f"{name}.py").write_text(source)
    monkeypatch.setattr(script, "run_tests", lambda: {"returncode": 0, "passed": 3, "seconds": 1.0, "failures": []})
    monkeypatch.setattr(timing, "time_ms", lambda fn, graph=True, clean_l2=False: (fn(), 0.25)[1])
    monkeypatch.setattr(timing, "host_us", lambda fn, calls=100, batch=10: (fn(), 7.0)[1])
    monkeypatch.setattr(script, "host_parts", lambda problem: ({"call": 14.0, "call_with_out": 12.0}, {}))
    monkeypatch.setattr(script, "VARIANTS", [("portable", Shape(2, 1, 100), 16, "normal", "exact"),
                                             ("hopper", Shape(2, 1, 100), 64, "normal", "fp8")])
    monkeypatch.setattr(script, "HOST_SHAPES", (Shape(2, 1, 100),))
    monkeypatch.setattr(launch, "multiprocessor_count", lambda: 132)   # an H200's, for the launch rules
    monkeypatch.setattr(script, "benchmark_problem",
                        lambda s, block_size, layout: inputs.benchmark_problem(s, block_size, layout, heads=16))
    script.main([str(tmp_path / "out.json"), "--baseline", str(baseline)])
    record = json.loads((tmp_path / "out.json").read_text())
    assert record["provenance"]["kernels"] == provenance.kernels_record("logits")
    assert provenance.broken_record_seals(record) == []
    assert record["base"] == script.BASE and record["tests"]["passed"] == 3
    portable, hopper = record["kernel_rows"]
    assert portable["now_us"] == portable["before_us"] == 250.0 and portable["change_pct"] == 0.0
    assert portable["bitwise_equal_to_before"] is True     # valid inputs: the contract changes no logit
    assert "error" in hopper                               # no sm90 GPU here
    host = record["host_rows"][0]
    assert host["parts"]["call"] == 14.0 and host["checked_call_us"] == host["checked_call_without_scale_check_us"]
    assert "portable  B=2 next_n=1 ctx=100" in capsys.readouterr().out


def test_the_script_records_a_baseline_it_cannot_load(load_benchmark, monkeypatch, tmp_path):
    script = load_benchmark("input_contract_gpu")
    monkeypatch.setattr(script, "VARIANTS", [])
    rows = script.kernel_rows(str(tmp_path / "missing"), budget=100)
    assert [r["baseline"] for r in rows] == ["hopper", "portable"] and all("FileNotFoundError" in r["error"]
                                                                           for r in rows)


def test_the_committed_run_kept_every_valid_logit_and_measured_what_the_contract_costs():
    """results/h200-input-contract.json: the kernels after the contract beside the kernels before it, on an H200."""
    from preshuffle.report import RESULTS

    run = json.loads((RESULTS / "h200-input-contract.json").read_text())
    assert run["provenance"]["gpu"] == "NVIDIA H200"
    rows = run["kernel_rows"]
    assert {r["kernel"] for r in rows} == {"hopper", "portable"} and all("error" not in r for r in rows)
    assert all(r["bitwise_equal_to_before"] is True for r in rows)  # valid inputs: the same bits as before
    for r in rows:
        assert r["change_pct"] == pytest.approx(100 * (r["now_us"] / r["before_us"] - 1))
    for host in run["host_rows"]:
        assert 0 < host["overlap_check_us"] < host["parts"]["call_with_out"]
        assert host["checked_call_us"] > host["checked_call_without_scale_check_us"]  # reading the scales costs
