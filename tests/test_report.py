"""Reading the committed H200 results: the derived numbers follow from the raw ones."""

import pytest

from preshuffle import negotiation, report
from preshuffle.anchors import DEEPGEMM_H200
from preshuffle.shapes import ANCHOR_SHAPES, Shape


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


def launch_rule_us(record, shape, variant, kind="kernel"):
    """The committed row the benchmark flagged as the launch rule's, read without the report module."""
    rows = [r["us"] for r in record["rows"] if r["kind"] == kind and r["variant"] == variant and r.get("rule")
            and Shape(**r["shape"]) == shape]
    assert len(rows) <= 1
    return rows[0] if rows else None


@pytest.mark.parametrize("block_size, layout, variant", [
    (1, "normal", "block1"), (16, "normal", "block16-normal"), (16, "shuffle", "block16-shuffle"),
    (64, "normal", "block64-normal"), (64, "shuffle", "block64-shuffle")])
def test_variant_time_is_the_launch_rule_row(record, block_size, layout, variant):
    for shape in ANCHOR_SHAPES:
        assert report.variant_time(record, shape, block_size, layout) == launch_rule_us(record, shape, variant)


def test_variant_time_of_an_unmeasured_combination_is_none(record):
    assert report.variant_time(record, Shape(64, 1, 8192), 32) is None
    assert report.variant_time(record, Shape(64, 1, 8192), 1, "shuffle") is None
    assert report.variant_time(record, Shape(3, 1, 100), 64) is None
    assert report.variant_time(record, Shape(64, 1, 8192), 16, kind="kernel-fp8-mma") is None


def costs(record, size, platform, before_pr=False):
    bars = report.kernel_costs(negotiation.negotiate(size, platform, before_pr=before_pr), record)["bars"]
    return [(b["kernel_block_size"], b["us"], b["negotiated"]) for b in bars]


def test_kernel_costs_on_rocm_are_the_pr_measurements(record):
    assert costs(record, 16, "rocm", before_pr=True) == [(1, 28.53, True), (16, 7.84, False)]
    assert costs(record, 16, "rocm") == [(1, 28.53, False), (16, 7.84, True)]
    assert costs(record, 32, "rocm") == [(1, 28.53, False), (16, 7.84, False), (32, None, True)]
    assert costs(record, 24, "rocm") == [(1, 28.53, True), (16, 7.84, False)]


def test_kernel_costs_on_cuda_are_our_h200_times(record):
    shape = Shape(64, 1, 8192)
    expected = [(k, launch_rule_us(record, shape, v), k == 64)
                for k, v in ((1, "block1"), (16, "block16-normal"), (64, "block64-normal"))]
    assert costs(record, 256, "cuda") == expected and all(us for _, us, _ in expected)
    assert "B=64 next_n=1 ctx=8192" in report.kernel_costs(negotiation.negotiate(64, "cuda"), record)["source"]
    assert [negotiated for *_, negotiated in costs(record, 48, "cuda")] == [False] * 3    # negotiation fails


@pytest.mark.parametrize("asked, nearest", [
    ((64, 8192, 1), (64, 1, 8192)), ((256, 65536, 2), (256, 2, 65536)), ((64, 4096, 1), (64, 1, 8192)),
    ((200, 50000, 2), (256, 2, 65536)), ((1, 8192, 1), (1, 1, 131072)), ((8, 16384, 1), (8, 1, 65536)),
    ((2048, 8192, 1), (4096, 1, 8192)), ((1, 1024, 3), (64, 2, 8192))])
def test_nearest_shape_prefers_next_n_then_log_distance(record, asked, nearest):
    assert report.nearest_shape(record, *asked) == Shape(*nearest)


@pytest.mark.parametrize("args, message", [
    ((0, 8192, 1), "batch"), ((64, 8192.0, 1), "avg_ctx"), ((64, 8192, True), "next_n")])
def test_nearest_shape_rejects_bad_sizes(record, args, message):
    with pytest.raises(ValueError, match=message):
        report.nearest_shape(record, *args)


@pytest.mark.parametrize("precision, kind", [("exact", "kernel"), ("fp8", "kernel-fp8-mma")])
def test_workload_bars_are_the_results_numbers(record, precision, kind):
    variants = ["block1", "block16-normal", "block16-shuffle", "block64-normal", "block64-shuffle"]
    for shape in ANCHOR_SHAPES:
        nearest, bars = report.workload_bars(record, shape.batch, shape.avg_ctx, shape.next_n, 16, "shuffle",
                                             precision)
        assert nearest == shape
        assert [b["us"] for b in bars[:-1]] == [launch_rule_us(record, shape, v, kind) for v in variants]
        assert [b["chosen"] for b in bars] == [False, False, True, False, False, False]
        deepgemm = bars[-1]
        assert deepgemm["label"] == "DeepGEMM (recorded)"
        assert (deepgemm["us"], deepgemm["pct_copy"]) == (DEEPGEMM_H200[shape].us, DEEPGEMM_H200[shape].pct_copy)
    assert sum(b["us"] is not None for b in bars[:-1]) == (5 if precision == "exact" else 1)


def test_workload_bars_share_follows_from_the_row(record):
    _, bars = report.workload_bars(record, 64, 8192, 1, 64, "normal", "exact")
    row = next(r for r in record["rows"] if r["kind"] == "kernel" and r["variant"] == "block64-normal" and r["rule"]
               and Shape(**r["shape"]) == Shape(64, 1, 8192))
    assert bars[3]["label"] == "ours block64-normal (exact)" and bars[3]["pct_copy"] == row["pct_copy"]


@pytest.mark.parametrize("block_size, layout, precision, message", [
    (1, "shuffle", "exact", "block_size, layout"), (32, "normal", "exact", "block_size, layout"),
    (64, "normal", "fp16", "precision")])
def test_workload_bars_rejects_unknown_variants(record, block_size, layout, precision, message):
    with pytest.raises(ValueError, match=message):
        report.workload_bars(record, 64, 8192, 1, block_size, layout, precision)
