"""Reading the committed H200 results: every timed row was checked first, and the derived numbers follow from the
raw ones."""

import json

import pytest

from preshuffle import deepgemm, negotiation, report
from preshuffle.shapes import ANCHOR_SHAPES, MEASURED_SHAPES, MTP_SHAPES, Shape
from preshuffle.testing.numeric import CONTRACTS


def test_load_reads_results_with_their_provenance(record):
    p = record["provenance"]
    assert p["gpu"] == "NVIDIA H200" and len(p["git_commit"]) == 40 and p["torch"] and p["triton"] and p["date"]
    assert 3e12 < record["copy_bytes_per_s"] < 6e12 and record["deepgemm"]


def test_load_every_timed_row_was_checked_against_its_contract_first(record):
    timed = [r for r in record["rows"] if "us" in r]
    assert len(timed) == len(record["rows"])
    assert all(r["meets_contract"] and r["same_inf_pattern"] for r in timed)
    # DeepGEMM's repeats too, compared through the reference's -inf pattern (it leaves those positions unwritten).
    # The scalar loops (Python, float64: the same operations in the same order every time) run once.
    assert all(r["bitwise_repeatable"] is True for r in timed if r["kernel"] != "loops")
    assert [r["kernel"] for r in timed if "bitwise_repeatable" not in r] == ["loops"]
    # Held to the package's contracts, not to what the file says they were (a widened one would pass itself),
    # and the file must have recorded those.
    assert record["contracts"] == CONTRACTS
    assert all(r["max_rel_error"] <= CONTRACTS[r["precision"]]["max_rel_error"] for r in timed)
    assert all(r["calc_diff"] <= CONTRACTS["fp8"]["calc_diff"] for r in timed if r["precision"] == "fp8")


def test_the_packages_contracts_are_the_specs():
    # docs/accuracy.md, "The contracts": exact, per-logit error <= 1e-5 of the sum of |terms|; fp8, <= 1e-3 and
    # calc_diff vs float64 <= 1e-7.
    assert CONTRACTS == {"exact": {"max_rel_error": 1e-5}, "fp8": {"max_rel_error": 1e-3, "calc_diff": 1e-7}}


def test_load_shares_follow_from_bytes_and_time(record):
    for row in record["rows"]:
        expected = 100 * row["bytes"] / (row["us"] * 1e-6) / record["copy_bytes_per_s"]
        assert row["pct_copy"] == pytest.approx(expected, rel=1e-9)


def test_shapes_are_the_anchors_then_multi_token_prediction(record):
    assert report.shapes(record) == list(ANCHOR_SHAPES) + list(MTP_SHAPES) == list(MEASURED_SHAPES)


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
            block1 = report.find(record, shape, kernel="hopper", precision="fp8", variant="block1")  # gathered
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


def test_host_time_summary_reads_every_state_of_the_committed_host_time_run():
    record = report.load(report.RESULTS / "h200-host-time.json")
    summary = report.host_time_summary(record)
    assert [(s["shape"], s["state"]) for s in summary] == [
        (shape, state) for state in ("fresh", "after the call's graph timed", "after the plain call timed",
                                     "after DeepGEMM timed")
        for shape in (Shape(64, 1, 8192), Shape(1, 1, 131072))]
    for s in summary:
        calls = sorted(r["us"]["call"] for r in record["rows"]
                       if Shape(**r["shape"]) == s["shape"] and r["state"] == s["state"])
        assert (s["call"]["min"], s["call"]["median"], s["call"]["max"]) == (calls[0], calls[len(calls) // 2], calls[-1])
        assert s["repeats"] == len(calls) == 3
        assert s["lookup"]["median"] + s["alloc"]["median"] + s["launch"]["median"] < s["call"]["max"]
        loops = sorted(r["profile"]["python_loop_us"] for r in record["rows"]
                       if Shape(**r["shape"]) == s["shape"] and r["state"] == s["state"])
        assert s["python_loop"]["median"] == loops[1]
    assert "over 3; medians: call_with_out" in report.format_host_time(summary)
    assert "; Python loop " in report.format_host_time(summary)


def launch_rule_us(record, shape, variant, precision="fp8"):
    """The committed row the benchmark flagged as the launch rule's, read without the report module."""
    rows = [r["us"] for r in record["rows"] if r["kernel"] in ("hopper", "portable") and r["variant"] == variant
            and r.get("rule") and r["timing"] == "graph" and r["precision"] == precision
            and Shape(**r["shape"]) == shape]
    assert len(rows) <= 1
    return rows[0] if rows else None


@pytest.mark.parametrize("block_size, layout, variant", [
    (1, "normal", "block1"), (16, "normal", "block16-normal"), (16, "shuffle", "block16-shuffle"),
    (64, "normal", "block64-normal"), (64, "shuffle", "block64-shuffle")])
def test_variant_time_is_the_launch_rule_row(record, block_size, layout, variant):
    for shape in ANCHOR_SHAPES:
        for precision in ("fp8", "exact"):
            expected = launch_rule_us(record, shape, variant, precision)
            assert expected and report.variant_time(record, shape, block_size, layout, precision) == expected


def test_variant_time_of_an_unmeasured_combination_is_none(record):
    assert report.variant_time(record, Shape(64, 1, 8192), 32) is None
    assert report.variant_time(record, Shape(64, 1, 8192), 1, "shuffle") is None
    assert report.variant_time(record, Shape(3, 1, 100), 64) is None
    assert report.variant_time(record, Shape(64, 3, 8192), 1) is None  # next_n 3-4 run on 64- and 16-token pages


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
    ((2048, 8192, 1), (4096, 1, 8192)), ((1, 1024, 3), (64, 3, 8192)), ((1, 1024, 4), (64, 4, 8192)), ((300, 8192, 4), (256, 4, 8192))])
