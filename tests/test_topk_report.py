import json

import pytest

from preshuffle import topk_report
from preshuffle.shapes import Shape


def shape_record(batch, ctx, logits, ours, vllm, step=None, dg_step=None, valid=1.0):
    """A shape of a benchmarks/topk_gpu.py run: ``ours`` {launch: us}, ``vllm`` {kernel: us}."""
    rows = [{"impl": name, "us": us, "valid_rows": valid, "path": "row" if name.startswith("row") else "split"}
            for name, us in ours.items()]
    rows += [{"impl": name, "us": us, "valid_rows": 1.0} for name, us in vllm.items()]
    rows.append({"impl": "torch.topk", "error": "selection is not a top-2048 on every row", "valid_rows": 0.5})
    steps = {k: v for k, v in ((topk_report.OUR_STEP, step), (topk_report.DEEPGEMM_STEP, dg_step)) if v is not None}
    return {"shape": {"batch": batch, "next_n": 1, "avg_ctx": ctx}, "logits_us": logits, "rows": rows,
            "steps_us": steps, "default_config": next(iter(ours)),
            "agreement": [{"precision": "fp8", "rows": 3, "min": 0.999, "mean": 0.9999, "changed_per_row": 0.2,
                           "gaps_dropped": [1e-4], "gaps_added": [-2e-4]}]}


RECORD = {"provenance": {"gpu": "H200", "torch": "2.11", "triton": "3.6", "date": "d"}, "shapes": [
    shape_record(1, 131072, 11.0, {"split-4k": 12.0, "split-2k": 10.0},
                 {"vllm decode_topk": 26.0, "vllm persistent_topk": 27.0, "vllm cooperative_topk": 26.0},
                 step=21.0, dg_step=40.0),
    shape_record(64, 8192, 30.0, {"row-16w": 8.0}, {"vllm top_k_per_row_decode": 15.0, "vllm persistent_topk": 11.0}),
]}


def test_summary_compares_our_fastest_launch_with_vllms_best_kernel():
    first, second = topk_report.summary(RECORD)
    assert first["shape"] == Shape(1, 1, 131072)
    assert (first["ours_us"], first["ours_launch"], first["ours_default_us"]) == (10.0, "split-2k", 12.0)
    assert (first["vllm_best_us"], first["vllm_best"], first["decode_topk_us"]) == (26.0, "vllm cooperative_topk", 26.0)
    assert first["ours_over_vllm_best"] == pytest.approx(10 / 26)
    assert first["step_speedup"] == pytest.approx(40 / 21) and first["topk_share"] == pytest.approx(10 / 21)
    assert first["torch_us"] is None and first["every_selection_checked"]
    assert second["vllm_best"] == "vllm persistent_topk" and second["step_us"] is None
    assert second["step_speedup"] is None


def test_summary_marks_a_timed_selection_that_failed_its_check():
    bad = {"shapes": [shape_record(8, 65536, 30.0, {"split-4k": 9.0}, {}, valid=0.9)]}
    assert not topk_report.summary(bad)[0]["every_selection_checked"]


def test_agreement_and_nearest():
    rows = topk_report.agreement(RECORD)
    assert [(r["shape"].batch, r["precision"], r["min"]) for r in rows] == [(1, "fp8", 0.999), (64, "fp8", 0.999)]
    assert topk_report.nearest(RECORD, 2, 100000)["shape"] == Shape(1, 1, 131072)
    assert topk_report.nearest(RECORD, 128, 8192)["shape"] == Shape(64, 1, 8192)
    with pytest.raises(ValueError, match="no measured shapes"):
        topk_report.nearest({"shapes": []}, 1, 1)


def test_formats_print_every_shape_and_what_was_not_measured():
    text = topk_report.format_summary(topk_report.summary(RECORD))
    assert "B=1 next_n=1 ctx=131072" in text and "split-2k" in text and "1.90x" in text
    assert "B=64 next_n=1 ctx=8192" in text.splitlines()[-1] and " - " in text.splitlines()[-1]
    assert "0.9990" in topk_report.format_agreement(topk_report.agreement(RECORD))


def test_load_reads_a_run_and_returns_none_without_one(tmp_path):
    path = tmp_path / "run.json"
    assert topk_report.load(path) is None
    path.write_text(json.dumps(RECORD))
    assert topk_report.load(path) == RECORD
