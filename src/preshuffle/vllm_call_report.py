"""The committed runs of the logits kernel at vLLM's own call (``benchmarks/vllm_call_gpu.py``), read: ours through
:mod:`preshuffle.deepgemm_compat` beside a DeepGEMM build in the same process, every call checked before it was
timed, each call timed once a round for several rounds. A ratio of two calls is taken round by round (two times a
few seconds apart) and given as the median with the lowest and highest round."""

from __future__ import annotations

import statistics
from pathlib import Path

from . import provenance, report
from .shapes import Shape

RUNS = {"nv_dev": report.RESULTS / "h200-vllm-call-nvdev.json", "main": report.RESULTS / "h200-vllm-call-main.json"}
DEEPGEMM = ("deepgemm", "deepgemm-flattened")
OWN_PATHS = ("ours-exact", "ours-block16", "ours-block16-shuffle")  # ours beside ours at vLLM's width


def load(path: str | Path) -> dict:
    """A run of ``benchmarks/vllm_call_gpu.py``, its measurements checked (:func:`preshuffle.report.load`), which
    must name its DeepGEMM build and vLLM's width."""
    record = report.load(path)
    if not isinstance(record, dict) or not {"rows", "deepgemm", "vllm_max_model_len"} <= set(record):
        raise ValueError(f"{path} is not a run of benchmarks/vllm_call_gpu.py (rows, deepgemm, vllm_max_model_len)")
    return record


def round_ratio(a: dict | None, b: dict | None) -> dict | None:
    """``a``'s times over ``b``'s, round by round: the median, lowest and highest; None unless both were timed."""
    if not (a and b and a.get("us") and b.get("us")):
        return None
    each = [x / y for x, y in zip(a["us"], b["us"])]
    return {"median": statistics.median(each), "low": min(each), "high": max(each), "rounds": len(each)}


def find(rows: list[dict], shape: Shape, who, width: int) -> dict | None:
    """The row of ``who`` (a name, or a tuple of names tried in turn) on ``shape`` at ``width`` positions a row."""
    for name in (who,) if isinstance(who, str) else who:
        row = next((r for r in rows if r["who"] == name and r["max_model_len"] == width
                    and Shape(**r["shape"]) == shape), None)
        if row is not None:
            return row
    return None


def shapes(record: dict) -> list[Shape]:
    return list(dict.fromkeys(Shape(**r["shape"]) for r in record["rows"] if r["who"] == "ours"))


def summary(record: dict) -> list[dict]:
    """Per shape, at vLLM's width: our time and DeepGEMM's (medians over rounds; ``flattened`` where the build runs
    the rows as next_n = 1), their round ratio, the same ratio at the rows' own width (``tight``), and each of our
    other paths over our fp8 call (``own``)."""
    rows, wide = record["rows"], record["vllm_max_model_len"]
    out = []
    for shape in shapes(record):
        ours, dg = find(rows, shape, "ours", wide), find(rows, shape, DEEPGEMM, wide)
        tight = next((r["max_model_len"] for r in rows if r["who"] == "ours" and r["max_model_len"] != wide
                      and Shape(**r["shape"]) == shape), None)
        out.append({"shape": shape, "ours_us": ours and ours.get("us_median"), "deepgemm_us": dg and dg.get("us_median"),
                    "flattened": bool(dg) and dg["who"] == "deepgemm-flattened", "ratio": round_ratio(ours, dg),
                    "tight": round_ratio(find(rows, shape, "ours", tight), find(rows, shape, DEEPGEMM, tight)),
                    "own": {who: round_ratio(find(rows, shape, who, wide), ours) for who in OWN_PATHS}})
    return out


def splits(record: dict, shape: Shape) -> dict[int, float]:
    """Programs a sequence -> our time (median over rounds) of the launches of ``shape`` that changed only the
    split (``--configs '{"splits": N}'``)."""
    return {r["asked"]["splits"]: r["us_median"] for r in record["rows"]
            if r["who"] == "ours-config" and set(r["asked"]) == {"splits"} and r.get("us_median")
            and Shape(**r["shape"]) == shape}


def _x(ratio: dict | None, spread: bool = True) -> str:
    if ratio is None:
        return "-"
    if not spread or f"{ratio['low']:.2f}" == f"{ratio['high']:.2f}":
        return f"{ratio['median']:.2f}x"
    return f"{ratio['median']:.2f}x ({ratio['low']:.2f}-{ratio['high']:.2f})"


def _us(value) -> str:
    return f"{value:.1f}" if value is not None else "-"


MIN_ROUNDS = 3  # a ratio the headline states carries its spread over at least this many rounds