def test_nearest_shape_prefers_next_n_then_log_distance(record, asked, nearest):
    assert report.nearest_shape(record, *asked) == Shape(*nearest)


@pytest.mark.parametrize("args, message", [
    ((0, 8192, 1), "batch"), ((64, 8192.0, 1), "avg_ctx"), ((64, 8192, True), "next_n")])
def test_nearest_shape_rejects_bad_sizes(record, args, message):
    with pytest.raises(ValueError, match=message):
        report.nearest_shape(record, *args)


def test_nearest_shape_of_a_run_with_no_rows():
    with pytest.raises(ValueError, match="^record has no measured rows$"):
        report.nearest_shape({"rows": []}, 64, 8192, 1)


@pytest.mark.parametrize("precision", ["exact", "fp8"])
def test_workload_bars_are_the_results_numbers(record, precision):
    variants = ["block1", "block16-normal", "block16-shuffle", "block64-normal", "block64-shuffle"]
    for shape in report.shapes(record):
        nearest, bars = report.workload_bars(record, shape.batch, shape.avg_ctx, shape.next_n, 16, "shuffle",
                                             precision)
        assert nearest == shape
        assert [b["us"] for b in bars[:-1]] == [launch_rule_us(record, shape, v, precision) for v in variants]
        assert [b["chosen"] for b in bars] == [False, False, True, False, False, False]
        flattened = shape.next_n not in deepgemm.MAIN.next_n  # the run's build is main
        dg = report.find(record, shape, kernel="deepgemm-flattened" if flattened else "deepgemm")
        assert bars[-1]["label"] == ("DeepGEMM (same run, flattened rows)" if flattened else "DeepGEMM (same run)")
        assert (bars[-1]["us"], bars[-1]["pct_copy"]) == (dg["us"], dg["pct_copy"])


def test_workload_bars_share_follows_from_the_row(record):
    _, bars = report.workload_bars(record, 64, 8192, 1, 64, "normal", "exact")
    row = report.find(record, Shape(64, 1, 8192), kernel="hopper", precision="exact", variant="block64-normal")
    assert bars[3]["label"] == "ours block64-normal (exact)" and bars[3]["pct_copy"] == row["pct_copy"]


@pytest.mark.parametrize("block_size, layout, precision, message", [
    (1, "shuffle", "exact", "block_size, layout"), (32, "normal", "exact", "block_size, layout"),
    (64, "normal", "fp16", "precision")])
def test_workload_bars_rejects_unknown_variants(record, block_size, layout, precision, message):
    with pytest.raises(ValueError, match=message):
        report.workload_bars(record, 64, 8192, 1, block_size, layout, precision)


