"""preshuffle.provenance: committed runs tied to the kernels' source, their figures sealed, their inputs rebuilt."""

import json
import re
from pathlib import Path

import pytest
import torch

from preshuffle import provenance, report
from preshuffle.__main__ import committed_results
from preshuffle.shapes import Shape
from preshuffle.shapes import VARIANTS
from preshuffle.testing.inputs import _contexts, benchmark_problem, input_digest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = sorted((ROOT / "results").glob("*.json"))


def committed(path: Path) -> dict:
    return json.loads(path.read_text())


@pytest.mark.parametrize("part", sorted(provenance.PARTS))
def test_the_digest_a_run_records_is_the_one_a_reader_computes_from_the_files(part):
    import preshuffle.kernels.hopper  # noqa: F401 (every kernel a part names, imported)
    import preshuffle.measure.page_read  # noqa: F401
    import preshuffle.teaching.steps  # noqa: F401
    import preshuffle.teaching.tl_tma  # noqa: F401
    import preshuffle.topk.hopper  # noqa: F401
    import preshuffle.topk.portable  # noqa: F401

    roots = provenance.PARTS[part]
    assert sorted(provenance.runtime_texts(roots)) == sorted(provenance.source_texts(provenance.package_files(), roots))
    assert provenance.kernels_record(part) == {part: {"roots": list(roots),
                                                      "sha256": provenance.source_digest(roots)}}


KERNEL = '''
import triton

@triton.jit
def root(x):
    return helper(x) + 1
'''
HELPER = '''
import triton

@triton.jit
def helper(x):
    # a comment is no code
    return x * 2
'''


def test_the_digest_follows_the_code_not_the_file_it_is_in():
    together = {"preshuffle/k.py": KERNEL + HELPER}
    apart = {"preshuffle/k.py": "from .h import helper\n" + KERNEL, "preshuffle/h.py": HELPER}
    digest = provenance.source_digest(["root"], together)
    assert provenance.source_digest(["root"], apart) == digest
    assert len(provenance.source_texts(together, ["root"])) == 2
    uncommented = {"preshuffle/k.py": KERNEL + HELPER.replace("    # a comment is no code\n", "")}
    assert provenance.source_digest(["root"], uncommented) == digest
    changed = {"preshuffle/k.py": "from .h import helper\n" + KERNEL, "preshuffle/h.py": HELPER.replace("2", "3")}
    assert provenance.source_digest(["root"], changed) != digest


def test_bad_roots_and_parts_are_named():
    with pytest.raises(TypeError, match="roots must be"):
        provenance.source_digest("root", {"preshuffle/k.py": KERNEL + HELPER})
    with pytest.raises(ValueError, match=r"roots \['nothing'\] are not kernel functions"):
        provenance.source_digest(["nothing"], {"preshuffle/k.py": KERNEL + HELPER})
    with pytest.raises(ValueError, match="parts must be names of"):
        provenance.kernels_record("everything")
    with pytest.raises(TypeError, match="record must be"):
        provenance.staleness([])
    with pytest.raises(TypeError, match="row must be a dict"):
        provenance.row_checksum([1.0])
    with pytest.raises(TypeError, match="commit must be a commit id"):
        provenance.is_ancestor(None)


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_every_committed_run_names_its_kernels_digest_and_a_commit_of_this_history(path):
    prov = committed(path)["provenance"]
    kernels = prov["kernels"]
    assert kernels and set(kernels) <= set(provenance.PARTS)
    for part, entry in kernels.items():
        assert entry["roots"] == list(provenance.PARTS[part])
        assert entry["sha256"] is None and entry["why"] or re.fullmatch(r"[0-9a-f]{64}", entry["sha256"])
    ancestor = provenance.is_ancestor(prov["git_commit"])
    if ancestor is None:
        pytest.skip("no full git history here to place the run's commit in")
    assert ancestor, f"{path.name}: commit {prov['git_commit']} is not an ancestor of HEAD"


