"""Reading a run of ``benchmarks/topk_gpu.py`` (``results/h200-topk.json``): ours against vLLM's top-k and the
reference, shape by shape. Torch-free: it needs the file, not the GPU."""

from __future__ import annotations

import math
from pathlib import Path

from .. import report
from ..report import RESULTS, _cell, provenance_line
from ..shapes import Shape

RESULTS_FILE = RESULTS / "h200-topk.json"
VLLM_KERNELS = ("vllm persistent_topk", "vllm cooperative_topk", "vllm top_k_per_row_decode")
OUR_STEP = "ours (fastest launch)"
DEEPGEMM_STEP = "deepgemm + vllm decode_topk"

__all__ = ["RESULTS_FILE", "agreement", "format_agreement", "format_summary", "format_variants", "load", "nearest",
           "provenance_line", "summary", "variants"]


def load(path: str | Path = RESULTS_FILE) -> dict | None:
    """The run's record, its measurements checked as :func:`preshuffle.report.load` checks a benchmark's, or None
    where no run has been committed."""
    path = Path(path)
    return report.load(path) if path.exists() else None


BF16 = "ours on bf16 logits"


def _ours(shape_record: dict) -> list[dict]:
    """Our launches on the fp32 logits (each names the path it took: "sm90", the Gluon kernel; "row" or "split",
    the Triton kernels)."""
    return [r for r in shape_record["rows"] if "path" in r]


def summary(record: dict) -> list[dict]:
    """One row per shape: the logits kernel, our fastest launch (and the default one, what ``indexer_topk`` runs
    there, and the default one on bf16 logits), vLLM's dispatch and the best of its three kernels, each of ours over
    that best, torch.topk, and the whole step, ours beside DeepGEMM + vLLM's dispatch (None where the run did not
    measure it)."""
    out = []
    for s in record["shapes"]:
        us = {r["impl"]: r.get("us") for r in s["rows"]}
        ours = [r for r in _ours(s) if r.get("us") is not None]
        best = min(ours, key=lambda r: r["us"]) if ours else None
        vllm = [(us[n], n) for n in VLLM_KERNELS if us.get(n) is not None]
        vllm_best = min(vllm) if vllm else (None, None)
        steps = s.get("steps_us", {})
        row = {"shape": Shape(**s["shape"]), "logits_us": s.get("logits_us"),
               "ours_us": best and best["us"], "ours_launch": best and best["impl"],
               "ours_path": best and best.get("path"),
               "ours_default_us": us.get(s.get("default_config")) if s.get("default_config") else None,
               "ours_default_launch": s.get("default_config"),
               "bf16_us": us.get(BF16), "decode_topk_us": us.get("vllm decode_topk"), "vllm_best_us": vllm_best[0],
               "vllm_best": vllm_best[1], "torch_us": us.get("torch.topk"),
               "step_us": steps.get(OUR_STEP), "deepgemm_step_us": steps.get(DEEPGEMM_STEP),
               "every_selection_checked": all(r.get("valid_rows") == 1.0 for r in s["rows"] if "us" in r)}
        row["ours_over_vllm_best"] = _ratio(row["ours_us"], row["vllm_best_us"])
        row["default_over_vllm_best"] = _ratio(row["ours_default_us"], row["vllm_best_us"])
        row["step_speedup"] = _ratio(row["deepgemm_step_us"], row["step_us"])
        row["topk_share"] = _ratio(row["ours_us"], (row["logits_us"] or 0) + (row["ours_us"] or 0))
        out.append(row)
    return out


def _ratio(a, b):
    return a / b if a is not None and b else None


def agreement(record: dict) -> list[dict]:
    """Top-2048 agreement with the float64 reference's, per shape and precision: rows, least and mean share, and the
    positions that changed, as each one's float64 distance from the 2048th value over its sum of |terms|."""
    return [{"shape": Shape(**s["shape"]), **a} for s in record["shapes"] for a in s.get("agreement", [])]


def nearest(record: dict, batch: int, context: int) -> dict:
    """The summary row of the measured shape nearest to ``batch`` x ``context`` (in log2 of each), next_n = 1 first."""
    rows = summary(record)
    if not rows:
        raise ValueError("record has no measured shapes")
    return min(rows, key=lambda r: (r["shape"].next_n != 1, math.hypot(math.log2(r["shape"].batch / batch),
                                                                       math.log2(r["shape"].avg_ctx / context))))