def test_best_splits_keep_the_fastest_timed_split_of_each_configuration():
    rows = [{"shape": "s", "variant": "v", "config": {"a": 1}, "pps": 2, "us": 5.0},
            {"shape": "s", "variant": "v", "config": {"a": 1}, "pps": 4, "us": 4.0},
            {"shape": "s", "variant": "v", "config": {"a": 1}, "pps": 8},  # failed its contract: not timed
            {"shape": "s", "variant": "v", "config": {}, "pps": 2, "us": 6.0}]
    best = report.best_splits(rows)
    assert {key: row["pps"] for key, row in best.items()} == {("s", "v", '{"a": 1}'): 4, ("s", "v", "{}"): 2}


@pytest.mark.parametrize("batch", [64, 256])
def test_the_next_n_3_rule_is_the_committed_sweeps_fastest_fp8_launch(monkeypatch, batch):
    """The warpgroups a row and their registers: the fastest fp8 launch of results/h200-hopper-sweep.json; the split
    at 256 sequences too. (That sweep cut rows on the host; at 64 sequences the split is set by the sweep at vLLM's
    call, tests/test_kernels_hopper.py.)"""
    from preshuffle.kernels import launch

    monkeypatch.setattr(launch, "multiprocessor_count", lambda: 132)
    best = report.best_splits(report.load(report.RESULTS / "h200-hopper-sweep.json")["rows"])
    fp8 = {c: r for (s, _, c), r in best.items() if s == f"B={batch} next_n=3 ctx=8192" and "exact" not in c}
    fastest = min(fp8, key=lambda c: fp8[c]["us"])
    rule = launch.hopper_config(batch, 3)
    assert json.loads(fastest) == {"row_warpgroups": rule.row_warpgroups, "maxnreg": rule.maxnreg}
    if batch == 256:
        assert fp8[fastest]["pps"] == launch.hopper_programs_per_sm(batch, 3, exact=False)


def test_gather_costs_compare_each_caches_fastest_fp8_launch():
    fp8, exact = {"precision": "fp8"}, {"precision": "exact"}
    rows = [{"shape": "s", "variant": "block1", "config": {}, "launch": fp8, "pps": 2, "us": 30.0},
            {"shape": "s", "variant": "block1", "config": {"stages": 3}, "launch": fp8, "pps": 3, "us": 24.0},
            {"shape": "s", "variant": "block1", "config": {}, "launch": fp8, "pps": 3, "us": 9.0,
             "loader": "an experiment"},
            {"shape": "s", "variant": "block1", "config": {"precision": "exact"}, "launch": exact, "pps": 3, "us": 5.0},
            {"shape": "s", "variant": "block64-normal", "config": {}, "launch": fp8, "pps": 2, "us": 16.0},
            {"shape": "s", "variant": "block64-normal", "config": {}, "launch": fp8, "pps": 4, "us": 20.0},
            {"shape": "t", "variant": "block1", "config": {}, "launch": fp8, "pps": 2, "us": 7.0}]  # no block 64 here
    assert report.gather_costs(rows) == [{"shape": "s", "block1_us": 24.0, "block64_us": 16.0, "ratio": 1.5}]


def test_page_read_costs_read_every_shape_of_the_committed_run():
    record = report.load(report.RESULTS / "h200-page-read.json")
    costs = report.page_read_costs(record)
    rows = {(r["shape"], r["cache"]): r for r in record["rows"]}
    assert len(costs) == 6 and all(r["kernel_meets_contract"] for r in record["rows"])
    for c in costs:
        one, base = rows[(c["shape"], "block1")], rows[(c["shape"], "block64-normal")]
        assert c["block1_floor_ratio"] == one["floor_us"] / base["floor_us"]
        assert c["block1_kernel_ratio"] == one["kernel_us"] / base["kernel_us"]
        assert c["block1_floor_over_block64_kernel"] == one["floor_us"] / base["kernel_us"]
        assert c["block64-normal_floor_ratio"] == 1.0
    text = report.format_page_read(costs)
    assert all(c["shape"] in text for c in costs) and "kernel / its floor" in text


# report.targets, on synthetic runs. Times and errors are powers of two, so x times one of them over it is x exactly.
FP8_US, DG_US, DG_ERROR = 8.0, 16.0, 2.0**-12
MTP_SHAPE, B1_SHAPE, B4096_SHAPE = Shape(64, 3, 8192), Shape(1, 1, 131072), Shape(4096, 1, 8192)
HOST_SHAPES = (Shape(64, 1, 8192), B1_SHAPE)
WORST = Shape(256, 1, 8192)  # where a target is pushed: an anchor neither first nor last, so the worst shape must count


