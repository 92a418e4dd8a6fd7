"""benchmarks/vllm_call_gpu.py's logic on the CPU: small shapes, a stand-in DeepGEMM, the GPU timer replaced by one
that gives each call its own times (the timers refuse the interpreter)."""

import json

import pytest

from preshuffle import benchmark, deepgemm, device, provenance
from preshuffle.kernels import launch
from preshuffle.shapes import Shape
from preshuffle.testing import inputs, timing


@pytest.mark.skipif(not device.INTERPRETED, reason="builds its problems on the interpreter's device")
def test_widened_keeps_the_rows_and_pads_the_tables_with_unread_entries(load_benchmark):
    script = load_benchmark("vllm_call_gpu")
    problem = inputs.random_problem([70, 129], next_n=2, block_size=16, seed=1)
    wide = script.widened(problem, 1000)
    assert wide.max_model_len == 1000 and wide.sum_ctx == problem.sum_ctx
    assert wide.block_tables.shape == (2, 63)
    assert (wide.block_tables[:, :problem.block_tables.shape[1]] == problem.block_tables).all()
    assert (wide.block_tables[:, problem.block_tables.shape[1]:] == 0).all()
    with pytest.raises(ValueError, match=f"width must be at least the rows' own {problem.max_model_len}, got 10"):
        script.widened(problem, 10)


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "0"], "--rounds must be at least 1, got 0"),
    (["--configs", "{stages: 8}"], "is not JSON"),
    (["--configs", "[8]"], "expected a JSON object"),
    (["--configs", '{"stages": 1}'], "stages must be in [2, 12], got 1"),
    (["--configs", '{"warps": 8}'], "unexpected keyword argument 'warps'"),
    (["--configs", '{"next_n": 2}'], "next_n must be a list of ints, got 2"),
    (["--configs", '{"layout": "mfma"}'], "layout must be 'normal' or 'shuffle', got 'mfma'"),
    (["--configs", '{"block_size": 0}'], "block_size must be a positive int, got 0"),
])
def test_main_refuses_bad_arguments_before_timing(load_benchmark, tmp_path, capsys, argv, message):
    script = load_benchmark("vllm_call_gpu")
    with pytest.raises(SystemExit) as exit_info:
        script.main([str(tmp_path / "v.json"), *argv])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "v.json").exists()


@pytest.mark.skipif(not device.INTERPRETED, reason="checks the script's logic without a GPU timer")
def test_the_script_checks_both_widths_times_them_in_rounds_and_writes_json(load_benchmark, monkeypatch, tmp_path,
                                                                             stand_in_deepgemm, capsys):
    script = load_benchmark("vllm_call_gpu")
    times = {}

    def time_ms(fn, graph=True, clean_l2=False):  # each call its own times, 1, 2, 3 ... ms in turn
        times[fn] = times.get(fn, 0) + 1
        return float(times[fn])

    monkeypatch.setattr(timing, "refuse_interpreter", lambda: None)
    monkeypatch.setattr(timing, "copy_bandwidth", lambda: 4e12)
    monkeypatch.setattr(timing, "time_ms", time_ms)
    monkeypatch.setattr(launch, "multiprocessor_count", lambda: 132)
    monkeypatch.setattr(script, "REPEATS", 2)
    monkeypatch.setenv("PRESHUFFLE_DEEPGEMM_BRANCH", "main")
    monkeypatch.setenv("PRESHUFFLE_DEEPGEMM_COMMIT", "54e2261")
    monkeypatch.setattr(deepgemm, "load", lambda: stand_in_deepgemm)
    monkeypatch.setattr(script, "MEASURED_SHAPES", (Shape(2, 1, 100), Shape(2, 3, 100)))
    monkeypatch.setattr(script, "VLLM_MAX_MODEL_LEN", 512)
    monkeypatch.setattr(script, "benchmark_problem",
                        lambda s, block_size, layout, **kw: inputs.benchmark_problem(s, block_size, layout, heads=32,
                                                                                     **kw))
    out = tmp_path / "v.json"
    assert script.main([str(out), "--rounds", "2", "--configs", '{"stages": 6, "next_n": [3]}',
                        '{"splits": 3, "batch": [4]}', '{"block_size": 16, "layout": "shuffle", "next_n": [1]}']) == 0
    record = json.loads(out.read_text())
    assert record["rounds"] == 2 and record["deepgemm"]["commit"] == "54e2261"
    assert record["provenance"]["git_commit"] == benchmark.provenance()["git_commit"]
    rows = {(r["shape"]["next_n"], r["who"], r["max_model_len"] == 512): r for r in record["rows"]}
    for next_n, dg in ((1, "deepgemm"), (3, "deepgemm-flattened")):
        for wide in (False, True):
            for who in ("ours", dg):
                row = rows[(next_n, who, wide)]
                assert row["meets_contract"] and row["same_inf_pattern"], row
                assert row["us"] == [1000.0, 2000.0] and row["us_median"] == 1500.0
    # Ours beside ours at vLLM's width: the exact path and 16-token pages, each checked by its own reference.
    for who in ("ours-exact", "ours-block16", "ours-block16-shuffle"):
        for next_n in (1, 3):
            row = rows[(next_n, who, True)]
            assert row["meets_contract"] and row["us"] == [1000.0, 2000.0], row
    assert rows[(1, "ours-exact", True)]["precision"] == "exact"
    # A HopperConfig needs an sm90 GPU: on the CPU its launch is recorded as an error, and never timed.
    # Each extra launch for the shapes it names, if any, on the cache it names (by default DeepGEMM's).
    assert [(r["shape"]["next_n"], r["block_size"], r["layout"]) for r in record["rows"] if r["who"] == "ours-config"] \
        == [(1, 16, "shuffle"), (3, 64, "normal")]
    config = rows[(3, "ours-config", False)]
    assert "a HopperConfig needs an sm90 GPU" in config["error"] and "us" not in config
    assert str(script.ROOT) not in config["error"] and 'File "./benchmarks/vllm_call_gpu.py"' in config["error"]
    assert config["asked"] == {"stages": 6} and config["config"]["stages"] == 6
    table = capsys.readouterr().out
    assert "B=2 next_n=3 ctx=100" in table and "1.00x [1.00, 1.00] (flattened)" in table
    assert "Width 512 is vLLM's max_context_len" in table and "ours-block16-shuffle" in table
    # What ties the run to its code and inputs: the kernels' digest, each row's seed and inputs, every figure sealed.
    assert record["provenance"]["kernels"] == provenance.kernels_record("logits")
    assert provenance.broken_record_seals(record) == []
    for who, block_size, layout in (("ours", 64, "normal"), ("ours-block16-shuffle", 16, "shuffle")):
        row = rows[(3, who, True)]
        rebuilt = inputs.benchmark_problem(Shape(2, 3, 100), block_size, layout, heads=32, seed=row["seed"])
        assert row["seed"] == benchmark.SEED and row["inputs_sha256"] == inputs.input_digest(rebuilt)
    assert rows[(3, "ours", True)]["inputs_sha256"] != rows[(3, "ours-block16", True)]["inputs_sha256"]
