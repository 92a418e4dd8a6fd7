"""Reading the committed H200 results: the derived numbers follow from the raw ones."""

import pytest

from preshuffle import report
from preshuffle.shapes import ANCHOR_SHAPES, Shape


@pytest.fixture(scope="module")
def record():
    return report.load()


def test_load_reads_results_with_their_provenance(record):
    p = record["provenance"]
    assert p["gpu"] == "NVIDIA H200" and len(p["git_commit"]) == 40 and p["torch"] and p["triton"] and p["date"]
    assert 3e12 < record["copy_bytes_per_s"] < 6e12


def test_load_every_timed_kernel_row_was_checked_first(record):
    kernel_rows = [r for r in record["rows"] if r["kind"] == "kernel"]
    assert kernel_rows and all(r["meets_rtol"] and r["same_inf_pattern"] for r in kernel_rows if "us" in r)
    assert all("us" in r for r in kernel_rows)


def test_load_shares_follow_from_bytes_and_time(record):
    for row in record["rows"]:
        if "us" in row:
            expected = 100 * row["bytes"] / (row["us"] * 1e-6) / record["copy_bytes_per_s"]
            assert row["pct_copy"] == pytest.approx(expected, rel=1e-9)


def test_summary_covers_every_anchor_shape_with_the_launch_rule(record):
    rows = report.summary(record)
    assert [r["shape"] for r in rows] == list(ANCHOR_SHAPES)
    for r in rows:
        assert r["us"] == min(r["us_by_variant"].values())
        assert r["block16_over_block1"] == pytest.approx(
            r["us_by_variant"]["block1"] / min(r["us_by_variant"]["block16-normal"], r["us_by_variant"]["block16-shuffle"]))


def test_summary_of_a_partial_run(record):
    partial = {**record, "rows": [r for r in record["rows"] if r["variant"] == "block64-normal" and r["kind"] == "kernel"]}
    rows = report.summary(partial)
    assert all(r["block16_over_block1"] is None and r["over_torch"] is None for r in rows)
    assert "B=4096 next_n=1 ctx=8192" in report.format_summary(rows)


def test_rule_rows_follow_each_rows_rule_flag(record):
    shape, variant = Shape(64, 1, 8192), "block64-normal"
    ruled = report.rule_rows(record)[(shape, variant)]
    assert ruled["rule"] and ruled["programs_per_sm"] == 4
    other = next(r for r in record["rows"] if r["kind"] == "kernel" and Shape(**r["shape"]) == shape
                 and r["variant"] == variant and r["programs_per_sm"] == 16)
    flipped = {**record, "rows": [{**r, "rule": r is other} if r["kind"] == "kernel" else r for r in record["rows"]]}
    assert report.rule_rows(flipped)[(shape, variant)]["programs_per_sm"] == 16
    unflagged = {**record, "rows": [{k: v for k, v in r.items() if k != "rule"} for r in record["rows"]]}
    assert not report.rule_rows(unflagged)                         # a split without the flag is not the rule
    assert len(report.rule_rows(unflagged, "torch")) == 6          # rows without a split are


def test_summary_sets_the_recorded_anchor_figures_beside_ours(record):
    rows = {r["shape"]: r for r in report.summary(record)}
    b64 = rows[Shape(64, 1, 8192)]
    assert (b64["deepgemm_us"], b64["deepgemm_pct"], b64["naive_triton_us_recorded"]) == (30.0, 58, 48.4)
    assert b64["over_torch_recorded"] == pytest.approx(1107 / b64["us"])
    assert rows[Shape(4096, 1, 8192)]["torch_us_recorded"] is None