def as_json(shape):
    return {"batch": shape.batch, "next_n": shape.next_n, "avg_ctx": shape.avg_ctx}


def timed(shape, kernel, us, precision="fp8", variant=report.BASE, timing="graph", error=DG_ERROR / 2):
    row = {"shape": as_json(shape), "kernel": kernel,
           "precision": precision, "variant": variant, "timing": timing, "us": us, "pct_copy": 97.0,
           "max_rel_error": error, "calc_diff": 1e-9}
    return {**row, "rule": True} if kernel == "hopper" else row


def synthetic_record():
    """A run meeting every target with room to spare: on each anchor, our fp8 path at half DeepGEMM's time and error,
    the exact path at DeepGEMM's time, every cache at the fp8 path's, the eager call 4 us over the graph's, 97% of the
    copy; next_n = 3 at a quarter of DeepGEMM's time on the flattened rows; 5 us of host time."""
    rows = []
    for shape in ANCHOR_SHAPES:
        rows += [timed(shape, "hopper", FP8_US), timed(shape, "hopper", DG_US, precision="exact"),
                 timed(shape, "deepgemm", DG_US, error=DG_ERROR), timed(shape, "hopper", FP8_US + 4, timing="eager")]
        rows += [timed(shape, "hopper", FP8_US, variant=v)
                 for v in ("block1", "block16-normal", "block16-shuffle", "block64-shuffle")]
    rows += [timed(MTP_SHAPE, "hopper", FP8_US), timed(MTP_SHAPE, "deepgemm-flattened", 4 * FP8_US, error=DG_ERROR)]
    return {"rows": rows, "host_us": [{"shape": as_json(s), "us": 5.0} for s in HOST_SHAPES]}


def edit(record, shape, kernel, field, value, precision="fp8", variant=report.BASE, timing="graph"):
    """Set ``field`` of the one row of ``shape`` with these fields."""
    found = [r for r in record["rows"] if Shape(**r["shape"]) == shape and (r["kernel"], r["precision"],
             r["variant"], r["timing"]) == (kernel, precision, variant, timing)]
    assert len(found) == 1
    found[0][field] = value


def edit_host(record, shape, us):
    for h in record["host_us"]:
        if Shape(**h["shape"]) == shape:
            h["us"] = us


# docs/performance.md, "Targets": a prefix of each target's name -> (comparison, limit, how to give a run the
# value x for it). The fp8 error's limit is docs/accuracy.md's "at most 1.1x DeepGEMM's error".
TARGETS = {
    "fp8 path <= DeepGEMM's time": ("<=", 1.0, lambda r, x: edit(r, WORST, "hopper", "us", DG_US * x)),
    "fp8 error <= 1.1x DeepGEMM's": ("<=", 1.1, lambda r, x: edit(r, WORST, "hopper", "max_rel_error", DG_ERROR * x)),
    "B=4096 ctx 8K: share of the copy": (">=", 95.0, lambda r, x: edit(r, B4096_SHAPE, "hopper", "pct_copy", x)),
    "B=1 ctx 128K <= 9 us": ("<=", 9.0, lambda r, x: edit(r, B1_SHAPE, "hopper", "us", x)),
    "exact path <= 1.2x DeepGEMM": ("<=", 1.2, lambda r, x: edit(r, WORST, "hopper", "us", DG_US * x, "exact")),
    "block 16 natural <= 1.1x": ("<=", 1.1, lambda r, x: edit(r, WORST, "hopper", "us", FP8_US * x,
                                                              variant="block16-normal")),
    "block 16 preshuffled <= 1.1x": ("<=", 1.1, lambda r, x: edit(r, WORST, "hopper", "us", FP8_US * x,
                                                                  variant="block16-shuffle")),
    "block 1 <= 1.5x": ("<=", 1.5, lambda r, x: edit(r, WORST, "hopper", "us", FP8_US * x, variant="block1")),
    "next_n = 3": (">=", 2.0, lambda r, x: edit(r, MTP_SHAPE, "deepgemm-flattened", "us", FP8_US * x)),
    "eager call - graph replay <= 10 us": ("<=", 10.0, lambda r, x: edit(r, Shape(64, 1, 8192), "hopper", "us",
                                                                         FP8_US + x, timing="eager")),
    "host time of an unchecked call <= 10 us": ("<=", 10.0, lambda r, x: edit_host(r, B1_SHAPE, x)),
}