def test_a_run_of_other_source_is_stale():
    fresh = {"provenance": {"kernels": provenance.kernels_record("portable")}}
    assert provenance.staleness(fresh) is None
    files = provenance.package_files()
    edited = {p: t.replace("def _paged_mqa_logits_kernel(", "def _paged_mqa_logits_kernel(unused, ") for p, t in
              files.items()}
    assert "has changed since" in provenance.staleness(fresh, files=edited)
    assert "no digest" in provenance.staleness({"provenance": {}})
    assert "no digest of its topk" in provenance.staleness(fresh, "topk")


def test_the_readme_table_shows_no_stale_run():
    nv_dev, main, topk = committed_results()
    assert provenance.staleness(nv_dev) is None and provenance.staleness(main) is None
    if topk:  # the default launch's figures: the sm90 kernel's
        assert provenance.staleness(report.load(ROOT / "results" / "h200-topk.json"), "topk_sm90") is None


def test_a_stale_run_is_marked_where_the_command_line_prints_it(capsys):
    from preshuffle.__main__ import main

    record = report.load(ROOT / "results" / "h200-vllm-call-nvdev.json")
    record["provenance"]["kernels"] = {"logits": {"roots": list(provenance.LOGITS),
                                                  "sha256": provenance.source_digest(provenance.LOGITS)}}
    assert report.stale_note(record) is None
    record["provenance"]["kernels"]["logits"]["sha256"] = "0" * 64
    assert report.stale_note(record, "x.json").startswith(
        "STALE: x.json no longer measures the package's kernels: its logits kernels' source has changed since")
    assert main(["results", "--file", str(ROOT / "results" / "h200.json")]) == 0
    assert "STALE: " + str(ROOT / "results" / "h200.json") in capsys.readouterr().err