def format_summary(rows: list[dict]) -> str:
    header = (f"{'shape':26s} {'logits':>7s} {'ours':>7s} {'launch':>17s} {'decode':>7s} {'vLLM best':>9s} "
              f"{'ours/best':>9s} {'default':>7s} {'dflt/best':>9s} {'torch':>7s} {'step':>7s} {'DG+vLLM':>8s} "
              f"{'speed-up':>8s}")
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(" ".join([f"{r['shape'].label:26s}", _cell(r["logits_us"], 7), _cell(r["ours_us"], 7),
                               f"{r['ours_launch'] or '-':>17s}", _cell(r["decode_topk_us"], 7),
                               _cell(r["vllm_best_us"], 9), _cell(r["ours_over_vllm_best"], 9, ".2f", "x"),
                               _cell(r["ours_default_us"], 7), _cell(r["default_over_vllm_best"], 9, ".2f", "x"),
                               _cell(r["torch_us"], 7), _cell(r["step_us"], 7), _cell(r["deepgemm_step_us"], 8),
                               _cell(r["step_speedup"], 8, ".2f", "x")]))
    return "\n".join(lines)


def format_agreement(rows: list[dict]) -> str:
    lines = [f"{'shape':26s} {'precision':9s} {'rows':>5s} {'least':>7s} {'mean':>8s} {'changed a row':>13s}"]
    for r in rows:
        lines.append(f"{r['shape'].label:26s} {r['precision']:9s} {r['rows']:5d} {_cell(r['min'], 7, '.4f')} "
                     f"{_cell(r['mean'], 8, '.5f')} {_cell(r['changed_per_row'], 13, '.2f')}")
    return "\n".join(lines)


def variants(record: dict, shape: Shape) -> list[dict]:
    """The sm90 kernel's default launch at ``shape`` and each launch of the same run that differs from it in one
    field: its name, the change (``field: default -> value``, read from the configurations the run recorded), its
    time and its time over the default's (both from this run). ValueError where the run has no such shape, or a
    variant differs in more than one field."""
    found = [s for s in record["shapes"] if Shape(**s["shape"]) == shape]
    if not found:
        raise ValueError(f"the run has no shape {shape.label}")
    s = found[0]
    sm90 = [r for r in s["rows"] if r.get("path") == "sm90" and r.get("us") is not None]
    default = next(r for r in sm90 if r["impl"] == s["default_config"])
    out = [{"variant": default["impl"], "label": "default launch", "change": None, "us": default["us"],
            "over_default": 1.0, "default": True}]
    for r in sm90:
        if r is default:
            continue
        diff = {f: (default["config"][f], v) for f, v in r["config"].items() if default["config"].get(f) != v}
        named = {f: d for f, d in diff.items() if f != "chunks"}  # chunks follow the width a launch must cover
        if len(named) != 1:
            raise ValueError(f"{r['impl']} differs from the default launch in {sorted(diff)}")
        (field, (was, now)), = named.items()
        change = f"{field}: {was} -> {now}" + (f" (chunks {diff['chunks'][0]} -> {diff['chunks'][1]})"
                                               if "chunks" in diff else "")
        out.append({"variant": r["impl"], "label": change, "change": change, "us": r["us"],
                    "over_default": r["us"] / default["us"], "default": False})
    return out


def format_variants(rows: list[dict]) -> str:
    lines = [f"{'variant':22s} {'change':44s} {'us':>7s} {'/ default':>9s}"]
    for v in rows:
        lines.append(f"{v['variant']:22s} {v['change'] or '-':44s} {v['us']:7.1f} {v['over_default']:8.2f}x")
    return "\n".join(lines)


def markdown_table(rows: list[dict]) -> str:
    """:func:`summary`'s rows as docs/topk.md's table of the measured run (times in us): ours at its default launch
    and at the run's fastest, vLLM's best, and the whole step beside DeepGEMM + vLLM's ``decode_topk``."""
    def us(v):
        return "-" if v is None else f"{v:.1f}"

    lines = ["| B, next_n, ctx | logits | ours, default | ours, fastest (launch) | vLLM's best | default / best | "
             "step: ours | step: DeepGEMM nv_dev + `decode_topk` |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        s = r["shape"]
        launch = "default" if r["ours_launch"] == r["ours_default_launch"] else r["ours_launch"].replace("sm90-", "")
        best = us(r["vllm_best_us"]) + ("" if r["vllm_best"] != "vllm top_k_per_row_decode"
                                        else " (`top_k_per_row_decode`)")
        ratio = "-" if r["default_over_vllm_best"] is None else f"{r['default_over_vllm_best']:.2f}x"
        lines.append(f"| {s.batch}, {s.next_n}, {s.avg_ctx // 1024}K | {us(r['logits_us'])} | "
                     f"{us(r['ours_default_us'])} | {us(r['ours_us'])} ({launch}) | {best} | {ratio} | "
                     f"{us(r['step_us'])} | {us(r['deepgemm_step_us'])} |")
    return "\n".join(lines)