def targets_by_name(record):
    """report.targets keyed by TARGETS' prefixes (each target must have exactly one), in report order."""
    checks = {}
    for check in report.targets(record):
        prefixes = [p for p in TARGETS if check["target"].startswith(p)]
        assert len(prefixes) == 1, check["target"]
        checks[prefixes[0]] = check
    assert set(checks) == set(TARGETS)
    return checks


@pytest.mark.parametrize("name", TARGETS)
def test_targets_are_met_at_the_specs_limit_and_missed_just_past_it(name):
    kind, limit, give = TARGETS[name]
    for x, met in ((limit, True), (limit * (1.01 if kind == "<=" else 0.99), False)):
        record = synthetic_record()
        give(record, x)
        checks = targets_by_name(record)
        assert checks[name]["value"] == pytest.approx(x, rel=1e-12) and checks[name]["met"] is met, (x, checks[name])
        assert all(c["met"] for other, c in checks.items() if other != name)
        line = report.format_targets(list(checks.values())).splitlines()[list(checks).index(name)]
        assert line.startswith("met " if met else "MISS") and line.endswith(f": {x:.2f}")


def test_the_exact_target_counts_the_next_n_1_shapes_only():
    record = synthetic_record()
    edit(record, Shape(64, 2, 8192), "hopper", "us", 2 * DG_US, "exact")   # next_n = 2: outside the target
    check = targets_by_name(record)["exact path <= 1.2x DeepGEMM"]
    assert check["met"] and check["value"] == 1.0


def test_next_n_3_counts_in_its_own_target_only():
    # "time <= DeepGEMM's on all eight shapes" are the anchors; next_n = 3 is held to 2x the flattened rows instead.
    record = synthetic_record()
    TARGETS["next_n = 3"][2](record, 0.5)   # our fp8 path at twice DeepGEMM's time on the flattened rows
    checks = targets_by_name(record)
    assert [name for name, c in checks.items() if not c["met"]] == ["next_n = 3"]
    assert checks["next_n = 3"]["value"] == 0.5 and checks["fp8 path <= DeepGEMM's time"]["value"] == 0.5


def test_a_run_without_next_n_3_misses_that_target_and_still_prints():
    record = synthetic_record()
    record["rows"] = [r for r in record["rows"] if Shape(**r["shape"]) != MTP_SHAPE]
    checks = targets_by_name(record)
    assert checks["next_n = 3"]["value"] is None and not checks["next_n = 3"]["met"]
    assert all(c["met"] for name, c in checks.items() if name != "next_n = 3")
    line = report.format_targets(list(checks.values())).splitlines()[list(checks).index("next_n = 3")]
    assert line.startswith("MISS  next_n = 3") and line.endswith(": not measured")


def test_ladder_of_chapter_3_gives_every_step_its_time_per_logit():
    shape = {"batch": 2, "next_n": 1, "avg_ctx": 100}
    rows = [{"shape": shape, "step": "scalar loops (Python)", "chapter": 3, "kernel": "loops", "precision": "exact",
             "us": 2e5, "finite": 100, "pct_copy": 1e-4, "max_rel_error": 1e-16, "positions": 100},
            {"shape": shape, "step": "a program walks its row in chunks", "chapter": 3, "kernel": "steps",
             "precision": "exact", "us": 8.0, "finite": 200, "pct_copy": 5.0, "max_rel_error": 1e-7},
            {"shape": shape, "step": "chapter 3's kernel (exact)", "kernel": "portable", "precision": "exact",
             "us": 4.0, "finite": 200, "pct_copy": 10.0, "max_rel_error": 1e-7}]
    record = {"rows": rows}
    steps = report.ladder(record, Shape(2, 1, 100), chapter=3)
    assert [s["ns_per_logit"] for s in steps] == [2e6, 40.0]
    assert [s["step"] for s in report.ladder(record, Shape(2, 1, 100))] == ["chapter 3's kernel (exact)"]
    step = report.format_step({Shape(2, 1, 100): steps}, "a program walks its row in chunks")
    assert "40 ns a logit" in step and "50000.00x as fast as the step before" in step  # per logit, not per call
    assert "(the first 100 positions of one sequence)" in report.format_step({Shape(2, 1, 100): steps},
                                                                             "scalar loops (Python)")
    text = report.format_ladder(steps)
    assert text.splitlines()[1].split()[-4] == "200000.0*" and text.endswith("* on the first 100 positions of one sequence")


