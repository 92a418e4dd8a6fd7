"""The indexer's logits call as vLLM makes it, ours beside DeepGEMM in one process, each ratio taken in rounds.

vLLM's sparse indexer calls ``fp8_fp4_paged_mqa_logits`` with ``max_context_len`` set to the model's longest context
(163840 for DeepSeek-V3.2) whatever the batch holds, ``clean_logits=False`` and a ``[B, next_n]`` length per row.
This script times that call through :mod:`preshuffle.deepgemm_compat` and through the DeepGEMM build ``import
deep_gemm`` finds (on the same rows flattened to next_n = 1 where the build has no native kernel), at the rows'
own width and at vLLM's, on every measured shape (64-token natural pages: DeepGEMM's). Each call is checked first
(the logits a row may see, against the float64 reference, by the fp8 contract, bitwise repeatable); then every
call is timed once a round (CUDA-graph replays, L2 flushed between replays), ``--rounds`` rounds, so that each
round gives a ratio of two times taken seconds apart. ``--configs`` adds launches of the package's own entry point
at the rows' width, each a JSON object of :class:`preshuffle.kernels.HopperConfig` fields over the launch rule's
(``splits`` among them), plus ``pps`` (programs an SM, for the split), the cache (``block_size``, ``layout``; by
default DeepGEMM's) and the shapes it is for (``batch``, ``next_n``: lists; by default every shape), timed in the
same rounds::

    python benchmarks/vllm_call_gpu.py OUT.json [--rounds 3] [--shapes 0 1 8] \\
        [--configs '{"row_warpgroups": true, "stages": 8}' ...]

writes OUT.json (provenance, the build, every check and every round's time) after each shape and prints a table
last: per call the median time over rounds, and per ratio its median with the lowest and highest round.
"""

import argparse
import json
import statistics
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

from preshuffle import benchmark, deepgemm, deepgemm_compat, provenance
from preshuffle.vllm_call_report import find, round_ratio
from preshuffle.kernels import HopperConfig, fp8_paged_mqa_logits
from preshuffle.kernels.launch import hopper_config
from preshuffle.reference import reference_and_magnitude
from preshuffle.shapes import MEASURED_SHAPES, Shape
from preshuffle.testing import timing
from preshuffle.testing.inputs import benchmark_problem, input_digest
from preshuffle.testing.numeric import CONTRACTS, check_repeatable, compare_logits, meets_contract

ROOT = Path(__file__).resolve().parents[1]
VLLM_MAX_MODEL_LEN = 163840  # DeepSeek-V3.2's max_model_len, what vLLM passes as max_context_len
REPEATS = 5                  # runs compared bit for bit before a call is timed
SELECTORS = ("pps", "batch", "next_n", "block_size", "layout")  # --configs keys that are no HopperConfig field


def error_text() -> str:
    """The exception being handled, its paths in the checkout named from the checkout's root (a results file names
    no machine's folders)."""
    return traceback.format_exc().replace(str(ROOT), ".")


