"""Reading the committed H200 results: every timed row was checked first, and the derived numbers follow from the
raw ones."""

import pytest

from preshuffle import report
from preshuffle.shapes import ANCHOR_SHAPES, Shape

MTP = [Shape(64, 3, 8192), Shape(256, 3, 8192)]


@pytest.fixture(scope="module")
def record():
    return report.load()


def test_load_reads_results_with_their_provenance(record):
    p = record["provenance"]
    assert p["gpu"] == "NVIDIA H200" and len(p["git_commit"]) == 40 and p["torch"] and p["triton"] and p["date"]
    assert 3e12 < record["copy_bytes_per_s"] < 6e12 and record["deepgemm"]


def test_load_every_timed_row_was_checked_against_its_contract_first(record):
    timed = [r for r in record["rows"] if "us" in r]
    assert len(timed) == len(record["rows"])
    assert all(r["meets_contract"] and r["same_inf_pattern"] for r in timed)
    # DeepGEMM's repeats were compared with its unwritten positions included, which hold garbage: not measured.
    assert all(r["bitwise_repeatable"] is (None if r["kernel"].startswith("deepgemm") else True) for r in timed)
    contracts = record["contracts"]
    assert all(r["max_rel_error"] <= contracts[r["precision"]]["max_rel_error"] for r in timed)


def test_load_shares_follow_from_bytes_and_time(record):
    for row in record["rows"]:
        expected = 100 * row["bytes"] / (row["us"] * 1e-6) / record["copy_bytes_per_s"]
        assert row["pct_copy"] == pytest.approx(expected, rel=1e-9)


def test_shapes_are_the_anchors_then_multi_token_prediction(record):
    assert report.shapes(record) == list(ANCHOR_SHAPES) + MTP


def test_find_prefers_the_launch_rule_over_splits_and_steps(record):
    shape = Shape(64, 1, 8192)
    rule = report.find(record, shape, kernel="hopper", precision="fp8", variant="block64-normal")
    assert rule["rule"] and "programs_per_sm" not in rule and "step" not in rule
    assert report.find(record, shape, kernel="hopper", precision="fp8", variant="block64-normal",
                       timing="eager")["timing"] == "eager"
    assert report.find(record, shape, kernel="no such kernel") is None


def test_summary_sets_our_paths_beside_deepgemm_of_the_same_run(record):
    rows = {r["shape"]: r for r in report.summary(record)}
    assert list(rows) == report.shapes(record)
    for shape, r in rows.items():
        ours = report.find(record, shape, kernel="hopper", precision="fp8", variant="block64-normal")
        assert r["fp8_us"] == ours["us"] and r["fp8_error"] == ours["max_rel_error"]
        expected = "deepgemm" if shape.next_n <= 2 else "deepgemm-flattened"
        dg = report.find(record, shape, kernel=expected, variant="block64-normal")
        assert r["deepgemm"] == expected and r["fp8_over_deepgemm"] == pytest.approx(ours["us"] / dg["us"])
        if shape.next_n <= 2:
            block16 = report.find(record, shape, kernel="hopper", precision="fp8", variant="block16-normal")
            assert r["block16-normal_over_block64"] == pytest.approx(block16["us"] / ours["us"])
            block1 = report.find(record, shape, kernel="portable", precision="fp8", variant="block1")
            assert r["block1_over_block64"] == pytest.approx(block1["us"] / ours["us"])
    assert "* DeepGEMM on the same rows flattened" in report.format_summary(list(rows.values()))


def test_summary_of_a_partial_run(record):
    partial = {**record, "rows": [r for r in record["rows"] if r["kernel"] in ("hopper", "portable")
                                  and r["variant"] == "block64-normal"]}
    rows = report.summary(partial)
    assert all(r["deepgemm_us"] is None and r["fp8_over_deepgemm"] is None for r in rows)
    assert all(r["block16-normal_over_block64"] is None for r in rows)
    assert "B=4096 next_n=1 ctx=8192" in report.format_summary(rows)


def test_ladder_runs_from_chapter_3s_kernel_to_the_launch_rule(record):
    for shape in (Shape(64, 1, 8192), Shape(4096, 1, 8192)):
        steps = report.ladder(record, shape)
        assert [s["kernel"] for s in steps] == ["portable", "portable", "tl-tma", "hopper", "hopper", "hopper"]
        assert steps[0]["precision"] == "exact" and all(s["precision"] == "fp8" for s in steps[1:])


def test_splits_hold_the_launch_rules_output_bit_for_bit(record):
    splits = [r for r in record["rows"] if "programs_per_sm" in r]
    assert splits and all(r["bitwise_equal_to_rule"] for r in splits)
    assert set(report.splits(record, Shape(64, 1, 8192))) == {1, 2, 4, 8}


def test_clean_l2_and_host_time_cover_the_small_shapes(record):
    clean = {r["shape"]: r for r in report.clean_l2(record)}
    assert set(clean) == {Shape(1, 1, 131072), Shape(64, 1, 8192)}
    assert all(r["ours_clean_us"] < r["ours_us"] and r["deepgemm_clean_us"] < r["deepgemm_us"] for r in clean.values())
    assert set(report.host_us(record)) == set(clean)