def test_format_step_gives_a_rungs_time_and_its_gain_over_the_rung_before(record):
    ladders = {shape: report.ladder(record, shape) for shape in (Shape(64, 1, 8192), Shape(4096, 1, 8192))}
    first, second = ladders[Shape(64, 1, 8192)][:2]
    text = report.format_step(ladders, second["step"])
    lines = text.splitlines()
    assert len(lines) == 2 and lines[0].startswith("B=64 next_n=1 ctx=8192")
    assert f"{second['us']:.1f} us" in lines[0] and f"{first['us'] / second['us']:.2f}x as fast" in lines[0]
    assert f"{second['ns_per_logit']:.3g} ns a logit" in lines[0]
    assert "as fast" not in report.format_step(ladders, first["step"])
    with pytest.raises(ValueError, match="step 'no such step' is not in the ladder of B=64"):
        report.format_step(ladders, "no such step")


def run_against(record: dict, build, scale: float, extra_rows=()) -> dict:
    """The committed run as if timed against another DeepGEMM build: its DeepGEMM rows ``scale`` times as long."""
    run = json.loads(json.dumps(record))
    run["deepgemm"] = build
    for row in run["rows"]:
        if row["kernel"].startswith("deepgemm"):
            row["us"] *= scale
    run["rows"] += [dict(row) for row in extra_rows]
    return run


def test_a_run_recorded_before_builds_were_named_reads_as_its_version(record):
    record = {**record, "deepgemm": "2.6.1"}  # how runs named DeepGEMM before they named its build
    assert report.deepgemm_build(record) == {"version": record["deepgemm"], "branch": None, "commit": None,
                                             "source": "unknown"}
    assert report.build_label(record) == f"DeepGEMM {record['deepgemm']}"
    assert report.provenance_line(record).endswith(", DeepGEMM in the same process")
    named = run_against(record, {"version": "2.5.0", "branch": "nv_dev", "commit": "a6b593d", "source": "env"}, 1)
    assert report.build_label(named) == "DeepGEMM nv_dev a6b593d (2.5.0)"
    assert report.provenance_line(named).endswith(", DeepGEMM nv_dev a6b593d (2.5.0) in the same process")
    assert report.deepgemm_build({"deepgemm": None}) is None and report.build_label({"deepgemm": None}) is None


def test_against_builds_divides_only_times_of_one_run(record):
    """Two runs, one a build: each ratio is ours over that run's DeepGEMM; a shape one run measured natively
    (next_n = 4 on nv_dev) and the other flattened keeps each run's kind of row."""
    shape = Shape(32, 4, 8192)  # a shape the committed run does not have
    ours = {"shape": {"batch": 32, "next_n": 4, "avg_ctx": 8192}, "variant": "block64-normal", "kernel": "hopper",
            "precision": "fp8", "timing": "graph", "rule": True, "us": 55.0}
    main = run_against(record, {"version": "2.6.1", "branch": "main", "commit": "54e2261", "source": "env"}, 1.0,
                       [ours, {**ours, "kernel": "deepgemm-flattened", "rule": False, "us": 60.0}])
    nv_dev = run_against(record, {"version": "2.5.0", "branch": "nv_dev", "commit": "a6b593d", "source": "env"}, 0.5,
                         [{**ours, "us": 56.0}, {**ours, "kernel": "deepgemm", "rule": False, "us": 40.0}])
    rows = {r["shape"]: r["runs"] for r in report.against_builds([main, nv_dev])}
    assert list(rows) == report.shapes(record) + [shape]
    for shape_, (first, second) in rows.items():
        assert (first["build"], second["build"]) == ("DeepGEMM main 54e2261 (2.6.1)", "DeepGEMM nv_dev a6b593d (2.5.0)")
        assert first["ours_over_deepgemm"] == pytest.approx(first["ours_us"] / first["deepgemm_us"])
        assert second["ours_over_deepgemm"] == pytest.approx(second["ours_us"] / second["deepgemm_us"])
        if shape_ != shape:
            assert second["deepgemm_us"] == pytest.approx(first["deepgemm_us"] * 0.5)
    assert (rows[shape][0]["deepgemm"], rows[shape][0]["ours_over_deepgemm"]) == ("deepgemm-flattened", 55 / 60)
    assert (rows[shape][1]["deepgemm"], rows[shape][1]["ours_over_deepgemm"]) == ("deepgemm", 56 / 40)
    table = report.builds_table([main, nv_dev])
    assert "| 32, 4, 8K | 60.0 (flattened) | 55.0 | 0.92x | 40.0 | 56.0 | 1.40x |" in table
    assert table.count("in the same process") == 2 and "Flattened: DeepGEMM on the same rows" in table


