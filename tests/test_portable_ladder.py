"""The portable kernel's ladder as committed: every figure copied from benchmarks/NOTES.md is there, the last version's are
the final sweep's, and each step says honestly whether it was measured on its own."""

import json
import re
from pathlib import Path

import pytest

from preshuffle import portable_ladder as ladder, report
from preshuffle.shapes import Shape

NOTES = Path(ladder.LADDER).parents[1] / "benchmarks" / "NOTES.md"


@pytest.fixture(scope="module")
def loaded():
    return ladder.load()


def test_load_reads_every_version_in_order_with_its_provenance(loaded):
    assert [r.version for r in loaded.rungs] == [1, 2, 3, 4, 5, 6]
    p = loaded.provenance
    assert (p["gpu"], p["torch"], p["triton"], p["date"]) == ("NVIDIA H200", "2.11.0+cu130", "3.6.0", "2026-11-29")
    assert [r.version for r in loaded.rungs if r.dropped] == [4]
    ideas = [i for r in loaded.rungs for i in r.ideas]
    assert len(ideas) == len(set(ideas))


def test_load_copies_only_figures_the_notes_record(loaded):
    versions = NOTES.read_text().split("## Versions")[1].split("\n## ")[0]
    paragraphs = {int(n): text for n, text in re.findall(r"^(\d)\. (.*?)(?=^\d\. |\Z)", versions, re.M | re.S)}
    for r in loaded.rungs[:-1]:
        text = " ".join(paragraphs[r.version].split())
        assert r.figures
        for f in r.figures:
            assert f.us is not None or f.pct_copy is not None
            if f.us is not None:
                assert f"{f.us:.0f}" in text, (r.version, f)
            if f.pct_copy is not None:
                assert f"{f.pct_copy:.0f}%" in text, (r.version, f)
        assert r.source.startswith("benchmarks/NOTES.md")


def test_load_reads_the_last_version_from_the_final_sweep(loaded):
    final = loaded.rungs[-1]
    record = report.load(report.RESULTS / "h200-portable-703f0c9.json")
    assert final.figures and final.source.startswith("results/h200-portable-703f0c9.json, commit 703f0c9")
    for f in final.figures:
        (row,) = [r for r in record["rows"] if r["kind"] == "kernel" and r["variant"] == "block64-normal"
                  and r.get("rule") and Shape(**r["shape"]) == f.shape]
        assert (f.us, f.pct_copy) == (row["us"], row["pct_copy"])
        assert f.pct_copy == pytest.approx(100 * row["bytes"] / (row["us"] * 1e-6) / record["copy_bytes_per_s"])


def test_load_follows_figures_from_to_the_rule_rows_of_that_file(tmp_path):
    row = {"kind": "kernel", "variant": "block64-normal", "shape": {"batch": 64, "next_n": 2, "avg_ctx": 8192}}
    record = {"provenance": {"git_commit": "abcdef0123", "date": "2027-01-02T03:04:05"}, "rows": [
        {**row, "rule": True, "us": 50.0, "pct_copy": 33.0}, {**row, "rule": False, "us": 40.0, "pct_copy": 41.0},
        {**row, "kind": "torch", "us": 900.0, "pct_copy": 2.0}]}
    (tmp_path / "sweep.json").write_text(json.dumps(record))
    data = json.loads(Path(ladder.LADDER).read_text())
    data["versions"][-1].update(figures_from=str(tmp_path / "sweep.json"), shapes=[row["shape"]])
    (tmp_path / "ladder.json").write_text(json.dumps(data))
    final = ladder.load(tmp_path / "ladder.json").rungs[-1]
    assert final.figures == (ladder.Figure(Shape(64, 2, 8192), 50.0, 33.0),)
    assert final.source.endswith("sweep.json, commit abcdef0, 2027-01-02, block64-normal")


def test_describe_says_when_an_idea_was_not_measured_separately(loaded):
    shared = loaded.describe("keys-as-a")
    assert "version 2; not measured separately: added together with scale after the head sum and scales a " \
           "chunk ahead" in shared and "1826 us, 59% of the copy ceiling" in shared
    alone = loaded.describe("one-table-read")
    assert "not measured separately" not in alone and "time not recorded, 61% of the copy ceiling" in alone
    assert "tried and dropped" in loaded.describe("register-prefetch")
    assert "results/h200-portable-703f0c9.json" in loaded.describe("masked-next-n")


def test_rung_rejects_an_unknown_idea(loaded):
    with pytest.raises(ValueError, match=r"idea must be one of \['chunks', .*got 'warp-specialised'"):
        loaded.rung("warp-specialised")


def test_shapes_lists_each_recorded_shape_once(loaded):
    assert loaded.shapes == (Shape(4096, 1, 8192), Shape(128, 1, 32768))


def test_format_has_a_line_per_version_with_its_figures(loaded):
    lines = loaded.format().splitlines()
    assert len(lines) == 2 + len(loaded.rungs)
    assert re.search(r"^2 +1826 us +59% +- +52% +keys as the A operand", lines[3])
    assert lines[5].endswith("(dropped)")
