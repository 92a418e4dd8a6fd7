"""Reading a results file of ``python -m preshuffle bench``: the comparisons the performance chapter makes.
Torch-free: it needs the file, the shapes and the recorded anchor figures, not the harness."""

from __future__ import annotations

import json
import math
from pathlib import Path

from .anchors import DEEPGEMM_H200
from .shapes import VARIANTS, Shape

RESULTS = Path(__file__).resolve().parents[2] / "results"


def load(path: str | Path = RESULTS / "h200.json") -> dict:
    with open(path) as f:
        return json.load(f)


def rule_rows(record: dict, kind: str = "kernel") -> dict:
    """(shape, variant) -> the timed row of ``kind`` whose split is the package's launch rule, i.e. what a
    caller of ``fp8_paged_mqa_logits`` gets: a row flagged ``rule``, or one with no split at all."""
    return {(Shape(**r["shape"]), r["variant"]): r for r in record["rows"]
            if r["kind"] == kind and "us" in r and r.get("rule", r.get("programs_per_sm") is None)}


def _ratio(us: dict, slow: str, *fast: str) -> float | None:
    """us[slow] over the fastest of ``fast``; None when a run did not time them (a subset of variants)."""
    if slow not in us or not any(f in us for f in fast):
        return None
    return us[slow] / min(us[f] for f in fast if f in us)


def summary(record: dict) -> list[dict]:
    """One row per shape: our best variant against DeepGEMM's recorded share, the variants against each other,
    the PyTorch baseline and the fp8-MMA kernel."""
    kernel = rule_rows(record)
    extras = {kind: rule_rows(record, kind) for kind in ("torch", "kernel-fp8-mma", "kernel-fp8-acc32-mma")}
    out = []
    for shape in dict.fromkeys(s for s, _ in kernel):
        us = {v: r["us"] for (s, v), r in kernel.items() if s == shape}
        best = min(us, key=us.get)
        row = kernel[(shape, best)]
        torch_row = extras["torch"].get((shape, "block64-normal"))
        fp8 = extras["kernel-fp8-mma"].get((shape, "block64-normal"))
        recorded = DEEPGEMM_H200.get(shape)
        out.append({
            "shape": shape, "best": best, "us": row["us"], "gb_per_s": row["gb_per_s"], "pct_copy": row["pct_copy"],
            "tflop_per_s": row["tflop_per_s"], "max_rel_error": row["max_rel_error"],
            "flop_per_byte": row["tflop_per_s"] * 1e12 * row["us"] * 1e-6 / row["bytes"],
            "deepgemm_pct": recorded.pct_copy if recorded else None,
            "deepgemm_us": recorded.us if recorded else None,
            "naive_triton_us_recorded": recorded.naive_triton_us if recorded else None,
            "torch_us_recorded": recorded.torch_us if recorded else None,
            "over_torch_recorded": recorded.torch_us / row["us"] if recorded and recorded.torch_us else None,
            "us_by_variant": us,
            "block16_over_block1": _ratio(us, "block1", "block16-normal", "block16-shuffle"),
            "block64_over_block1": _ratio(us, "block1", "block64-normal", "block64-shuffle"),
            "natural_over_shuffled_16": _ratio(us, "block16-shuffle", "block16-normal"),
            "natural_over_shuffled_64": _ratio(us, "block64-shuffle", "block64-normal"),
            "torch_us": torch_row["us"] if torch_row else None,
            "over_torch": _ratio({**us, "torch": torch_row["us"]}, "torch", "block64-normal") if torch_row else None,
            "fp8_mma_pct": fp8["pct_copy"] if fp8 else None,
            "fp8_mma_error": fp8["max_rel_error"] if fp8 else None,
        })
    return out


def _cell(value, width: int, fmt: str = ".1f", suffix: str = "") -> str:
    return f"{value:{width - len(suffix)}{fmt}}{suffix}" if value is not None else f"{'-':>{width}s}"


def format_summary(rows: list[dict]) -> str:
    header = (f"{'shape':28s} {'best variant':15s} {'us':>8s} {'%copy':>6s} {'DeepGEMM%':>9s} {'b16/b1':>7s} "
              f"{'b64/b1':>7s} {'nat/shuf16':>10s} {'nat/shuf64':>10s} {'vs torch':>8s} {'fp8-MMA%':>8s}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(" ".join([
            f"{r['shape'].label:28s} {r['best']:15s} {r['us']:8.1f} {r['pct_copy']:6.1f}",
            _cell(r["deepgemm_pct"], 9, "d"), _cell(r["block16_over_block1"], 7, ".2f", "x"),
            _cell(r["block64_over_block1"], 7, ".2f", "x"), _cell(r["natural_over_shuffled_16"], 10, ".2f", "x"),
            _cell(r["natural_over_shuffled_64"], 10, ".2f", "x"), _cell(r["over_torch"], 8, ".0f", "x"),
            _cell(r["fp8_mma_pct"], 8)]))
    return "\n".join(lines)


def provenance_line(record: dict) -> str:
    p = record["provenance"]
    return (f"{p.get('gpu')} ({p.get('sms')} SMs, driver {p.get('driver')}, CUDA {p.get('cuda')}), torch {p['torch']}, "
            f"Triton {p['triton']}, measured {p['date']} at commit {str(p.get('git_commit'))[:10]}; copy ceiling "
            f"{record['copy_bytes_per_s'] / 1e12:.2f} TB/s measured in the same run")


