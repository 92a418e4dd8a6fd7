"""Measured figures typed into docs/: each one read from the results file named beside it, and checked there."""

import re
from pathlib import Path

import pytest

from preshuffle import report
from preshuffle.shapes import Shape

ROOT = Path(__file__).resolve().parents[1]


def doc(name: str) -> str:
    return " ".join((ROOT / "docs" / name).read_text().split())  # one line: a figure may wrap


def results(name: str) -> dict:
    return report.load(ROOT / "results" / name)


def rule_us(record: dict, shape: Shape, kernel: str = "hopper") -> float:
    return report.find(record, shape, kernel=kernel, precision="fp8", timing="graph", rule=True,
                       variant="block64-normal")["us"]


def figures(text: str, pattern: str, files: list[str]) -> tuple:
    """The numbers ``pattern`` captures in ``text``, which must name each of ``files`` within 300 characters."""
    m = re.search(pattern, text)
    assert m, f"the text no longer says {pattern!r}"
    near = text[max(0, m.start() - 300):m.end() + 300]
    missing = [f for f in files if f"results/{f}" not in near]
    assert not missing, f"{m.group(0)!r} names no {missing} beside it"
    return tuple(float(g) for g in m.groups())


SWEEP_SHAPE = Shape(256, 2, 65536)


def test_our_time_at_b256_next_n_2_in_each_run_is_the_runs():
    text = doc("performance.md")
    one, other = figures(text, r"moves with our own time \((\d+\.\d) us in `results/h200\.json`, (\d+\.\d) in",
                         ["h200.json", "h200-nvdev.json"])
    assert (one, other) == (round(rule_us(results("h200.json"), SWEEP_SHAPE), 1),
                            round(rule_us(results("h200-nvdev.json"), SWEEP_SHAPE), 1))
    apart = re.search(r"the same kernel, (\d+)% apart", text)
    assert apart and int(apart.group(1)) == round(100 * (one / other - 1))


def sweep_best(shape_label: str, config: dict) -> float:
    rows = [r for r in results("h200-hopper-sweep.json")["rows"]
            if r["shape"] == shape_label and r["config"] == config and "us" in r]
    return round(min(r["us"] for r in rows), 1)


def test_the_limits_table_is_h200_json_and_its_spread_is_named():
    """docs/kernel-design.md, "What limits each shape": every row's times (ours, DeepGEMM) from results/h200.json,
    and the same kernel's other timings of B=256 next_n = 2 ctx 64K from the files it names."""
    text = (ROOT / "docs" / "kernel-design.md").read_text()
    record = results("h200.json")
    rows = re.findall(r"^\| B=(\d+)(?: next_n = (\d))? ctx (\d+)K \| ([\d.]+) \| ([\d.]+)", text, re.M)
    assert len(rows) >= 10
    for batch, next_n, ctx, ours, theirs in rows:
        shape = Shape(int(batch), int(next_n or 1), int(ctx) * 1024)
        dg = report.find(record, shape, kernel=("deepgemm" if shape.next_n <= 2 else "deepgemm-flattened"),
                         timing="graph", variant="block64-normal")
        assert (float(ours), float(theirs)) == (round(rule_us(record, shape), 1), round(dg["us"], 1)), shape
    flat = " ".join(text.split())
    nvdev, sweep = figures(flat, r"the same kernel gave (\d+\.\d) us at B=256 next_n = 2 ctx 64K in "
                                 r"`results/h200-nvdev\.json`, and (\d+\.\d) in the sweep", ["h200-nvdev.json"])
    assert nvdev == round(rule_us(results("h200-nvdev.json"), SWEEP_SHAPE), 1)
    assert sweep == sweep_best("B=256 next_n=2 ctx=65536", {})


def test_the_row_warpgroup_design_reads_the_sweep():
    text = doc("kernel-design.md")
    b64, b64_base, b256, b256_base = figures(
        text, r"\| A math warpgroup a query row at next_n = 2 \| (\d+\.\d) against (\d+\.\d) us at B=64, (\d+\.\d) "
              r"against (\d+\.\d) at B=256 ctx 64K", ["h200-hopper-sweep.json"])
    assert (b64, b64_base) == (sweep_best("B=64 next_n=2 ctx=8192", {"row_warpgroups": True}),
                               sweep_best("B=64 next_n=2 ctx=8192", {}))
    assert (b256, b256_base) == (sweep_best("B=256 next_n=2 ctx=65536", {"row_warpgroups": True}),
                                 sweep_best("B=256 next_n=2 ctx=65536", {}))


def test_the_finite_logits_of_every_benchmark_row():
    text = doc("accuracy.md")
    least, loops = figures(text, r"Every row of `results/h200\.json` has (\d+) or more but the scalar loops', which "
                                 r"run on \d+ positions \((\d+) finite logits\)", ["h200.json"])
    rows = results("h200.json")["rows"]
    assert least == min(r["finite"] for r in rows if r["kernel"] != "loops")
    assert loops == next(r["finite"] for r in rows if r["kernel"] == "loops")


