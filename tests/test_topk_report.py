import json
import re
from pathlib import Path

import pytest

from preshuffle.topk import report as topk_report
from preshuffle.shapes import Shape


def test_summary_compares_our_fastest_launch_with_vllms_best_kernel(topk_record):
    first, second = topk_report.summary(topk_record)
    assert first["shape"] == Shape(1, 1, 131072)
    assert (first["ours_us"], first["ours_launch"], first["ours_default_us"]) == (10.0, "split-2k", 12.0)
    assert (first["vllm_best_us"], first["vllm_best"], first["decode_topk_us"]) == (26.0, "vllm cooperative_topk", 26.0)
    assert first["ours_over_vllm_best"] == pytest.approx(10 / 26)
    assert first["ours_default_launch"] == "split-4k" and first["default_over_vllm_best"] == pytest.approx(12 / 26)
    assert first["step_speedup"] == pytest.approx(40 / 21) and first["topk_share"] == pytest.approx(10 / 21)
    assert first["torch_us"] is None and first["bf16_us"] == 7.0 and first["every_selection_checked"]
    assert second["vllm_best"] == "vllm persistent_topk" and second["step_us"] is None
    assert second["step_speedup"] is None


def test_summary_marks_a_timed_selection_that_failed_its_check(topk_shape):
    bad = {"shapes": [topk_shape(8, 65536, 30.0, {"split-4k": 9.0}, {}, valid=0.9)]}
    assert not topk_report.summary(bad)[0]["every_selection_checked"]


def test_agreement_and_nearest(topk_record):
    rows = topk_report.agreement(topk_record)
    assert [(r["shape"].batch, r["precision"], r["min"]) for r in rows] == [(1, "fp8", 0.999), (64, "fp8", 0.999)]
    assert topk_report.nearest(topk_record, 2, 100000)["shape"] == Shape(1, 1, 131072)
    assert topk_report.nearest(topk_record, 128, 8192)["shape"] == Shape(64, 1, 8192)
    with pytest.raises(ValueError, match="no measured shapes"):
        topk_report.nearest({"shapes": []}, 1, 1)


def test_formats_print_every_shape_and_what_was_not_measured(topk_record):
    text = topk_report.format_summary(topk_report.summary(topk_record))
    assert "B=1 next_n=1 ctx=131072" in text and "split-2k" in text and "1.90x" in text and "0.46x" in text
    assert "B=64 next_n=1 ctx=8192" in text.splitlines()[-1] and " - " in text.splitlines()[-1]
    assert "0.9990" in topk_report.format_agreement(topk_report.agreement(topk_record))


def test_load_reads_a_run_and_returns_none_without_one(tmp_path, topk_record):
    path = tmp_path / "run.json"
    assert topk_report.load(path) is None
    path.write_text(json.dumps(topk_record))
    assert topk_report.load(path) == topk_record


def test_load_checks_the_run_as_the_benchmarks_reader_does(tmp_path):
    assert topk_report.load(tmp_path / "none.json") is None  # no run committed
    cut = tmp_path / "cut.json"
    cut.write_text('{"shapes": [')
    with pytest.raises(ValueError, match="cut.json is not a results file"):
        topk_report.load(cut)
    negative = tmp_path / "negative.json"
    negative.write_text('{"shapes": [{"rows": [{"us": -1.0}]}]}')
    with pytest.raises(ValueError, match=r"shapes\[0\]\.rows\[0\]\.us is -1.0"):
        topk_report.load(negative)


def _sm90_shape(configs: dict, default: str = "sm90") -> dict:
    rows = [{"impl": name, "config": config, "path": "sm90", "us": us, "valid_rows": 1.0}
            for name, (config, us) in configs.items()]
    rows.append({"impl": "vllm decode_topk", "us": 9.0, "valid_rows": 1.0})
    return {"shape": {"batch": 64, "next_n": 1, "avg_ctx": 8192}, "rows": rows, "default_config": default}


def test_variants_name_each_launch_by_its_one_change_from_the_default():
    base = {"warps": 32, "chunks": 2, "cluster": 2, "bits": 12}
    record = {"shapes": [_sm90_shape({"sm90-bits11": ({**base, "bits": 11}, 12.0), "sm90": (base, 10.0),
                                      "sm90-cluster-x2": ({**base, "cluster": 4, "chunks": 1}, 15.0)})]}
    rows = topk_report.variants(record, Shape(64, 1, 8192))
    assert [(r["variant"], r["change"], r["default"]) for r in rows] == [
        ("sm90", None, True), ("sm90-bits11", "bits: 12 -> 11", False),
        ("sm90-cluster-x2", "cluster: 2 -> 4 (chunks 2 -> 1)", False)]
    assert [r["over_default"] for r in rows] == [1.0, pytest.approx(1.2), pytest.approx(1.5)]
    assert "bits: 12 -> 11" in topk_report.format_variants(rows)
    with pytest.raises(ValueError, match="no shape"):
        topk_report.variants(record, Shape(1, 1, 131072))
    two = {"shapes": [_sm90_shape({"sm90": (base, 10.0), "sm90-x": ({**base, "bits": 11, "warps": 16}, 9.0)})]}
    with pytest.raises(ValueError, match=r"sm90-x differs from the default launch in \['bits', 'warps'\]"):
        topk_report.variants(two, Shape(64, 1, 8192))


def test_variants_of_the_committed_run_are_each_one_change():
    record = topk_report.load()
    for s in record["shapes"]:
        rows = topk_report.variants(record, Shape(**s["shape"]))
        # The default and at least three variants: as many as hopper_launches keeps under 96 positions a thread.
        assert rows[0]["default"] and len(rows) >= 4 and all(r["us"] > 0 for r in rows)


def test_docs_topk_table_is_the_generated_one():
    text = (Path(__file__).resolve().parents[1] / "docs" / "topk.md").read_text()
    table = re.search(r"<!-- top-k table: generated -->\n(.*)\n<!-- end of top-k table -->", text, re.S)
    assert table, "docs/topk.md has no generated top-k table"
    assert table.group(1) == topk_report.markdown_table(topk_report.summary(topk_report.load())), \
        "docs/topk.md's table is stale: paste topk.report.markdown_table of the committed run"


def test_markdown_table_names_the_fastest_launch_and_vllms_kernel():
    row = {"shape": Shape(64, 1, 8192), "logits_us": 30.0, "ours_us": 9.0, "ours_launch": "sm90-bits11",
           "ours_default_launch": "sm90", "ours_default_us": 10.0, "vllm_best_us": 12.5,
           "vllm_best": "vllm top_k_per_row_decode", "default_over_vllm_best": 0.8, "step_us": 40.0,
           "deepgemm_step_us": None}
    lines = topk_report.markdown_table([row]).splitlines()
    assert lines[2] == ("| 64, 1, 8K | 30.0 | 10.0 | 9.0 (bits11) | 12.5 (`top_k_per_row_decode`) | 0.80x | 40.0 "
                        "| - |")