@pytest.mark.parametrize("path", RESULTS, ids=lambda p: p.name)
def test_every_committed_figure_is_sealed_and_an_edited_time_breaks_its_seal(path):
    record = committed(path)
    assert provenance.row_lists(record) and provenance.broken_record_seals(record) == []
    text = path.read_text()
    times = list(re.finditer(r'"(us|us_median|[a-z_]*_us)": \[?(\d+\.\d+)', text))
    assert times, f"{path.name} holds no time"
    for m in (times[0], times[len(times) // 2], times[-1]):
        scaled = f"{float(m.group(2)) * 0.8!r}"
        edited = json.loads(text[:m.start(2)] + scaled + text[m.end(2):])
        assert provenance.broken_record_seals(edited), f"{path.name}: 0.8x of {m.group(0)} went unnoticed"


def test_a_file_with_an_edited_figure_is_refused(tmp_path):
    text = (ROOT / "results" / "h200-vllm-call-nvdev.json").read_text()
    m = re.search(r'"us_median": (\d+\.\d+)', text)
    (tmp_path / "run.json").write_text(text[:m.start(1)] + repr(float(m.group(1)) * 0.8) + text[m.end(1):])
    with pytest.raises(ValueError, match=r"run.json: the seals of rows\[0\] do not match"):
        report.load(tmp_path / "run.json")


def visible_logits(shape: Shape, seed: int) -> int:
    """The logits a problem of ``benchmark_problem(shape, ..., seed=seed)`` has that a row may see: row j of a
    sequence of ctx_b tokens sees ctx_b - (next_n - 1 - j) of them."""
    ctx = _contexts(shape, torch.Generator().manual_seed(seed))
    return sum(int((ctx - (shape.next_n - 1 - j)).clamp(min=0).sum()) for j in range(shape.next_n))


def row_shape(row: dict) -> Shape:
    if isinstance(row["shape"], dict):
        return Shape(**row["shape"])
    batch, next_n, ctx = map(int, re.fullmatch(r"B=(\d+) next_n=(\d+) ctx=(\d+)", row["shape"]).groups())
    return Shape(batch, next_n, ctx)


SEEDED = [p for p in RESULTS if any("seed" in r for r in committed(p).get("rows", []))]


@pytest.mark.parametrize("path", SEEDED, ids=lambda p: p.name)
def test_each_seeded_rows_finite_logits_are_those_of_the_inputs_its_seed_builds(path):
    """A row's count of finite logits, rebuilt on the CPU from its seed: the lengths drawn for its shape. (The
    scalar loops' row runs on the first positions of one sequence only.)"""
    rows = [r for r in committed(path)["rows"] if "seed" in r]
    wrong = [(r["shape"], r.get("step") or r.get("who") or r.get("kernel"), r["finite"]) for r in rows
             if r["finite"] != (r["positions"] if "positions" in r else visible_logits(row_shape(r), r["seed"]))]
    assert rows and not wrong, wrong[:5]


def test_the_scalar_loops_row_has_as_many_finite_logits_as_positions_it_ran():
    rows = committed(ROOT / "results" / "h200.json")["rows"]
    loops = next(r for r in rows if r.get("step") == "scalar loops (Python)")
    assert loops["finite"] == loops["positions"] < 10 ** 5


def test_input_digest_names_bad_input():
    with pytest.raises(TypeError, match="problem must be a PagedMQAProblem"):
        input_digest(None)


def smallest_digested_row():
    rows = [(r, p) for p in RESULTS for r in committed(p).get("rows", []) if r.get("inputs_sha256")]
    rows = [(r, p) for r, p in rows if r.get("variant", "block64-normal") in VARIANTS or "who" in r]
    return min(rows, key=lambda rp: row_shape(rp[0]).batch * row_shape(rp[0]).avg_ctx * row_shape(rp[0]).next_n,
               default=(None, None))


def test_the_inputs_of_a_committed_row_rebuild_on_the_cpu_from_its_seed():
    """The row of the smallest problem that records its inputs' digest: its inputs, built again here from its seed
    (the benchmark draws them on the CPU whatever the device), are the bytes it was measured on."""
    row, path = smallest_digested_row()
    if row is None:
        pytest.skip("no committed run records its inputs' digest yet (runs of benchmarks/vllm_call_gpu.py, "
                    "benchmarks/topk_gpu.py or `python -m preshuffle bench` from this tree do)")
    block_size, layout = VARIANTS.get(row.get("variant"), (16, "shuffle") if row.get("who") == "ours-block16-shuffle"
                                      else (16, "normal") if row.get("who") == "ours-block16" else (64, "normal"))
    problem = benchmark_problem(row_shape(row), block_size, layout, seed=row["seed"], device_name="cpu")
    assert input_digest(problem) == row["inputs_sha256"], f"{path.name}: {row['shape']} {row.get('who')}"


def test_is_ancestor_says_none_for_a_tree_committed_afresh_and_false_for_a_commit_not_in_the_history(tmp_path,
                                                                                                 monkeypatch):
    import subprocess

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path,
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    (tmp_path / "a").write_text("1")
    git("add", "a")
    git("commit", "-qm", "one")
    first = git("rev-parse", "HEAD")
    assert provenance.is_ancestor("0" * 40, tmp_path) is None  # one commit: a copy, whose history says nothing
    (tmp_path / "a").write_text("2")
    git("commit", "-qam", "two")
    monkeypatch.delenv("PRESHUFFLE_GIT_COMMIT", raising=False)
    assert provenance.is_ancestor(first, tmp_path) is True
    assert provenance.is_ancestor("0" * 40, tmp_path) is False
    # A copy of another commit, committed on a history of its own: its history cannot place the project's commits.
    monkeypatch.setenv("PRESHUFFLE_GIT_COMMIT", "1234567")
    assert provenance.is_ancestor("0" * 40, tmp_path) is None
    monkeypatch.setenv("PRESHUFFLE_GIT_COMMIT", git("rev-parse", "--short", "HEAD"))
    assert provenance.is_ancestor("0" * 40, tmp_path) is False
