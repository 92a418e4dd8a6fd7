"""preshuffle.vllm_call_report: the runs at vLLM's call, read; ratios round by round."""

import json

import pytest

from preshuffle import provenance
from preshuffle import vllm_call_report as vcr
from preshuffle.shapes import Shape


def row(shape, who, width, us):
    return {"shape": {"batch": shape.batch, "next_n": shape.next_n, "avg_ctx": shape.avg_ctx}, "who": who,
            "max_model_len": width, "us": us, "us_median": sorted(us)[len(us) // 2]}


ONE, FOUR = Shape(64, 1, 8192), Shape(64, 4, 8192)


# The digest of the package's logits kernels as they are: a run of them.
CURRENT = {"logits": {"roots": list(provenance.LOGITS), "sha256": provenance.source_digest(provenance.LOGITS)}}


def record(deepgemm_four="deepgemm"):
    rows = [row(ONE, "ours", 100, [10.0, 11.0, 12.0]), row(ONE, "deepgemm", 100, [10.0, 10.0, 10.0]),
            row(ONE, "ours", 500, [20.0, 30.0, 10.0]), row(ONE, "deepgemm", 500, [10.0, 10.0, 10.0]),
            row(ONE, "ours-exact", 500, [40.0, 30.0, 20.0]),
            row(FOUR, "ours", 500, [30.0, 30.0, 30.0]), row(FOUR, deepgemm_four, 500, [20.0, 20.0, 20.0])]
    return {"provenance": {"gpu": "NVIDIA H200", "torch": "2.11", "triton": "3.6", "date": "2026-12-02T00:00",
                           "git_commit": "abcdef0123", "kernels": CURRENT}, "deepgemm": {"branch": "nv_dev"}, "rounds": 3,
            "vllm_max_model_len": 500, "rows": rows}


def test_round_ratio_takes_each_round_against_its_own_round():
    q = vcr.round_ratio({"us": [10.0, 30.0, 20.0]}, {"us": [10.0, 10.0, 40.0]})
    assert q == {"median": 1.0, "low": 0.5, "high": 3.0, "rounds": 3}
    assert vcr.round_ratio({"us": [1.0]}, None) is None and vcr.round_ratio({}, {"us": [1.0]}) is None


def test_summary_gives_vllms_width_the_rows_own_and_our_other_paths():
    one, four = vcr.summary(record())
    assert one["shape"] == ONE and (one["ours_us"], one["deepgemm_us"], one["flattened"]) == (20.0, 10.0, False)
    assert one["ratio"] == {"median": 2.0, "low": 1.0, "high": 3.0, "rounds": 3}
    assert one["tight"]["median"] == pytest.approx(1.1)
    assert one["own"]["ours-exact"] == {"median": 2.0, "low": 1.0, "high": 2.0, "rounds": 3}
    assert one["own"]["ours-block16"] is None
    assert four["ratio"]["median"] == 1.5 and four["tight"] is None


def test_the_headline_spans_native_rows_only_and_the_table_says_which_way_ratios_go():
    text = vcr.results_table(record(), record("deepgemm-flattened"), {ONE: (30.0, 10.0)})
    headline, *rest = text.splitlines()
    assert headline == ("At vLLM's own call on an NVIDIA H200, our fp8 logits kernel's time over DeepGEMM nv_dev's "
                        "(the build vLLM runs) is 2.00x (rounds 1.00-3.00x) at next_n = 1 and 1.50x (rounds 1.50x) "
                        "at 4.")
    assert "under 1.00x ours is faster" in text and "the median of 3 rounds" in text
    assert "commit abcdef0 (main's run: abcdef0)." in text
    assert "| 64, 1, 8K | 20.0 | 10.0 | 2.00x (1.00-3.00) | 10.0 | 2.00x | 2.00x | - | 3.00x |" in rest
    assert "| 64, 4, 8K | 30.0 | 20.0 | 1.50x | 20.0 (flat) | 1.50x | - | - | - |" in rest
    assert text.endswith("as vLLM does without a kernel.")
    # With every row flattened there is no native ratio to state.
    with pytest.raises(ValueError, match="no shape with ours and DeepGEMM both timed"):
        vcr.headline(record() | {"rows": [r for r in record()["rows"] if r["who"] == "ours"]})


def test_the_headline_refuses_a_run_of_too_few_rounds_for_a_spread():
    with pytest.raises(ValueError, match="the run has 2 rounds: a headline ratio needs at least 3"):
        vcr.headline(record() | {"rounds": 2})


def test_the_table_refuses_a_run_of_other_kernels_than_the_packages():
    other = record()
    other["provenance"]["kernels"] = {"logits": {**CURRENT["logits"], "sha256": "0" * 64}}
    with pytest.raises(ValueError, match="the main run is stale: its logits kernels' source has changed"):
        vcr.results_table(record(), other)
    del other["provenance"]["kernels"]
    with pytest.raises(ValueError, match="the nv_dev run is stale: it records no digest"):
        vcr.results_table(other)


def test_splits_reads_the_launches_that_changed_only_the_split():
    rows = record()["rows"] + [
        {**row(ONE, "ours-config", 100, [5.0, 6.0, 7.0]), "asked": {"splits": 4}},
        {**row(ONE, "ours-config", 100, [9.0, 9.0, 9.0]), "asked": {"splits": 4, "stages": 6}},
        {**row(FOUR, "ours-config", 100, [1.0, 1.0, 1.0]), "asked": {"splits": 8}}]
    assert vcr.splits(record() | {"rows": rows}, ONE) == {4: 6.0}
    assert vcr.splits(record(), ONE) == {}


def test_load_refuses_a_file_that_is_no_such_run(tmp_path):
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="is not a run of benchmarks/vllm_call_gpu.py"):
        vcr.load(path)
    path.write_text(json.dumps({**record(), "rows": [row(ONE, "ours", 500, [-1.0])]}))
    with pytest.raises(ValueError, match="a time or share must be finite and >= 0"):
        vcr.load(path)


def test_the_committed_runs_are_read_and_hold_vllms_call_on_every_measured_shape():
    from preshuffle.shapes import MEASURED_SHAPES

    for name, path in vcr.RUNS.items():
        run = vcr.load(path)
        assert run["vllm_max_model_len"] == 163840 and run["rounds"] >= 3, name
        rows = vcr.summary(run)
        assert [r["shape"] for r in rows] == list(MEASURED_SHAPES), name
        assert all(r["ratio"] and r["ratio"]["rounds"] >= 3 for r in rows), name
        assert all(r["meets_contract"] for r in run["rows"] if "us" in r), name