@pytest.mark.parametrize("content", [b'{"rows": [{"us": 1.0}', b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe"])
def test_load_names_a_file_that_is_not_json(tmp_path, content):
    # A bare JSONDecodeError (or UnicodeDecodeError) before, naming no file.
    path = tmp_path / "cut.json"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"^{path} is not a results file \(JSON\): "):
        report.load(path)


@pytest.mark.parametrize("value", [-14.3, float("nan"), float("inf")])
def test_readers_refuse_a_record_whose_times_are_no_measurements(record, tmp_path, value):
    # With our times negated, targets() counted 8 of 11 met instead of 6.
    bad = json.loads(json.dumps(record))
    bad["rows"][3]["us"] = value
    with pytest.raises(ValueError, match=rf"^record: rows\[3\]\.us is {value}, but a time or share must be finite "
                                         r"and >= 0$"):
        report.targets(bad)
    for reader in (report.summary, report.shapes, report.clean_l2, report.host_us):
        with pytest.raises(ValueError, match=r"rows\[3\]\.us"):
            reader(bad)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=rf"^{path}: rows\[3\]\.us is {value}"):
        report.load(path)


def test_readers_refuse_negative_host_times(record):
    bad = json.loads(json.dumps(record))
    bad["host_us"][0]["parts"]["launch"] = -6.5
    with pytest.raises(ValueError, match=r"^record: host_us\[0\]\.parts\.launch is -6.5"):
        report.targets(bad)


def test_readers_name_the_key_a_record_lacks(record):
    # KeyError: 'rows' before.
    with pytest.raises(ValueError, match="^the record lacks the key 'rows', which summary reads$"):
        report.summary({k: v for k, v in record.items() if k != "rows"})
    row = {k: v for k, v in record["rows"][0].items() if k != "shape"}
    with pytest.raises(ValueError, match="^the record lacks the key 'shape', which shapes reads$"):
        report.shapes({**record, "rows": [row]})


def test_the_committed_run_measures_chapter_3s_ladder_and_chapter_5_starts_from_its_last_rung(record):
    small, large = Shape(64, 1, 8192), Shape(4096, 1, 8192)
    steps = {shape: [s["step"] for s in report.ladder(record, shape, chapter=3)] for shape in (small, large)}
    python = ["scalar loops (Python)", "vectorised PyTorch, float64 (the reference)", "vectorised PyTorch, fp32"]
    assert steps[small][:3] == python and not set(python) & set(steps[large])
    assert steps[small][3:] == steps[large] and len(steps[large]) == 5
    # chapter 3's kernel is one row of the run, which both chapters read
    kernel_rows = [r for r in record["rows"] if r.get("step") == "chapter 3's kernel (exact)"]
    assert len(kernel_rows) == 2 and {Shape(**r["shape"]) for r in kernel_rows} == {small, large}
    times = {s["step"]: s["us"] for s in report.ladder(record, small, chapter=3)}
    assert len(set(times.values())) == len(times)  # every step its own figure


def test_headline_gives_each_next_n_its_span_against_the_stronger_build(record):
    nv_dev = report.load(report.RESULTS / "h200-nvdev.json")
    ours, theirs = ({r["shape"]: r for r in report.summary(run)} for run in (record, nv_dev))
    text = report.headline(record, nv_dev)
    assert text.startswith("On an NVIDIA H200 our fp8 kernel takes ") and "the stronger DeepGEMM build's time" in text
    for n in sorted({s.next_n for s in ours}):
        stronger = [max(ours[s]["fp8_over_deepgemm"], theirs[s]["fp8_over_deepgemm"]) for s in ours if s.next_n == n]
        assert f"{min(stronger):.2f}-{max(stronger):.2f}x" in text, (n, text)
    alone = report.headline(record)  # one build: DeepGEMM main, flattened where it does not take next_n
    main_4 = [ours[s]["fp8_over_deepgemm"] for s in ours if s.next_n == 4]
    assert "DeepGEMM's time" in alone and f"{min(main_4):.2f}-{max(main_4):.2f}x at 4" in alone
    topk = {Shape(64, 1, 8192): (30.0, 10.0), Shape(1, 1, 131072): (5.0, 10.0)}
    assert report.headline(record, nv_dev, topk).endswith("; our top-k 0.50-3.00x vLLM's fastest.")
    assert "top-k" not in text