def topk_bytes_us(shape: dict) -> tuple[float, float]:
    """A top-k shape's floor in us at its run's copy ceiling: the logits' 4 bytes a visible position, and those
    with the output's 8 KB a row."""
    run = results("h200-topk.json")
    s = next(s for s in run["shapes"] if s["shape"] == shape)
    rows = s["shape"]["batch"] * s["shape"]["next_n"]
    logits = 4 * s["visible_positions"] / run["copy_bytes_per_s"] * 1e6
    return logits, logits + rows * run["topk"] * 4 / run["copy_bytes_per_s"] * 1e6


def test_the_top_k_floor_counts_the_output_and_reads_the_run():
    text = doc("topk.md")
    ceiling, one, many, logits = figures(
        text, r"At the copy ceiling of `results/h200-topk\.json` \((\d+\.\d+) TB/s\) that is (\d+\.\d+) us for its "
              r"one row of \d+ positions and (\d+\.\d) us for its 4096 rows of 8K \((\d+\.\d) us of them the logits\)",
        ["h200-topk.json"])
    assert ceiling == round(results("h200-topk.json")["copy_bytes_per_s"] / 1e12, 2)
    assert one == round(topk_bytes_us({"batch": 1, "next_n": 1, "avg_ctx": 131072})[1], 2)
    b4096 = topk_bytes_us({"batch": 4096, "next_n": 1, "avg_ctx": 8192})
    assert (many, logits) == (round(b4096[1], 1), round(b4096[0], 1))
    assert f"against {many} us of bytes" in text


@pytest.mark.parametrize("name", ["accuracy.md", "performance.md", "topk.md", "kernel-design.md"])
def test_no_figure_the_runs_never_held_is_left(name):
    """Figures once typed by hand that no committed run holds."""
    text = doc(name)
    for gone in ("calc_diff 8.2e-7", "10^5 or more", "31 us for 4096 rows", "715.1"):
        assert gone not in text, f"docs/{name} still says {gone!r}"


def vllm_call_us(rows: list[dict], shape: Shape, who: str, tight: bool = True, asked: dict | None = None) -> float:
    """A call's median time in the nv_dev run at vLLM's call: at the rows' own width or vLLM's, and for the
    package's extra launches the one that asked for ``asked``."""
    found = [r for r in rows if r["who"] == who and Shape(**r["shape"]) == shape and r.get("us_median")
             and (asked is None or r.get("asked") == asked)]
    width = (min if tight else max)(r["max_model_len"] for r in found)
    (row,) = [r for r in found if r["max_model_len"] == width]
    return round(row["us_median"], 1)


def test_the_four_row_groups_and_the_preshuffled_three_rows_are_the_nv_dev_runs():
    """docs/kernel-design.md, "next_n = 3 and 4", and docs/performance.md's target for preshuffled pages."""
    rows = results("h200-vllm-call-nvdev.json")["rows"]
    b64, b256 = Shape(64, 4, 8192), Shape(256, 4, 8192)
    text = doc("kernel-design.md")
    found = figures(text, r"At the rows' own width that takes (\d+\.\d) and (\d+\.\d) us at B=64 and 256, against "
                          r"(\d+\.\d) and (\d+\.\d) for one program of all four rows and nv_dev's (\d+\.\d) and (\d+\.\d)",
                    ["h200-vllm-call-nvdev.json"])
    assert found == (vllm_call_us(rows, b64, "ours"), vllm_call_us(rows, b256, "ours"),
                     vllm_call_us(rows, b64, "ours-config", asked={"row_groups": 1, "splits": 4}),
                     vllm_call_us(rows, b256, "ours-config", asked={"row_groups": 1, "splits": 5}),
                     vllm_call_us(rows, b64, "deepgemm"), vllm_call_us(rows, b256, "deepgemm"))
    n3 = (Shape(64, 3, 8192), Shape(256, 3, 8192))
    shuffled = tuple(vllm_call_us(rows, s, "ours-block16-shuffle", tight=False) for s in n3)
    a_row = tuple(vllm_call_us(rows, s, "ours-config", asked={"row_warpgroups": True, "maxnreg": 64}) for s in n3)
    found = figures(text, r"the rule takes the three rows in one warpgroup at 128 registers, on the three-row split: "
                          r"(\d+\.\d) and (\d+\.\d) us at B=64 and 256 at vLLM's width, 1\.\d\dx and 1\.\d\dx natural "
                          r"64-token pages, against (\d+\.\d) and (\d+\.\d) us for a warpgroup a row",
                    ["h200-vllm-call-nvdev.json"])
    assert found == shuffled + a_row
    found = figures(doc("performance.md"), r"a warpgroup a row at 64 registers spills: (\d+\.\d) and (\d+\.\d) us "
                                            r"against (\d+\.\d) and (\d+\.\d),", ["h200-vllm-call-nvdev.json"])
    assert found == a_row + shuffled