def format_recorded(rows: list[dict]) -> str:
    """Our times beside the spec's recorded anchor run (same GPU model, the spec's own random inputs)."""
    header = (f"{'shape':28s} {'ours us':>8s} {'DeepGEMM us':>11s} {'naive Triton us':>15s} {'torch us (ours)':>15s} "
              f"{'torch us (spec)':>15s}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(" ".join([f"{r['shape'].label:28s} {r['us']:8.1f}", _cell(r["deepgemm_us"], 11),
                               _cell(r["naive_triton_us_recorded"], 15), _cell(r["torch_us"], 15),
                               _cell(r["torch_us_recorded"], 15)]))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------------
# What the explorers read: one kernel's time, the negotiated kernel's cost, one workload's bars.

# vLLM PR #51216 (4x MI355X, --block-size 16): AITER's paged-MQA-logits kernel by the kernel block size it got,
# per-token before the fix and preshuffled 16-token blocks after it. No other size was measured.
PR_51216_MI355X_US = {1: 28.53, 16: 7.84}
# The shape whose H200 times stand for "what a kernel block size costs" on CUDA.
COST_SHAPE = Shape(64, 1, 8192)
# Precision -> the kind of the results' rows measured at it (the fp16-MMA kernel is exact, fp8 MMAs are not).
PRECISION_KINDS = {"exact": "kernel", "fp8": "kernel-fp8-mma"}


def variant_time(record: dict, shape: Shape, block_size: int, layout: str = "normal", kind: str = "kernel"):
    """Median microseconds of our kernel at ``shape`` with this kernel block size and layout, under the launch
    rule; None when the run did not measure that combination."""
    name = {v: k for k, v in VARIANTS.items()}.get((block_size, layout))
    row = rule_rows(record, kind).get((shape, name))
    return row["us"] if row else None


def kernel_costs(negotiation, record: dict) -> dict:
    """What the negotiated indexer kernel costs, beside the kernel block sizes measured on its platform.

    Returns ``{"source": str, "bars": [{"kernel_block_size": int, "us": float | None, "negotiated": bool}]}``,
    bars sorted by block size, ``us`` None where nobody measured that size. ROCm: the PR's two figures (AITER,
    4x MI355X). CUDA: our Triton kernel's H200 times at :data:`COST_SHAPE`, natural layout."""
    if negotiation.platform == "rocm":
        measured = dict(PR_51216_MI355X_US)
        source = "AITER on 4x MI355X, measured in vLLM PR #51216"
    else:
        measured = {k: variant_time(record, COST_SHAPE, k) for k in (1, 16, 64)}
        source = f"our Triton kernel on the H200 at {COST_SHAPE.label}, natural layout (results/h200.json)"
    chosen = negotiation.kernel_block_size
    sizes = sorted(set(measured) | ({chosen} if chosen else set()))
    return {"source": source,
            "bars": [{"kernel_block_size": k, "us": measured.get(k), "negotiated": k == chosen} for k in sizes]}


def nearest_shape(record: dict, batch: int, avg_ctx: int, next_n: int) -> Shape:
    """The measured shape closest to the asked one: same next_n where one exists, then the smallest distance
    in (log2 batch, log2 context); ties go to the shape measured first."""
    for name, value in (("batch", batch), ("avg_ctx", avg_ctx), ("next_n", next_n)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    shapes = list(dict.fromkeys(Shape(**r["shape"]) for r in record["rows"]))
    if not shapes:
        raise ValueError("record has no measured rows")

    def distance(s: Shape) -> tuple:
        return (abs(s.next_n - next_n), math.hypot(math.log2(s.batch / batch), math.log2(s.avg_ctx / avg_ctx)))

    return min(shapes, key=distance)


def workload_bars(record: dict, batch: int, avg_ctx: int, next_n: int, block_size: int, layout: str,
                  precision: str) -> tuple[Shape, list[dict]]:
    """The bars of the workload explorer: ``(nearest measured shape, bars)``.

    One bar per cache variant of ours at ``precision`` ("exact" or "fp8"), then DeepGEMM. Each bar is
    ``{"label": str, "us": float | None, "pct_copy": float | None, "chosen": bool}``: ``us`` None where that
    combination was not measured; ``chosen`` marks the asked block size and layout. Today's results time fp8
    MMAs for block64-normal only, and DeepGEMM comes from the spec's recorded run (its own copy ceiling)."""
    if precision not in PRECISION_KINDS:
        raise ValueError(f"precision must be one of {tuple(PRECISION_KINDS)}, got {precision!r}")
    if (block_size, layout) not in VARIANTS.values():
        raise ValueError(f"(block_size, layout) must be one of {sorted(VARIANTS.values())}, got {(block_size, layout)}")
    shape = nearest_shape(record, batch, avg_ctx, next_n)
    rows = rule_rows(record, PRECISION_KINDS[precision])
    bars = []
    for name, variant in VARIANTS.items():
        row = rows.get((shape, name), {})
        bars.append({"label": f"ours {name} ({precision})", "us": row.get("us"), "pct_copy": row.get("pct_copy"),
                     "chosen": variant == (block_size, layout)})
    recorded = DEEPGEMM_H200.get(shape)
    bars.append({"label": "DeepGEMM (recorded)", "us": recorded.us if recorded else None,
                 "pct_copy": recorded.pct_copy if recorded else None, "chosen": False})
    return shape, bars