def test_headline_of_a_run_without_deepgemm_says_so(record):
    run = {**record, "rows": [r for r in record["rows"] if not r["kernel"].startswith("deepgemm")]}
    with pytest.raises(ValueError, match="no shape with both our fp8 path and DeepGEMM timed"):
        report.headline(run)


def test_results_table_says_which_way_every_ratio_goes(record):
    nv_dev = report.load(report.RESULTS / "h200-nvdev.json")
    lines = report.results_table(record, nv_dev).splitlines()
    assert lines[0] == report.headline(record, nv_dev)
    assert "time over time within a run, under 1.00x the first faster" in lines[2]
    header = lines[4].split(" | ")
    assert [h for h in header if "/" in h] == ["ours/main", "ours/nv_dev", "block16-shuffle/block64", "exact/main",
                                               "top-k ours/vLLM's fastest |"]
    rows = [line for line in lines if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == len(report.shapes(record))
    assert lines[-1].endswith("Flattened: run as next_n = 1 rows.")


@pytest.mark.parametrize("name", ["h200.json", "h200-portable-703f0c9.json"])
def test_shuffle_costs_divide_the_launch_rules_times_on_pages_of_one_size(name):
    record = report.load(report.RESULTS / name)
    costs = report.shuffle_costs(record)
    assert costs and {c["block_size"] for c in costs} == {16, 64}
    for c in costs:
        times = {}
        for r in record["rows"]:
            ours = r.get("kind") == "kernel" if "kind" in r else (r["kernel"] == c["kernel"] and r["precision"] == "fp8"
                                                                   and r.get("timing") == "graph")
            if ours and r.get("rule") and Shape(**r["shape"]) == c["shape"] and "us" in r:
                times.setdefault(r["variant"], []).append(r["us"])
        shuffled, natural = (times[f"block{c['block_size']}-{layout}"] for layout in ("shuffle", "normal"))
        assert len(shuffled) == len(natural) == 1 and c["ratio"] == shuffled[0] / natural[0]


def test_format_shuffle_costs_gives_a_span_per_page_size_and_next_n():
    costs = [{"shape": Shape(64, 1, 8192), "block_size": 16, "ratio": 0.999},
             {"shape": Shape(256, 1, 8192), "block_size": 16, "ratio": 1.054},
             {"shape": Shape(64, 3, 8192), "block_size": 16, "ratio": 1.39}]
    assert report.format_shuffle_costs(costs).splitlines() == ["16-token pages, next_n = 1: -0.1% to +5.4% (2 shapes)",
                                                              "16-token pages, next_n = 3: +39.0% (1 shape)"]
    with pytest.raises(ValueError, match="costs holds no shape timed on both"):
        report.format_shuffle_costs([])


def test_chapter_5_ladder_names_the_split_of_every_step():
    record = report.load()
    small, large = (report.ladder(record, Shape(b, 1, 8192)) for b in (64, 4096))
    # Recorded before the rows carried it: the split that run's launch code cut, on 132 SMs.
    assert [s["programs"] for s in small] == [9, 9, 5, 1, 1, 5]
    assert [s["programs"] for s in large] == [1] * 6
    assert "programs/seq" in report.format_ladder(small)
    recorded = {"provenance": {"sms": 132}, "rows": [
        {"step": "fp8 MMA", "chapter": 5, "kernel": "portable", "precision": "fp8", "us": 10.0, "finite": 100,
         "max_rel_error": 1e-4, "shape": {"batch": 64, "next_n": 1, "avg_ctx": 8192}, "programs_per_sequence": 1}]}
    assert [s["programs"] for s in report.ladder(recorded, Shape(64, 1, 8192))] == [1]
