"""DeepGEMM's own test of paged MQA logits on a GPU, pointed at preshuffle.deepgemm_compat: every SM90 case DeepGEMM
enumerates and ours beyond them (preshuffle.testing.deepgemm_checks), with DeepGEMM itself checked on the same inputs
where it takes the case; then the module timed beside DeepGEMM, both leaving unwritten what a row may not see
(clean_logits=False), on the anchor shapes' next_n = 1 and 2 inputs (CUDA-graph replays, L2 flushed:
preshuffle.testing.timing), fp32 and bf16 logits, each checked against float64 first (bf16 by its contract), and
DeepGEMM's row at vLLM's max_model_len (163840) beside ours. One process, one DeepGEMM build (the one `import
deep_gemm` finds; without one, only ours):

    python benchmarks/deepgemm_test_gpu.py OUT_DIR [--cases all|sm90|ours|none] [--no-timings]

writes OUT_DIR/deepgemm-test-<branch>.json (provenance, the build, every check and timing) and a .log of the same
lines, and prints a short table last. A case or timing that fails is recorded with its error; the run goes on.
"""

import argparse
import json
import time
import traceback
from dataclasses import asdict
from pathlib import Path

import torch

from preshuffle import benchmark, deepgemm, deepgemm_compat, device
from preshuffle import provenance as run_provenance
from preshuffle.reference import reference_and_magnitude
from preshuffle.shapes import ANCHOR_SHAPES, Shape
from preshuffle.testing import deepgemm_checks, timing
from preshuffle.testing.inputs import benchmark_problem
from preshuffle.testing.numeric import BF16_CONTRACTS, CONTRACTS

TIMED_SHAPES = tuple(s for s in ANCHOR_SHAPES if s.next_n <= 2)  # the six next_n = 1 and two next_n = 2 anchors
# vLLM passes the model's longest context, not the batch's: DeepSeek-V3.2's 163840.
VLLM_MAX_MODEL_LEN = 163840
VLLM_SHAPE = Shape(64, 1, 8192)
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def cases(which: str) -> tuple:
    return {"all": deepgemm_checks.SM90_CASES + deepgemm_checks.OUR_CASES, "sm90": deepgemm_checks.SM90_CASES,
            "ours": deepgemm_checks.OUR_CASES, "none": ()}[which]


def check_case(index, case, dg, build, reruns) -> dict:
    row = {"case": case.as_dict(), "label": case.label}
    inputs = deepgemm_checks.paged_inputs(case, seed=index, device=device.KERNEL_DEVICE)
    row["ours"] = deepgemm_checks.check(deepgemm_checks.call_of(deepgemm_compat, inputs), inputs, reruns)
    reason = "no DeepGEMM in this process" if dg is None else deepgemm.kernel_refusal(
        build, case.block_kv, case.layout, case.next_n, case.heads)
    if reason is None:
        slots = build.schedule_slots(dg.get_num_sms(), case.next_n)
        row["deepgemm"] = deepgemm_checks.check(deepgemm_checks.call_of(dg, inputs, slots), inputs, reruns)
    else:
        row["deepgemm_refused"] = reason
    return row


def check_line(row) -> str:
    if "error" in row:
        return f"{row['label']:60s} ERROR {row['error'].splitlines()[-1]}"

    def verdict(v):
        return (f"{'pass' if v['passed'] else 'FAIL'} diff {v['diff']:.3e} simulated {v['simulated_diff']:.3e}"
                f"{'' if v['bitwise_repeatable'] else ' NOT REPEATABLE'}")

    dg = verdict(row["deepgemm"]) if "deepgemm" in row else "-"
    return f"{row['label']:60s} ours {verdict(row['ours'])} | DeepGEMM {dg}"


