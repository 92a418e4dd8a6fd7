"""benchmarks/tune.py's documented example, run on the CPU on a tiny shape with the GPU timer, the copy ceiling and
the SM count stubbed, so the example cannot rot."""

import json
import re
import shlex

import pytest

from preshuffle import benchmark, deepgemm, device
from preshuffle.kernels import launch
from preshuffle.testing import timing


@pytest.fixture(scope="module")
def tune(load_benchmark):
    return load_benchmark("tune")


def documented_example(tune) -> list[str]:
    """The arguments of the example command in tune.py's docstring."""
    command = tune.__doc__.split("\n\n")[1].replace("\\\n", " ")
    words = shlex.split(command)
    return words[words.index("benchmarks/tune.py") + 1:]


@pytest.mark.skipif(not device.INTERPRETED, reason="runs the tuner on the CPU with its GPU parts stubbed")
def test_main_runs_the_documented_example(tune, tmp_path, monkeypatch):
    monkeypatch.setattr(timing, "time_ms", lambda fn, graph=True, clean_l2=False: 0.5)
    monkeypatch.setattr(benchmark, "REPEATS", 2)  # a run is slow under the interpreter
    monkeypatch.setattr(timing, "copy_bandwidth", lambda: 4e12)
    monkeypatch.setattr(launch, "multiprocessor_count", lambda: 1)
    args = documented_example(tune)
    shapes = args.index("--shapes")
    del args[shapes:args.index("--variants")]                # the anchor shapes are far too big for the interpreter
    args[args.index("--out") + 1] = str(tmp_path / "tune.json")
    record = tune.main([*args, "--shape", "2", "1", "100", "--programs-per-sm", "1", "4"])
    configs = [json.loads(text) for text in args[args.index("--configs") + 1:]]
    assert len(configs) == 2
    assert [(r["config"], r["pps"]) for r in record["rows"]] == [(c, pps) for c in configs for pps in (1, 4)]
    assert all(r["meets_contract"] and r["us"] == 500.0 for r in record["rows"])
    assert all(r["bitwise_equal_to_rule"] for r in record["rows"] if r["pps"] != 1)
    assert json.loads((tmp_path / "tune.json").read_text())["rows"] == record["rows"]


@pytest.mark.parametrize("config, message", [
    ('{"chunk": 64, "register_prefetch": true}', "expected a JSON object with keys among"),
    ('{"tokens_per_program": 128}', "expected a JSON object with keys among"),
    ('{"chunk": 48}', "chunk must be a power of two"),
    ("chunk=64", "is not JSON"),
])
def test_main_rejects_a_bad_config_before_timing(tune, tmp_path, capsys, config, message):
    with pytest.raises(SystemExit) as exit_info:
        tune.main(["--out", str(tmp_path / "t.json"), "--shapes", "0", "--configs", config])
    assert exit_info.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()


@pytest.mark.parametrize("config, message", [
    ('{"precision": "fp16"}', "precision must be fp8 or exact, got 'fp16'"),
    ('{"stages": 1}', r"stages must be in \[2, 12\], got 1"),
    ('{"chunk": 64}', "expected a JSON object with keys among"),
])
def test_main_rejects_a_bad_hopper_config_before_timing(tune, tmp_path, capsys, config, message):
    with pytest.raises(SystemExit) as exit_info:
        tune.main(["--out", str(tmp_path / "t.json"), "--shapes", "0", "--kernel", "hopper", "--configs", config])
    assert exit_info.value.code == 2 and re.search(message, capsys.readouterr().err)
    assert not (tmp_path / "t.json").exists()


def test_hopper_configs_take_the_register_budget_of_their_path(tune, monkeypatch):
    monkeypatch.setattr(launch, "multiprocessor_count", lambda: 132)
    precision, config = tune.make_config("hopper", {"row_warpgroups": True}, 64, 4, 2)
    assert precision == "fp8" and config.maxnreg == 64 and config.row_warpgroups
    assert config.splits == launch.splits_for(64, 4)
    precision, config = tune.make_config("hopper", {"maxnreg": 96}, 64, 4)
    assert precision == "fp8" and config.maxnreg == 96 and not config.row_warpgroups
    precision, config = tune.make_config("hopper", {"precision": "exact"}, 64, 4, 2)
    assert precision == "exact" and config.maxnreg == 128


@pytest.mark.skipif(deepgemm.load() is not None, reason="deep_gemm imports here")
def test_main_refuses_deepgemm_where_it_does_not_import(tune, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        tune.main(["--out", str(tmp_path / "t.json"), "--shapes", "0", "--kernel", "hopper", "--configs", "{}",
                   "--against", "deepgemm"])
    assert exit_info.value.code == 2 and "deep_gemm does not import here" in capsys.readouterr().err
    assert not (tmp_path / "t.json").exists()