def widened(problem, width: int):
    """``problem`` as vLLM hands it over: rows of ``width`` logits and block tables as wide as ``width`` needs (the
    extra entries 0, never read: past every context)."""
    if width < problem.max_model_len:
        raise ValueError(f"width must be at least the rows' own {problem.max_model_len}, got {width}")
    blocks = -(-width // problem.block_size)
    tables = torch.zeros(problem.batch, blocks, dtype=torch.int32, device=problem.block_tables.device)
    tables[:, :problem.block_tables.shape[1]] = problem.block_tables
    return problem.replace(max_model_len=width, block_tables=tables, sum_ctx=problem.sum_ctx)


def check(fn, reference, width: int, precision: str = "fp8") -> dict:
    """The contract of ``precision`` on the logits a row may see (the first ``width`` positions, what a row may not
    see set to the reference's -inf), and bitwise repeatability."""
    written = lambda: deepgemm.masked_like(fn()[:, :width], reference[0])  # noqa: E731
    try:
        out, repeatable = check_repeatable(written, REPEATS), True
    except AssertionError:
        out, repeatable = written(), False
    verdict = compare_logits(out, *reference)
    verdict["bitwise_repeatable"] = repeatable
    verdict["meets_contract"] = meets_contract(verdict, precision) and repeatable
    return verdict


# Ours beside ours at vLLM's call, on the same contexts: the exact path, and 16-token pages, natural and
# preshuffled (who, block size, layout, precision).
OWN_VARIANTS = (("ours-exact", 64, "normal", "exact"), ("ours-block16", 16, "normal", "fp8"),
                ("ours-block16-shuffle", 16, "shuffle", "fp8"))


def calls(shape: Shape, dg, build, configs) -> tuple:
    """(tight problem, [(name, width, fn, row fields, (reference, precision))]) for one shape: ours through the
    compatible API and DeepGEMM at both widths, ours on the other paths at vLLM's width, and the extra launches at
    the tight width."""
    caches = {}

    def on_cache(block_size: int, layout: str):
        """The shape's problem on one cache, its float64 reference and its inputs' record, built once."""
        if (block_size, layout) not in caches:
            own = benchmark_problem(shape, block_size, layout, seed=benchmark.SEED)
            caches[block_size, layout] = (own, own.call(reference_and_magnitude),
                                          {"seed": benchmark.SEED, "inputs_sha256": input_digest(own)})
        return caches[block_size, layout]

    problem, ref64, inputs = on_cache(64, "normal")  # the tight problem's inputs, every width's
    reference = (ref64, "fp8")
    slots = deepgemm_compat.get_num_sms()
    out = []
    for width in (problem.max_model_len, VLLM_MAX_MODEL_LEN):
        wide = widened(problem, width)
        out.append(("ours", width, deepgemm.api_call(deepgemm_compat, wide, slots), inputs, reference))
        if dg is not None:
            direct = deepgemm.refusal(wide, build) is None
            dg_problem = wide if direct else deepgemm.flattened(wide)
            if deepgemm.refusal(dg_problem, build) is None:
                out.append(("deepgemm" if direct else "deepgemm-flattened", width,
                            deepgemm.logits_fn(dg, dg_problem, build), inputs, reference))
    for who, block_size, layout, precision in OWN_VARIANTS:
        own, own_reference, own_inputs = on_cache(block_size, layout)
        wide = widened(own, VLLM_MAX_MODEL_LEN)
        out.append((who, VLLM_MAX_MODEL_LEN, deepgemm.api_call(deepgemm_compat, wide, slots, layout=layout,
                                                                precision=precision), own_inputs,
                    (own_reference, precision)))
    for fields in configs:
        fields = dict(fields)
        pps = fields.pop("pps", None)
        if shape.batch not in fields.pop("batch", [shape.batch]) or shape.next_n not in fields.pop("next_n",
                                                                                                  [shape.next_n]):
            continue
        block_size, layout = fields.pop("block_size", 64), fields.pop("layout", "normal")
        own, own_reference, own_inputs = on_cache(block_size, layout)
        # The rule's launch for the shape (at pps programs an SM, if given), with the fields asked for.
        rule = hopper_config(shape.batch, shape.next_n, block_size=block_size, layout=layout,
                             programs_per_sm=pps)
        config = HopperConfig(**{**asdict(rule), **fields})
        fn = (lambda p, c: lambda: p.call(fp8_paged_mqa_logits, precision="fp8", check_values=False, config=c,
                                          clean_logits=False))(own, config)
        out.append(("ours-config", own.max_model_len, fn, {"config": asdict(config), "asked": fields, "pps": pps,
                                                           "block_size": block_size, "layout": layout, **own_inputs},
                    (own_reference, "fp8")))
    return problem, out


def measure_shape(shape: Shape, dg, build, configs, rounds: int, ceiling: float) -> list[dict]:
    problem, entries = calls(shape, dg, build, configs)
    rows = []
    for who, width, fn, extra, (reference, precision) in entries:
        row = {"shape": asdict(shape), "who": who, "max_model_len": width, "precision": precision, **extra}
        try:
            row.update(check(fn, reference, problem.max_model_len, precision))
        except Exception:  # noqa: BLE001 (record it and go on)
            row["error"] = error_text()
        rows.append((row, fn))
    for _ in range(rounds):
        for row, fn in rows:
            if row.get("meets_contract"):
                row.setdefault("us", []).append(timing.time_ms(fn) * 1e3)
    for row, _ in rows:
        if row.get("us"):
            row["us_median"] = statistics.median(row["us"])
            row["pct_copy"] = 100 * problem.bytes / (row["us_median"] * 1e-6) / ceiling
            row["bytes"] = problem.bytes
    return [provenance.seal(row) for row, _ in rows]


def table(record: dict) -> str:
    rows = record["rows"]
    lines = [f"{'shape':28s} {'width':>7s} {'ours':>8s} {'DeepGEMM':>9s} {'ours/DG median [low, high]':>30s}"]
    shapes = dict.fromkeys(Shape(**r["shape"]) for r in rows)

    def us(r):
        return f"{r['us_median']:.1f}" if r and r.get("us_median") else "-"

    for shape in shapes:
        for width in dict.fromkeys(r["max_model_len"] for r in rows if Shape(**r["shape"]) == shape
                                   and r["who"] != "ours-config"):
            ours = find(rows, shape, "ours", width)
            dg = find(rows, shape, ("deepgemm", "deepgemm-flattened"), width)
            q = round_ratio(ours, dg)
            flat = " (flattened)" if dg and dg["who"] == "deepgemm-flattened" else ""
            text = f"{q['median']:.2f}x [{q['low']:.2f}, {q['high']:.2f}]{flat}" if q else "-"
            lines.append(f"{shape.label:28s} {width:7d} {us(ours):>8s} {us(dg):>9s} {text:>30s}")
        ours = find(rows, shape, "ours", VLLM_MAX_MODEL_LEN)
        for who, *_ in OWN_VARIANTS:
            own = find(rows, shape, who, VLLM_MAX_MODEL_LEN)
            if own is not None:
                q = round_ratio(own, ours)
                text = f"{q['median']:.2f}x [{q['low']:.2f}, {q['high']:.2f}] of ours" if q else "-"
                lines.append(f"{'  ' + who:54s} {us(own):>8s} {'':9s} {text:>30s}")
        for r in rows:
            if Shape(**r["shape"]) == shape and r["who"] == "ours-config":
                dg = find(rows, shape, ("deepgemm", "deepgemm-flattened"), r["max_model_len"])
                q = round_ratio(r, dg)
                text = f"{q['median']:.2f}x [{q['low']:.2f}, {q['high']:.2f}]" if q else "-"
                if "error" in r:
                    text = "error: " + r["error"].strip().splitlines()[-1][:60]
                lines.append(f"{'  ' + json.dumps(r['asked']) + ' pps ' + str(r['pps']):54s} {us(r):>8s} "
                             f"{'':9s} {text:>30s}")
    lines.append(f"Times in us, the median of {record['rounds']} rounds (CUDA-graph replays, L2 flushed); ratio = ours "
                 f"/ DeepGEMM {record['deepgemm']['label'] if record['deepgemm'] else '-'} in the same round. "
                 f"Width {VLLM_MAX_MODEL_LEN} is vLLM's max_context_len; clean_logits=False, [B, next_n] lengths.")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--shapes", type=int, nargs="+", choices=range(len(MEASURED_SHAPES)),
                    default=list(range(len(MEASURED_SHAPES))),
                    help="indices of the measured shapes: " + "; ".join(
                        f"{i}: {s.label}" for i, s in enumerate(MEASURED_SHAPES)))
    ap.add_argument("--configs", nargs="*", default=[], help="extra launches: HopperConfig fields as JSON, and pps")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    configs = []
    for text in args.configs:
        try:
            fields = json.loads(text)
        except json.JSONDecodeError as exc:
            ap.error(f"--configs {text!r} is not JSON: {exc}")
        if not isinstance(fields, dict):
            ap.error(f"--configs {text!r}: expected a JSON object")
        try:
            HopperConfig(**{"splits": 1, **{k: v for k, v in fields.items() if k not in SELECTORS}})
        except (TypeError, ValueError) as exc:
            ap.error(f"--configs {text!r}: {exc}")
        for key in ("batch", "next_n"):
            if key in fields and not (isinstance(fields[key], list) and all(isinstance(v, int) for v in fields[key])):
                ap.error(f"--configs {text!r}: {key} must be a list of ints, got {fields[key]!r}")
        if fields.get("layout", "normal") not in ("normal", "shuffle"):
            ap.error(f"--configs {text!r}: layout must be 'normal' or 'shuffle', got {fields['layout']!r}")
        if not isinstance(fields.get("block_size", 64), int) or isinstance(fields.get("block_size"), bool) \
                or fields.get("block_size", 64) < 1:
            ap.error(f"--configs {text!r}: block_size must be a positive int, got {fields['block_size']!r}")
        configs.append(fields)
    timing.refuse_interpreter()
    started = time.time()
    dg = deepgemm.load()
    build = deepgemm.build_info(dg) if dg is not None else None
    ceiling = timing.copy_bandwidth()
    record = {"provenance": benchmark.provenance("logits"),
              "deepgemm": {**build.as_dict(), "label": build.label} if build else None, "contracts": CONTRACTS,
              "copy_bytes_per_s": ceiling, "rounds": args.rounds,
              "vllm_max_model_len": VLLM_MAX_MODEL_LEN, "rows": []}
    for index in args.shapes:
        shape = MEASURED_SHAPES[index]
        try:
            record["rows"] += measure_shape(shape, dg, build, configs, args.rounds, ceiling)
        except Exception:  # noqa: BLE001
            record["rows"].append({"shape": asdict(shape), "who": "setup", "max_model_len": 0,
                                   "error": error_text()})
        record["seconds"] = time.time() - started
        args.out.write_text(json.dumps(provenance.seal_record(record), indent=1))
        print(f"{shape.label} done at {record['seconds']:.0f} s", flush=True)
        torch.cuda.empty_cache()
    print(table(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
