"""Reading a results file of ``python -m preshuffle bench``: ours against DeepGEMM, the launch rules, the ladders and
the host's time, DeepGEMM's rows included (measured in the same run). Torch-free: it needs the file and the shapes, not
the harness."""

from __future__ import annotations

import contextvars
import functools
import json
import math
from pathlib import Path

from . import provenance
from .precision import PRECISIONS
from .shapes import ANCHOR_SHAPES, MTP_SHAPES, VARIANTS, Shape

RESULTS = Path(__file__).resolve().parents[2] / "results"
BASE = "block64-normal"  # DeepGEMM's cache: where every implementation meets


# Keys whose numbers (and every number under them) are times or shares: a negative or NaN one is no measurement.
MEASURED_KEYS = ("us", "pct_copy", "gb_per_s", "max_rel_error", "calc_diff", "copy_bytes_per_s")


def _measured(key) -> bool:
    return isinstance(key, str) and (key in MEASURED_KEYS or key.endswith("_us"))


def check_record(record, source: str = "record"):
    """``record`` once its measurements are checked: every number under a key of :data:`MEASURED_KEYS` or ending
    in ``_us`` must be finite and >= 0. ValueError names ``source`` (the file) and the number's key path."""
    if not isinstance(record, (dict, list)):
        raise ValueError(f"{source} must hold a JSON object of results, got {type(record).__name__}")
    stack = [(record, "", False)]
    while stack:
        value, path, measured = stack.pop()
        if isinstance(value, dict):
            stack.extend((v, f"{path}.{k}" if path else str(k), measured or _measured(k)) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((v, f"{path}[{i}]", measured) for i, v in enumerate(value))
        elif (measured and isinstance(value, (int, float)) and not isinstance(value, bool)
              and not (math.isfinite(value) and value >= 0)):
            raise ValueError(f"{source}: {path} is {value}, but a time or share must be finite and >= 0")
    return record


def load(path: str | Path = RESULTS / "h200.json") -> dict:
    """A results file, its measurements checked (:func:`check_record`); ValueError names a file that is not JSON."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not a results file (JSON): {error}") from None
    check_record(record, str(path))
    broken = provenance.broken_record_seals(record) if isinstance(record, dict) and provenance.SEAL_KEY in record else []
    if broken:
        raise ValueError(f"{path}: the seals of {', '.join(broken[:5])} do not match their numbers (edited after the "
                         "run?)")
    return record


_READING = contextvars.ContextVar("reading", default=False)


def _reader(fn):
    """A reader of a record (its first argument): the record is checked once, by the outermost reader, and a key it
    lacks is named (a KeyError would say only 'rows')."""
    @functools.wraps(fn)
    def read(record, *args, **kwargs):
        if _READING.get():
            return fn(record, *args, **kwargs)
        check_record(record)
        token = _READING.set(True)
        try:
            return fn(record, *args, **kwargs)
        except KeyError as missing:
            raise ValueError(f"the record lacks the key {missing.args[0]!r}, which {fn.__name__} reads") from None
        finally:
            _READING.reset(token)
    return read


@_reader
def find(record: dict, shape: Shape, **match) -> dict | None:
    """The timed row of ``shape`` whose fields equal ``match`` (kernel, precision, variant, timing, ...); rows of
    the launch rule win over split sweeps and ladder steps. None when the run has none."""
    match.setdefault("timing", "graph")
    found = [r for r in record["rows"] if "us" in r and Shape(**r["shape"]) == shape
             and all(r.get(k) == v for k, v in match.items())]
    found.sort(key=lambda r: (not r.get("rule", False), r.get("step") is not None))
    return found[0] if found else None


@_reader
def shapes(record: dict) -> list[Shape]:
    """The shapes of a run, in the order they were measured."""
    return list(dict.fromkeys(Shape(**r["shape"]) for r in record["rows"]))


def _ours(record, shape, precision, variant=BASE, timing="graph"):
    return find(record, shape, kernel=_our_kernel(record, shape, variant), precision=precision, variant=variant,
                timing=timing, rule=True)


def _our_kernel(record, shape, variant):
    """Which of our kernels ran a cache (the Hopper kernel where it takes it, else the portable one)."""
    for r in record["rows"]:
        if Shape(**r["shape"]) == shape and r["variant"] == variant and r.get("rule") and r["kernel"] != "torch":
            return r["kernel"]
    return None


def _deepgemm(record, shape):
    """DeepGEMM's row of ``shape``: on the rows themselves, or flattened to next_n = 1 where it cannot take them."""
    return (find(record, shape, kernel="deepgemm", variant=BASE)
            or find(record, shape, kernel="deepgemm-flattened", variant=BASE))


def _div(a: dict | None, b: dict | None, key: str = "us") -> float | None:
    return a[key] / b[key] if a and b else None


@_reader
def summary(record: dict) -> list[dict]:
    """One row per shape: our fp8 and exact paths on DeepGEMM's cache beside DeepGEMM (or DeepGEMM on the flattened
    rows, for next_n = 3), the other caches against it, the eager call and the PyTorch baseline."""
    out = []
    for shape in shapes(record):
        fp8, exact = _ours(record, shape, "fp8"), _ours(record, shape, "exact")
        dg = _deepgemm(record, shape)
        caches = {v: _ours(record, shape, "fp8", v) for v in ("block1", "block16-normal", "block16-shuffle",
                                                             "block64-shuffle")}
        eager = _ours(record, shape, "fp8", timing="eager")
        torch_row = find(record, shape, kernel="torch", variant=BASE, timing="eager")
        out.append({
            "shape": shape, "fp8_us": fp8 and fp8["us"], "fp8_pct": fp8 and fp8["pct_copy"],
            "fp8_error": fp8 and fp8["max_rel_error"], "fp8_calc_diff": fp8 and fp8["calc_diff"],
            "exact_us": exact and exact["us"], "exact_pct": exact and exact["pct_copy"],
            "exact_error": exact and exact["max_rel_error"],
            "deepgemm": dg and dg["kernel"], "deepgemm_us": dg and dg["us"], "deepgemm_pct": dg and dg["pct_copy"],
            "deepgemm_error": dg and dg["max_rel_error"], "deepgemm_calc_diff": dg and dg["calc_diff"],
            "fp8_over_deepgemm": _div(fp8, dg), "exact_over_deepgemm": _div(exact, dg),
            "error_over_deepgemm": _div(fp8, dg, "max_rel_error"),
            **{f"{v}_over_block64": _div(row, fp8) for v, row in caches.items()},
            "eager_minus_graph_us": eager["us"] - fp8["us"] if eager and fp8 else None,
            "torch_over_fp8": _div(torch_row, fp8),
        })
    return out


@_reader
def ladder(record: dict, shape: Shape, chapter: int = 5) -> list[dict]:
    """A ladder's steps on ``shape`` (``chapter``, the results files' field: 3, the Triton ladder; 5, the one from the
    portable kernel to the Hopper kernel), in the order they were measured: step name, kernel, precision, time, share of
    the copy ceiling, error, and nanoseconds per visible logit (the one figure that compares the scalar loops, timed on
    a sequence's first positions, with the steps timed on the whole shape). The Hopper ladder starts from the Triton
    ladder's last step, the portable kernel."""
    steps = []
    for r in record["rows"]:
        if r.get("step") and "us" in r and Shape(**r["shape"]) == shape and r.get("chapter", 5) == chapter:
            steps.append({"step": r["step"], "kernel": r["kernel"], "precision": r["precision"], "us": r["us"],
                          "pct_copy": r.get("pct_copy"), "max_rel_error": r["max_rel_error"],
                          "ns_per_logit": 1e3 * r["us"] / r["finite"], "positions": r.get("positions"),
                          "programs": r.get("programs_per_sequence")})
    if chapter == 5 and "sms" in record.get("provenance", {}) and any(s["programs"] is None for s in steps):
        for s, programs in zip(steps, _programs_before_record(record, shape, steps)):
            s["programs"] = programs
    return steps


def _programs_before_record(record: dict, shape: Shape, steps: list[dict]) -> list[int]:
    """Programs a sequence of each step of the ladder to the Hopper kernel in a run recorded before its rows named them: what that
    run's launch code cut (programs_per_sm * SMs / batch programs a row, rounded up): the portable kernel at 4
    programs an SM below 128 sequences, else 16; the plain-Triton TMA step and the launch rule at the Hopper
    kernel's 2 below 256 sequences, else 8; the two ring steps a program a sequence."""
    sms = record["provenance"]["sms"]

    def split(programs_per_sm):
        return max(1, -(-programs_per_sm * sms // shape.batch))

    portable = split(4 if shape.batch < 128 else 16)
    hopper = split(2 if shape.batch < 256 else 8)
    by_kernel = {"portable": portable, "tl-tma": hopper}
    return [hopper if s["step"].endswith("(launch rule)") else by_kernel.get(s["kernel"], 1) for s in steps]


def format_step(ladders: dict[Shape, list[dict]], step: str) -> str:
    """One rung of a ladder (``{shape: report.ladder(...)}``) on each shape: its time, its time per visible logit,
    its share of the copy ceiling and its speed over the rung before (per logit, so that a rung timed on part of the
    shape compares too)."""
    lines = []
    for shape, steps in ladders.items():
        names = [s["step"] for s in steps]
        if step not in names:
            raise ValueError(f"step {step!r} is not in the ladder of {shape.label}: {names}")
        i = names.index(step)
        here = steps[i]
        where = f" (the first {here['positions']} positions of one sequence)" if here["positions"] else ""
        line = (f"{shape.label:26s} {here['us']:8.1f} us{where}, {here['ns_per_logit']:.3g} ns a logit, "
                f"{here['pct_copy']:.3g}% of the copy ceiling")
        if i:
            line += f", {steps[i - 1]['ns_per_logit'] / here['ns_per_logit']:.2f}x as fast as the step before"
        lines.append(line)
    return "\n".join(lines)


def _rule_row(record: dict, shape: Shape, variant: str) -> dict | None:
    """Our kernel's row of ``shape`` and cache under the launch rule: the fp8 path in a benchmark run, the one path a
    launch sweep of the portable kernel timed (its rows carry ``kind``)."""
    if not any("kind" in r for r in record["rows"]):
        return _ours(record, shape, "fp8", variant)
    return next((r for r in record["rows"] if r.get("kind") == "kernel" and r.get("rule") and "us" in r
                 and r["variant"] == variant and Shape(**r["shape"]) == shape), None)


@_reader
def shuffle_costs(record: dict) -> list[dict]:
    """What preshuffled pages cost our kernel: per shape and page size the run timed both ways, the time on
    preshuffled pages over natural pages of the same size, under the launch rule (``{"shape", "block_size",
    "kernel", "ratio"}``; ``kernel`` None in a launch sweep, which runs the portable kernel only)."""
    costs = []
    for shape in shapes(record):
        for block_size in (16, 64):
            shuffled, natural = (_rule_row(record, shape, f"block{block_size}-{layout}")
                                 for layout in ("shuffle", "normal"))
            if shuffled and natural:
                costs.append({"shape": shape, "block_size": block_size, "kernel": shuffled.get("kernel"),
                              "ratio": shuffled["us"] / natural["us"]})
    return costs


def format_shuffle_costs(costs: list[dict]) -> str:
    """One line per page size and next_n: the span of :func:`shuffle_costs`'s ratios as a percentage over natural
    pages, and over how many shapes."""
    groups: dict[tuple[int, int], list[float]] = {}
    for c in costs:
        groups.setdefault((c["block_size"], c["shape"].next_n), []).append(c["ratio"])
    if not groups:
        raise ValueError("costs holds no shape timed on both preshuffled and natural pages")
    lines = []
    for (block_size, next_n), ratios in sorted(groups.items()):
        low, high = (100 * (f(ratios) - 1) for f in (min, max))
        span = f"{low:+.1f}%" if f"{low:.1f}" == f"{high:.1f}" else f"{low:+.1f}% to {high:+.1f}%"
        lines.append(f"{block_size}-token pages, next_n = {next_n}: {span} "
                     f"({len(ratios)} shape{'s' * (len(ratios) > 1)})")
    return "\n".join(lines)


@_reader
def splits(record: dict, shape: Shape) -> dict[int, float]:
    """Programs per SM -> time of the Hopper kernel's fp8 path on DeepGEMM's cache (the launch rule's sweep)."""
    return {r["programs_per_sm"]: r["us"] for r in record["rows"] if "programs_per_sm" in r and "us" in r
            and Shape(**r["shape"]) == shape}


@_reader
def clean_l2(record: dict) -> list[dict]:
    """Each shape timed with a clean-L2 flush: ours and DeepGEMM, beside the default (dirty) flush."""
    out = []
    for shape in shapes(record):
        ours = _ours(record, shape, "fp8", timing="graph-clean-l2")
        if ours:
            dg_clean = find(record, shape, kernel="deepgemm", variant=BASE, timing="graph-clean-l2")
            dg = find(record, shape, kernel="deepgemm", variant=BASE)
            out.append({"shape": shape, "ours_us": _ours(record, shape, "fp8")["us"], "ours_clean_us": ours["us"],
                        "deepgemm_us": dg and dg["us"], "deepgemm_clean_us": dg_clean and dg_clean["us"]})
    return out


@_reader
def best_splits(rows: list[dict]) -> dict[tuple[str, str, str], dict]:
    """The fastest split of every configuration on every shape and cache of a launch sweep
    (``benchmarks/tune.py``'s rows): ``{(shape label, variant, configuration as JSON): row}``."""
    best = {}
    for row in rows:
        key = (row["shape"], row["variant"], json.dumps(row["config"]))
        if "us" in row and (key not in best or row["us"] < best[key]["us"]):
            best[key] = row
    return best


@_reader
def gather_costs(rows: list[dict]) -> list[dict]:
    """Block 1 (gathered) against 64-token pages (TMA) in a launch sweep with both (results/h200-gather-sweep.json):
    per shape, the fastest fp8 launch of each, and their ratio. Rows of an experimental loader are left out."""
    best = {}
    for row in rows:
        if "loader" in row or "us" not in row or row["launch"]["precision"] != "fp8":
            continue
        key = (row["shape"], row["variant"])
        best[key] = min(best.get(key, float("inf")), row["us"])
    return [{"shape": shape, "block1_us": us, "block64_us": best[(shape, BASE)], "ratio": us / best[(shape, BASE)]}
            for (shape, variant), us in best.items() if variant == "block1" and (shape, BASE) in best]


@_reader
def page_read_costs(record: dict) -> list[dict]:
    """A ``benchmarks/page_read.py`` run (results/h200-page-read.json): per shape, what each cache costs the page-read
    floor and the kernel against 64-token pages, the kernel's time over its floor on each cache, and block 1's floor
    over the kernel's time on 64-token pages."""
    by_shape: dict[str, dict[str, dict]] = {}
    for row in record["rows"]:
        by_shape.setdefault(row["shape"], {})[row["cache"]] = row
    costs = []
    for shape, caches in by_shape.items():
        base = caches[BASE]
        costs.append({"shape": shape, "block64_floor_us": base["floor_us"], "block64_kernel_us": base["kernel_us"],
                      # what block 1 <= 1.5x block 64 asks of a kernel whose reads alone take the floor's time
                      "block1_floor_over_block64_kernel": caches["block1"]["floor_us"] / base["kernel_us"],
                      **{f"{cache}_floor_ratio": row["floor_us"] / base["floor_us"] for cache, row in caches.items()},
                      **{f"{cache}_kernel_ratio": row["kernel_us"] / base["kernel_us"] for cache, row in caches.items()},
                      **{f"{cache}_over_floor": row["kernel_us"] / row["floor_us"] for cache, row in caches.items()}})
    return costs


def format_page_read(costs: list[dict]) -> str:
    caches = {"block16-normal": "16", "block1": "1", "block1-contiguous": "1 contig"}
    every = {BASE: "64", **caches}

    def cells(c, suffix, names):
        return " ".join(f"{c[f'{k}_{suffix}']:8.2f}x" for k in names)

    lines = [f"{'':26s} {'floor':>10s} | {'floor / block 64':^29s} | {'kernel / block 64':^29s} | "
             f"{'kernel / its floor':^39s}",
             f"{'shape':26s} {'block 64':>10s} | " + " | ".join(" ".join(f"{n:>9s}" for n in caches.values())
                                                            for _ in range(2))
             + " | " + " ".join(f"{n:>9s}" for n in every.values())]
    for c in costs:
        lines.append(f"{c['shape']:26s} {c['block64_floor_us']:7.1f} us | {cells(c, 'floor_ratio', caches)} | "
                     f"{cells(c, 'kernel_ratio', caches)} | {cells(c, 'over_floor', every)}")
    return "\n".join(lines)


@_reader
def host_us(record: dict) -> dict[Shape, float]:
    """Host time of one unchecked call, per shape measured."""
    return {Shape(**h["shape"]): h["us"] for h in record.get("host_us", [])}


@_reader
def host_time_summary(record: dict) -> list[dict]:
    """A ``benchmarks/host_time.py`` run (results/h200-host-time.json): per shape and process state (fresh, and after
    each of the timings the benchmark runs first), the median, least and most of each part over the repeats, and
    (where the run recorded it) of ``python_loop``, a fixed Python loop timed beside the call: the host's speed."""
    groups: dict[tuple, list[dict]] = {}
    for row in record["rows"]:
        us = dict(row["us"])
        if "profile" in row:
            us["python_loop"] = row["profile"]["python_loop_us"]
        groups.setdefault((Shape(**row["shape"]), row["state"]), []).append(us)
    summary = []
    for (shape, state), runs in groups.items():
        parts = {name: sorted(run[name] for run in runs) for name in runs[0]}
        summary.append({"shape": shape, "state": state, "repeats": len(runs),
                        **{name: {"median": v[len(v) // 2], "min": v[0], "max": v[-1]} for name, v in parts.items()}})
    return summary


def format_host_time(summary: list[dict]) -> str:
    lines = []
    for s in summary:
        parts = ", ".join(f"{name} {s[name]['median']:.1f}" for name in ("call_with_out", "lookup", "alloc", "launch"))
        loop = f"; Python loop {s['python_loop']['median']:.1f}" if "python_loop" in s else ""
        lines.append(f"{s['shape'].label:24s} {s['state']:28s} call {s['call']['median']:4.1f} us "
                     f"({s['call']['min']:.1f}-{s['call']['max']:.1f} over {s['repeats']}; medians: {parts}{loop})")
    return "\n".join(lines)


def _cell(value, width: int, fmt: str = ".1f", suffix: str = "") -> str:
    return f"{value:{width - len(suffix)}{fmt}}{suffix}" if value is not None else f"{'-':>{width}s}"


def format_summary(rows: list[dict]) -> str:
    header = (f"{'shape':26s} {'fp8 us':>8s} {'%copy':>6s} {'exact us':>9s} {'DeepGEMM us':>11s} {'%copy':>6s} "
              f"{'fp8/DG':>7s} {'exact/DG':>8s} {'err/DG err':>10s} {'b16/b64':>8s} {'b16s/b64':>8s} {'b1/b64':>7s}")
    lines = [header, "-" * len(header)]
    for r in rows:
        dg_us = r["deepgemm_us"]
        lines.append(" ".join([
            f"{r['shape'].label:26s}", _cell(r["fp8_us"], 8), _cell(r["fp8_pct"], 6), _cell(r["exact_us"], 9),
            _cell(dg_us, 10) + ("*" if r["deepgemm"] == "deepgemm-flattened" else " "), _cell(r["deepgemm_pct"], 6),
            _cell(r["fp8_over_deepgemm"], 7, ".2f", "x"), _cell(r["exact_over_deepgemm"], 8, ".2f", "x"),
            _cell(r["error_over_deepgemm"], 10, ".2f", "x"), _cell(r["block16-normal_over_block64"], 8, ".2f", "x"),
            _cell(r["block16-shuffle_over_block64"], 8, ".2f", "x"), _cell(r["block1_over_block64"], 7, ".2f", "x")]))
    if any(r["deepgemm"] == "deepgemm-flattened" for r in rows):
        lines.append("* DeepGEMM on the same rows flattened to next_n = 1 (its SM90 kernel takes next_n 1 or 2)")
    return "\n".join(lines)


def _ratio(value) -> str:
    return f"{value:.2f}x" if value is not None else "-"


def _span(values) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}x" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}x"


def _phrase(parts: list[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def headline(record: dict, nv_dev: dict | None = None, topk: dict | None = None) -> str:
    """The results in one sentence: per next_n, the span over the run's shapes of our fp8 path's time over the
    stronger DeepGEMM build's (for each shape, the build whose in-run ratio is the larger: the one ours fares worse
    against); then, where ``topk`` has shapes, our top-k's time over the best of vLLM's."""
    others = {r["shape"]: r for r in summary(nv_dev)} if nv_dev else {}
    by_next_n: dict[int, list[float]] = {}
    for r in summary(record):
        ratios = [row["fp8_over_deepgemm"] for row in (r, others.get(r["shape"]))
                  if row and row["fp8_over_deepgemm"] is not None]
        if ratios:
            by_next_n.setdefault(r["shape"].next_n, []).append(max(ratios))
    if not by_next_n:
        raise ValueError("the record has no shape with both our fp8 path and DeepGEMM timed")
    build = "the stronger DeepGEMM build" if nv_dev else "DeepGEMM"
    parts = [f"{_span(ratios)} {build}'s time at next_n = {n}" if i == 0 else f"{_span(ratios)} at {n}"
             for i, (n, ratios) in enumerate(sorted(by_next_n.items()))]
    sentence = f"On an {record['provenance'].get('gpu')} our fp8 kernel takes " + _phrase(parts)
    topk_ratios = [ours / best for ours, best in (topk or {}).values()]
    if topk_ratios:
        sentence += f"; our top-k {_span(topk_ratios)} vLLM's fastest"
    return sentence + "."


def results_table(record: dict, nv_dev: dict | None = None, topk: dict | None = None) -> str:
    """The headline results as Markdown: :func:`headline`, what the table holds, then the table, one row per shape
    of the run: our fp8 path on DeepGEMM's cache beside DeepGEMM main in the same run, and beside DeepGEMM nv_dev
    (the line vLLM runs on Hopper) in ``nv_dev``'s run (each ratio within one run; flattened rows where a build does
    not take next_n), what 16-token preshuffled pages cost against 64-token ones, the exact path, and where ``topk``
    (``{Shape: (ours_us, vllm_best_us)}``) has the shape, our top-k over the best of vLLM's. Every ratio is a time
    over a time. ``python -m preshuffle results`` prints it, and the README holds its output."""
    others = {r["shape"]: r for r in summary(nv_dev)} if nv_dev else {}
    topk = topk or {}
    lines = [headline(record, nv_dev, topk), "",
             "Ratios: time over time within a run, under 1.00x the first faster; DeepGEMM in the same process, same "
             "inputs, every row checked against float64 first.", "",
             "| B, next_n, ctx | ours fp8 (us) | DeepGEMM main (us) | ours/main | DeepGEMM nv_dev (us) | ours/nv_dev "
             "| block16-shuffle/block64 | exact/main | top-k ours/vLLM's fastest |",
             "|---|---|---|---|---|---|---|---|---|"]
    flattened = False

    def dg(row):
        nonlocal flattened
        if not row or row["deepgemm_us"] is None:
            return "-"
        if row["deepgemm"] == "deepgemm-flattened":
            flattened = True
            return f"{row['deepgemm_us']:.1f} (flattened)"
        return f"{row['deepgemm_us']:.1f}"

    for r in summary(record):
        s = r["shape"]
        other = others.get(s)
        ours_topk = topk.get(s)
        lines.append(f"| {s.batch}, {s.next_n}, {s.avg_ctx // 1024}K | {r['fp8_us']:.1f} | {dg(r)} | "
                     f"{_ratio(r['fp8_over_deepgemm'])} | {dg(other)} | {_ratio(other and other['fp8_over_deepgemm'])} | "
                     f"{_ratio(r['block16-shuffle_over_block64'])} | {_ratio(r['exact_over_deepgemm'])} | "
                     f"{_ratio(ours_topk and ours_topk[0] / ours_topk[1])} |")
    p = record["provenance"]
    commits = f"commit {str(p.get('git_commit'))[:7]}"
    if nv_dev:
        commits += f" (nv_dev's: {str(nv_dev['provenance'].get('git_commit'))[:7]})"
    lines += ["", f"torch {p['torch']}, Triton {p['triton']}, {p['date'][:10]}, {commits}."
              + (" Flattened: run as next_n = 1 rows." if flattened else "")]
    return "\n".join(lines)


def deepgemm_build(record: dict) -> dict | None:
    """Which DeepGEMM a run timed: ``{"version", "branch", "commit", "source"}`` (:class:`preshuffle.deepgemm.Build`),
    None where it timed none. Runs recorded before the benchmark named builds hold the version alone."""
    build = record.get("deepgemm")
    if build is None or isinstance(build, dict):
        return build
    return {"version": build, "branch": None, "commit": None, "source": "unknown"}


def build_label(record: dict) -> str | None:
    """``"DeepGEMM nv_dev a6b593d (2.5.0)"``, or as much of that as the run recorded; None where it timed none."""
    build = deepgemm_build(record)
    if build is None:
        return None
    named = " ".join(str(build[k]) for k in ("branch", "commit") if build.get(k))
    version = build.get("version")
    return "DeepGEMM " + (f"{named} ({version})" if named and version else named or str(version))


def stale_note(record: dict, source: str = "the run") -> str | None:
    """A line saying that ``record`` no longer measures the package's kernels, and why
    (:func:`preshuffle.provenance.staleness`); None while it does."""
    why = provenance.staleness(record)
    return f"STALE: {source} no longer measures the package's kernels: {why}" if why else None


def provenance_line(record: dict) -> str:
    p = record["provenance"]
    line = (f"{p.get('gpu')} ({p.get('sms')} SMs, driver {p.get('driver')}, CUDA {p.get('cuda')}), torch {p['torch']}, "
            f"Triton {p['triton']}, measured {p['date']} at commit {str(p.get('git_commit'))[:10]}")
    if "copy_bytes_per_s" in record:
        line += f"; copy ceiling {record['copy_bytes_per_s'] / 1e12:.2f} TB/s measured in the same run"
    build = deepgemm_build(record)
    if build is None:
        return line
    named = build.get("branch") or build.get("commit")
    return line + (f", {build_label(record)} in the same process" if named else ", DeepGEMM in the same process")


def against_builds(records: list[dict]) -> list[dict]:
    """Runs of the benchmark, one a DeepGEMM build (each build in its own process), read together: one row per shape
    any of them measured, with each run's build, that build's time (``deepgemm``: "deepgemm" where it takes the rows,
    "deepgemm-flattened" where it ran them as next_n = 1), our fp8 path's time in the same run, and their ratio. Each
    ratio comes from one process; times of different runs are not divided."""
    rows = []
    for shape in dict.fromkeys(s for record in records for s in shapes(record)):
        runs = []
        for record in records:
            dg, ours = _deepgemm(record, shape), _ours(record, shape, "fp8")
            runs.append({"build": build_label(record), "deepgemm": dg and dg["kernel"], "deepgemm_us": dg and dg["us"],
                         "ours_us": ours and ours["us"], "ours_over_deepgemm": _div(ours, dg)})
        rows.append({"shape": shape, "runs": runs})
    return rows


def builds_table(records: list[dict]) -> str:
    """:func:`against_builds` as a Markdown table: for each run, its build's time, ours in the same run, the ratio."""
    labels = [build_label(record) or "no DeepGEMM" for record in records]
    header = "| B, next_n, ctx | " + " | ".join(f"{label} (us) | ours (us) | ours / it" for label in labels) + " |"
    lines = [header, "|---|" + "---|---|---|" * len(records)]
    flattened = False
    for row in against_builds(records):
        s = row["shape"]
        cells = []
        for run in row["runs"]:
            dg = _cell(run["deepgemm_us"], 1).strip()
            if run["deepgemm"] == "deepgemm-flattened":
                dg, flattened = dg + " (flattened)", True
            cells.append(f"{dg} | {_cell(run['ours_us'], 1).strip()} | {_ratio(run['ours_over_deepgemm'])}")
        lines.append(f"| {s.batch}, {s.next_n}, {s.avg_ctx // 1024}K | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"{label}: " + provenance_line(record) + "." for label, record in zip(labels, records)]
    if flattened:
        lines.append("Flattened: DeepGEMM on the same rows as next_n = 1 sequences, as vLLM runs what a build's SM90 "
                     "kernel does not take.")
    return "\n".join(lines)


def format_ladder(steps: list[dict]) -> str:
    split = any(s.get("programs") for s in steps)
    lines = [f"{'step':52s} {'kernel':13s} {'us':>9s} {'ns/logit':>9s} {'%copy':>6s} {'error':>8s}"
             + (f" {'programs/seq':>12s}" if split else "")]
    for s in steps:
        us = f"{s['us']:8.1f}" + ("*" if s["positions"] else " ")
        lines.append(f"{s['step']:52s} {s['kernel']:13s} {us} {s['ns_per_logit']:9.3g} {_cell(s['pct_copy'], 6)} "
                     f"{s['max_rel_error']:8.1e}" + (f" {s.get('programs') or '-':>12}" if split else ""))
    sub = [s["positions"] for s in steps if s["positions"]]
    if sub:
        lines.append(f"* on the first {sub[0]} positions of one sequence")
    return "\n".join(lines)


@_reader
def targets(record: dict) -> list[dict]:
    """The targets of docs/performance.md, each with the run's numbers and whether the run meets it."""
    rows = {r["shape"]: r for r in summary(record)}
    anchors = [rows[s] for s in rows if s in ANCHOR_SHAPES]
    next_n_1 = [r for r in anchors if r["shape"].next_n == 1]
    host = host_us(record)
    mtp = rows.get(MTP_SHAPES[0])
    small = [r for r in anchors if r["shape"] in host]

    def worst(values):
        return max(v for v in values if v is not None)

    checks = [
        ("fp8 path <= DeepGEMM's time on every anchor shape", worst(r["fp8_over_deepgemm"] for r in anchors), "<=", 1.0),
        ("fp8 error <= 1.1x DeepGEMM's on the same inputs", worst(r["error_over_deepgemm"] for r in anchors), "<=",
         1.1),
        ("B=4096 ctx 8K: share of the copy ceiling >= 95%", rows[Shape(4096, 1, 8192)]["fp8_pct"], ">=", 95.0),
        ("B=1 ctx 128K <= 9 us", rows[Shape(1, 1, 131072)]["fp8_us"], "<=", 9.0),
        ("exact path <= 1.2x DeepGEMM on the next_n = 1 shapes", worst(r["exact_over_deepgemm"] for r in next_n_1),
         "<=", 1.2),
        ("block 16 natural <= 1.1x block 64", worst(r["block16-normal_over_block64"] for r in anchors), "<=", 1.1),
        ("block 16 preshuffled <= 1.1x block 64", worst(r["block16-shuffle_over_block64"] for r in anchors), "<=",
         1.1),
        ("block 1 <= 1.5x block 64", worst(r["block1_over_block64"] for r in anchors), "<=", 1.5),
        ("next_n = 3, B=64 ctx 8K: >= 2x faster than DeepGEMM on the flattened rows",
         mtp and 1 / mtp["fp8_over_deepgemm"], ">=", 2.0),
        ("eager call - graph replay <= 10 us at B=1 and B=64", worst(r["eager_minus_graph_us"] for r in small), "<=",
         10.0),
        ("host time of an unchecked call <= 10 us", worst(host.values()), "<=", 10.0),
    ]
    return [{"target": name, "value": value, "met": value is not None and (value <= limit if kind == "<=" else
                                                                              value >= limit)}
            for name, value, kind, limit in checks]


def format_targets(checks: list[dict]) -> str:
    return "\n".join(f"{'met ' if c['met'] else 'MISS'}  {c['target']}: "
                     + ("not measured" if c["value"] is None else f"{c['value']:.2f}") for c in checks)


# The explorers' readers.

# vLLM PR #51216's two figures for AITER's paged-MQA kernel, 4x MI355X (us): per-token paging vs preshuffled blocks.
PR_51216_MI355X_US = {1: 28.53, 16: 7.84}
# The shape whose H200 times stand for "what a kernel block size costs" on CUDA.
COST_SHAPE = Shape(64, 1, 8192)


@_reader
def variant_time(record: dict, shape: Shape, block_size: int, layout: str = "normal", precision: str = "fp8"):
    """Median microseconds of our kernel (what the entry point runs) at ``shape`` on this cache and precision,
    under the launch rule; None when the run did not measure that combination."""
    name = {v: k for k, v in VARIANTS.items()}.get((block_size, layout))
    row = _ours(record, shape, precision, name) if name else None
    return row["us"] if row else None


def kernel_costs(negotiation, record: dict) -> dict:
    """What the negotiated indexer kernel costs, beside the kernel block sizes measured on its platform.

    Returns ``{"source": str, "bars": [{"kernel_block_size": int, "us": float | None, "negotiated": bool}]}``,
    bars sorted by block size, ``us`` None where nobody measured that size. ROCm: the PR's two figures (AITER,
    4x MI355X). CUDA: our kernels' H200 times at :data:`COST_SHAPE`, natural layout, fp8 path."""
    if negotiation.platform == "rocm":
        measured = dict(PR_51216_MI355X_US)
        source = "AITER on 4x MI355X, measured in vLLM PR #51216"
    else:
        measured = {k: variant_time(record, COST_SHAPE, k) for k in (1, 16, 64)}
        source = f"our kernels on the H200 at {COST_SHAPE.label}, natural layout, fp8 (results/h200.json)"
    chosen = negotiation.kernel_block_size
    sizes = sorted(set(measured) | ({chosen} if chosen else set()))
    return {"source": source,
            "bars": [{"kernel_block_size": k, "us": measured.get(k), "negotiated": k == chosen} for k in sizes]}


@_reader
def nearest_shape(record: dict, batch: int, avg_ctx: int, next_n: int) -> Shape:
    """The measured shape closest to the asked one: same next_n where one exists, then the smallest distance
    in (log2 batch, log2 context); ties go to the shape measured first."""
    for name, value in (("batch", batch), ("avg_ctx", avg_ctx), ("next_n", next_n)):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    measured = shapes(record)
    if not measured:
        raise ValueError("record has no measured rows")

    def distance(s: Shape) -> tuple:
        return (abs(s.next_n - next_n), math.hypot(math.log2(s.batch / batch), math.log2(s.avg_ctx / avg_ctx)))

    return min(measured, key=distance)


@_reader
def workload_bars(record: dict, batch: int, avg_ctx: int, next_n: int, block_size: int, layout: str,
                  precision: str) -> tuple[Shape, list[dict]]:
    """The bars of the workload explorer: ``(nearest measured shape, bars)``.

    One bar per cache of ours at ``precision`` ("exact" or "fp8"), then DeepGEMM measured in the same run (on the
    flattened rows where next_n = 3). Each bar is ``{"label": str, "us": float | None, "pct_copy": float | None,
    "chosen": bool}``: ``us`` None where that combination was not measured; ``chosen`` marks the asked cache."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if (block_size, layout) not in VARIANTS.values():
        raise ValueError(f"(block_size, layout) must be one of {sorted(VARIANTS.values())}, got {(block_size, layout)}")
    shape = nearest_shape(record, batch, avg_ctx, next_n)
    bars = []
    for name, variant in VARIANTS.items():
        row = _ours(record, shape, precision, name) or {}
        bars.append({"label": f"ours {name} ({precision})", "us": row.get("us"), "pct_copy": row.get("pct_copy"),
                     "chosen": variant == (block_size, layout)})
    dg = _deepgemm(record, shape) or {}
    label = "DeepGEMM (same run" + (", flattened rows)" if dg.get("kernel") == "deepgemm-flattened" else ")")
    bars.append({"label": label, "us": dg.get("us"), "pct_copy": dg.get("pct_copy"), "chosen": False})
    return shape, bars