def headline(nv_dev: dict) -> str:
    """The results in one sentence: per next_n, the span of our time over DeepGEMM nv_dev's at vLLM's call (native
    rows only; each shape's median over rounds), and the span of every round's ratio. A run of fewer than
    :data:`MIN_ROUNDS` rounds is refused: its ratios would carry no spread."""
    if nv_dev.get("rounds", 0) < MIN_ROUNDS:
        raise ValueError(f"the run has {nv_dev.get('rounds')} rounds: a headline ratio needs at least {MIN_ROUNDS}")
    by_next_n: dict[int, list[dict]] = {}
    for r in summary(nv_dev):
        if r["ratio"] and not r["flattened"]:
            by_next_n.setdefault(r["shape"].next_n, []).append(r["ratio"])
    if not by_next_n:
        raise ValueError("the run has no shape with ours and DeepGEMM both timed")

    def span(low, high):
        return f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}x"

    parts = [f"{span(min(q['median'] for q in v), max(q['median'] for q in v))} (rounds "
             f"{span(min(q['low'] for q in v), max(q['high'] for q in v))}) at {'next_n = ' if i == 0 else ''}{n}"
             for i, (n, v) in enumerate(sorted(by_next_n.items()))]
    return (f"At vLLM's own call on an {nv_dev['provenance'].get('gpu')}, our fp8 logits kernel's time over DeepGEMM "
            f"nv_dev's (the build vLLM runs) is {', '.join(parts[:-1]) + ' and ' if len(parts) > 1 else ''}"
            f"{parts[-1]}.")


def results_table(nv_dev: dict, main: dict | None = None, topk: dict | None = None) -> str:
    """:func:`headline`, what the table holds, then one row per shape of ``nv_dev``'s run: ours beside DeepGEMM
    nv_dev at vLLM's call, the same beside DeepGEMM main in ``main``'s run (each ratio within its own run, as the
    median of its rounds with their spread), our exact path and 16-token pages over our fp8 call, and where ``topk``
    has the shape our top-k over vLLM's fastest. Every ratio is a time over a time: under 1.00x, ours is faster.
    A run that no longer measures the package's kernels (:func:`preshuffle.provenance.staleness`) is refused."""
    for name, run in (("nv_dev", nv_dev), ("main", main)):
        if run is not None:
            provenance.refuse_stale(run, f"the {name} run")
    others = {r["shape"]: r for r in summary(main)} if main else {}
    topk = topk or {}
    wide = nv_dev["vllm_max_model_len"]
    lines = [headline(nv_dev), "",
             f"vLLM's call: `max_context_len` {wide}, `clean_logits=False`, `[B, next_n]` lengths, 64-token pages. "
             f"Time over time in one run (under 1.00x ours is faster), the median of {nv_dev['rounds']} rounds (spread "
             "in parentheses); every call checked against float64 first.", "",
             "| B, next_n, ctx | ours (us) | nv_dev (us) | ours/nv_dev | main (us) | ours/main | exact/fp8 "
             "| 16-token preshuffled/64 | top-k (default launch)/vLLM's fastest |",
             "|---|---|---|---|---|---|---|---|---|"]
    flattened = False
    for r in summary(nv_dev):
        s, m = r["shape"], others.get(r["shape"])
        flat = " (flat)" if r["flattened"] else ""
        mflat = " (flat)" if m and m["flattened"] else ""
        flattened = flattened or r["flattened"] or bool(m and m["flattened"])
        top = topk.get(s)
        lines.append(f"| {s.batch}, {s.next_n}, {s.avg_ctx // 1024}K | {_us(r['ours_us'])} | "
                     f"{_us(r['deepgemm_us'])}{flat} | {_x(r['ratio'])} | {_us(m and m['deepgemm_us'])}{mflat} | "
                     f"{_x(m and m['ratio'], False)} | {_x(r['own']['ours-exact'], False)} | "
                     f"{_x(r['own']['ours-block16-shuffle'], False)} | "
                     f"{f'{top[0] / top[1]:.2f}x' if top else '-'} |")
    p = nv_dev["provenance"]
    runs = f"commit {str(p.get('git_commit'))[:7]}"
    if main:
        runs += f" (main's run: {str(main['provenance'].get('git_commit'))[:7]})"
    lines += ["", f"{p.get('gpu')}, torch {p['torch']}, Triton {p['triton']}, {p['date'][:10]}, {runs}."
              + (" Flat: the rows run as next_n = 1 sequences, as vLLM does without a kernel." if flattened else "")]
    return "\n".join(lines)
