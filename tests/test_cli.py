"""``python -m preshuffle``, run as a user runs it."""

import json
import subprocess
import sys

import pytest

from preshuffle import device, report
from preshuffle.__main__ import main


def test_main_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "preshuffle", "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert "negotiate" in out and "bench" in out


def test_main_negotiate_reports_the_pr():
    run = lambda *a: subprocess.run([sys.executable, "-m", "preshuffle", "negotiate", *a], capture_output=True,
                                    text=True)
    before = run("--block-size", "16", "--platform", "rocm", "--before-pr")
    assert before.returncode == 0 and "kernel block size: 1 (16 kernel blocks" in before.stdout
    after = run("--block-size", "16")
    assert "kernel block size: 16 (1 kernel blocks" in after.stdout and "preshuffled=True" in after.stdout
    sweep = run("--sweep", "--block-size", "16", "48")
    assert "Negotiate after PR #51216 but AITER would reject: [48]" in sweep.stdout
    bad = run("--block-size", "0")
    assert bad.returncode == 2 and "argument --block-size: must be a positive int" in bad.stderr


@pytest.mark.skipif(not device.INTERPRETED, reason="a GPU process may time kernels")
def test_main_bench_refuses_the_interpreter():
    out = subprocess.run([sys.executable, "-m", "preshuffle", "bench", "--shapes", "6"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "refusing to time Triton's interpreter" in out.stderr


@pytest.mark.parametrize("argv, status", [
    (["--block-size", "16"], 0),
    (["--block-size", "16", "--platform", "rocm", "--before-pr"], 0),
    (["--block-size", "64", "--platform", "cuda"], 0),
    (["--block-size", "16", "--platform", "cuda"], 1),        # no common block size
    (["--block-size", "48"], 1),                              # negotiates 48, AITER would assert
    (["--block-size", "16", "48"], 1),
    (["--sweep", "--block-size", "16", "32", "64"], 0),
    (["--sweep", "--block-size", "16", "48"], 1),
    (["--sweep"], 1),                                         # the default sweep holds 48, 80, ...
])
def test_negotiate_exit_status(argv, status, capsys):
    assert main(["negotiate", *argv]) == status
    out = capsys.readouterr().out
    assert out and ("NO" in out or "fails" in out or "would reject" in out) == bool(status)


@pytest.mark.parametrize("value", ["0", "-16", "1.5", "abc", "1e3"])
def test_negotiate_bad_block_size_names_the_flag_before_any_output(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["negotiate", "--block-size", "16", value])
    captured = capsys.readouterr()
    assert exit_.value.code == 2 and captured.out == ""
    assert f"argument --block-size: must be a positive int, got {value!r}" in captured.err
    assert "manager_block_size" not in captured.err


def test_negotiate_help_states_the_exit_status(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["negotiate", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert exit_.value.code == 0
    assert "exit status 1 when a negotiation fails or the indexer kernel would reject the negotiated size" in text


def test_main_results_prints_the_committed_runs_at_vllms_call_as_a_markdown_table(capsys):
    from preshuffle import vllm_call_report

    assert main(["results"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith("At vLLM's own call on an NVIDIA H200, our fp8 logits kernel's time over DeepGEMM ")
    header = lines.index(next(line for line in lines if line.startswith("| B, next_n, ctx |")))
    assert set(lines[header + 1]) == {"|", "-"}
    rows = [line for line in lines[header + 2:] if line.startswith("| ")]
    nv_dev = vllm_call_report.load(vllm_call_report.RUNS["nv_dev"])
    assert len(rows) == len(vllm_call_report.shapes(nv_dev))
    assert nv_dev["provenance"]["git_commit"][:7] in out and "nv_dev (us)" in lines[header]


def test_main_results_names_a_missing_file(tmp_path, capsys):
    missing = tmp_path / "none.json"
    with pytest.raises(FileNotFoundError, match="none.json"):
        main(["results", "--file", str(missing)])


def test_main_results_of_several_runs_sets_ours_beside_each_build(tmp_path, capsys):
    record = report.load()
    paths = []
    for name, build in (("main", {"version": "2.6.1", "branch": "main", "commit": "54e2261", "source": "env"}),
                        ("nv_dev", {"version": "2.5.0", "branch": "nv_dev", "commit": "a6b593d", "source": "env"})):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps({**record, "deepgemm": build}))
    assert main(["results", "--file", *map(str, paths)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("| B, next_n, ctx | DeepGEMM main 54e2261 (2.6.1) (us) | ours (us) | ours / it | "
                        "DeepGEMM nv_dev a6b593d (2.5.0) (us) | ours (us) | ours / it |")
    assert len([line for line in lines[2:] if line.startswith("| ")]) == len(report.shapes(record))