def timed_rows(shape, dg, build, ceiling, max_model_len=None) -> list[dict]:
    """Ours (deepgemm_compat, clean_logits=False) and DeepGEMM on one problem, fp32 and bf16, and ours with the -inf
    fill (the package's default) in fp32: each checked against float64, then timed."""
    problem = benchmark_problem(shape, 64, "normal")
    if max_model_len is not None:  # vLLM's call: the model's longest context, tables as wide as it
        width = -(-max_model_len // 64)
        tables = torch.zeros(problem.batch, width, dtype=torch.int32, device=device.KERNEL_DEVICE)
        tables[:, :problem.block_tables.shape[1]] = problem.block_tables
        problem = problem.replace(max_model_len=max_model_len, block_tables=tables, sum_ctx=problem.sum_ctx)
    reference = problem.call(reference_and_magnitude)
    rows = []

    def add(who, dtype_name, fn, clean):
        row = {"shape": asdict(shape), "max_model_len": problem.max_model_len, "who": who, "logits": dtype_name,
               "clean_logits": clean}
        try:
            row.update(benchmark.measure(fn, problem, reference, precision="fp8", copy_bytes_per_s=ceiling,
                                         masked=not clean, logits_dtype=DTYPES[dtype_name]))
        except Exception:  # noqa: BLE001 (record it and go on)
            row["error"] = traceback.format_exc()
        rows.append(row)

    slots = deepgemm_compat.get_num_sms()
    for name, dtype in DTYPES.items():
        add("ours", name, deepgemm.api_call(deepgemm_compat, problem, slots, dtype), False)
        if dg is not None and deepgemm.refusal(problem, build) is None:
            add("deepgemm", name, deepgemm.logits_fn(dg, problem, build, dtype), False)
    add("ours", "fp32", deepgemm.api_call(deepgemm_compat, problem, slots, torch.float32, True), True)
    return rows


def timing_line(shape, r) -> str:
    what = f"{shape.label} L={r['max_model_len']} {r['who']} {r['logits']}{' filled' if r['clean_logits'] else ''}"
    if "us" in r:
        return f"{what}: {r['us']:.1f} us, error {r['max_rel_error']:.2e}, calc_diff {r['calc_diff']:.2e}"
    if "error" in r:
        return f"{what}: not timed, {r['error'].strip().splitlines()[-1]}"
    return f"{what}: not timed, outside its contract ({ {k: v for k, v in r.items() if k not in ('shape', 'who')} })"


def find(rows, shape, max_model_len, who, logits, clean=False):
    for r in rows:
        if (Shape(**r["shape"]) == shape and r["max_model_len"] == max_model_len and r["who"] == who
                and r["logits"] == logits and r["clean_logits"] == clean):
            return r
    return None


def table(record) -> str:
    rows = record["timings"]
    lines = [f"{'shape':34s} {'ours fp32':>9s} {'DG fp32':>8s} {'ratio':>6s} {'ours bf16':>9s} {'DG bf16':>8s} "
             f"{'ratio':>6s} {'filled':>7s} | bf16 error: {'ours':>8s} {'DG':>8s} calc_diff {'ours':>8s} {'DG':>8s}"]
    seen = dict.fromkeys((Shape(**r["shape"]), r["max_model_len"]) for r in rows)

    def us(r):
        return f"{r['us']:.1f}" if r and "us" in r else "-"

    def ratio(a, b):
        return f"{a['us'] / b['us']:.2f}x" if a and b and "us" in a and "us" in b else "-"

    def err(r, key):
        return f"{r[key]:.2e}" if r and key in r else "-"

    for shape, width in seen:
        o32, d32 = find(rows, shape, width, "ours", "fp32"), find(rows, shape, width, "deepgemm", "fp32")
        o16, d16 = find(rows, shape, width, "ours", "bf16"), find(rows, shape, width, "deepgemm", "bf16")
        filled = find(rows, shape, width, "ours", "fp32", clean=True)
        label = shape.label + (f" L={width}" if width == VLLM_MAX_MODEL_LEN else "")
        lines.append(f"{label:34s} {us(o32):>9s} {us(d32):>8s} {ratio(o32, d32):>6s} {us(o16):>9s} {us(d16):>8s} "
                     f"{ratio(o16, d16):>6s} {us(filled):>7s} | {'':12s}{err(o16, 'max_rel_error'):>8s} "
                     f"{err(d16, 'max_rel_error'):>8s} {'':9s} {err(o16, 'calc_diff'):>8s} {err(d16, 'calc_diff'):>8s}")
    checks = record["checks"]
    ours = sum(1 for c in checks if c.get("ours", {}).get("passed"))
    theirs = [c["deepgemm"]["passed"] for c in checks if "deepgemm" in c]
    lines.append(f"DeepGEMM's test: ours passed {ours} of {len(checks)} cases; DeepGEMM passed {sum(theirs)} of "
                 f"{len(theirs)} it takes. Times in us (CUDA-graph replays, L2 flushed); ratio = ours / DeepGEMM, "
                 f"same process; 'filled' = ours with the -inf fill.")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--cases", choices=["all", "sm90", "ours", "none"], default="all")
    ap.add_argument("--no-timings", action="store_true")
    ap.add_argument("--reruns", type=int, default=deepgemm_checks.RERUNS)
    args = ap.parse_args(argv)
    timing.refuse_interpreter()
    started = time.time()
    dg = deepgemm.load()
    build = deepgemm.build_info(dg) if dg is not None else None
    name = f"deepgemm-test-{(build.branch or 'unknown') if build else 'none'}"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    log = open(args.out_dir / f"{name}.log", "w")

    def say(line):
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    record = {"provenance": benchmark.provenance("logits"), "deepgemm": build.as_dict() if build else None,
              "contracts": {"fp32": CONTRACTS, "bf16": BF16_CONTRACTS}, "checks": [], "timings": []}

    def save():
        record["seconds"] = time.time() - started
        (args.out_dir / f"{name}.json").write_text(json.dumps(run_provenance.seal_record(record), indent=1))

    say(f"{name}: {build.label if build else 'no DeepGEMM'}; {benchmark.provenance().get('gpu')}")
    for index, case in enumerate(cases(args.cases)):
        try:
            row = check_case(index, case, dg, build, args.reruns)
        except Exception:  # noqa: BLE001 (record it and go on)
            row = {"case": case.as_dict(), "label": case.label, "error": traceback.format_exc()}
        record["checks"].append(row)
        say(check_line(row))
        save()
        torch.cuda.empty_cache()
    if not args.no_timings:
        ceiling = timing.copy_bandwidth()
        record["copy_bytes_per_s"] = ceiling
        for shape, width in [(s, None) for s in TIMED_SHAPES] + [(VLLM_SHAPE, VLLM_MAX_MODEL_LEN)]:
            try:
                rows = timed_rows(shape, dg, build, ceiling, width)
            except Exception:  # noqa: BLE001
                rows = [{"shape": asdict(shape), "max_model_len": width, "who": "setup", "logits": "-",
                         "clean_logits": False, "error": traceback.format_exc()}]
            record["timings"] += rows
            for r in rows:
                say(timing_line(shape, r))
            save()
            torch.cuda.empty_cache()
    save()
    say(table(record))
    say(f"{time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
