"""The contract for non-finite and non-positive inputs (docs/input-contract.md) on a CUDA GPU, and what it costs.

    python3 benchmarks/input_contract_gpu.py OUT.json [--baseline DIR] [--budget SECONDS] [--no-tests]

1. Its tests on the compiled kernels (the Hopper kernel on sm90, the portable one everywhere; pytest in a
   subprocess): NaN in q or a key gives NaN where it enters, a bad scale is refused checked and NaN unchecked, an
   out over any input is refused (the kept launch too), at both precisions.
2. Kernel time (CUDA-graph replays, ``testing.timing.time_ms``) of both kernels as they are and as they were before
   the contract: their modules at commit BASE, loaded from ``--baseline DIR`` (``hopper.py`` and ``portable.py``
   there) or, where the tree has its git history, read with ``git show``. The two are timed in turn on the same
   inputs, three rounds, and each one's median kept.
3. Host time: an unchecked call (a new output, and a given ``out``, whose overlap the kept launch checks on every
   call), that overlap check alone, and a checked call with and without its scale check (the host sync it adds).

Every part records its error instead of stopping the run; the JSON (provenance, tests, rows) goes to OUT.json and a
table is printed last. It starts no new kernel variant after ``--budget`` seconds (default 170): the host times are
measured whatever is left.
"""

import argparse
import importlib.util
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path

import torch

from preshuffle import contract
from preshuffle import provenance as run_provenance
from preshuffle.benchmark import host_parts, provenance
from preshuffle.kernels import LaunchConfig, _kept_for, fp8_paged_mqa_logits
from preshuffle.kernels.launch import config_for, hopper_config
from preshuffle.shapes import Shape
from preshuffle.testing import timing
from preshuffle.testing.inputs import benchmark_problem

BASE = "46cc270"  # the kernels before the contract
ROOT = Path(__file__).resolve().parents[1]
TESTS = ["tests/test_kernels.py", "tests/test_teaching_steps.py", "tests/test_reference.py"]
SELECT = ("nan_wherever or bad_scale or out_over_an_input or word_grid or no_scale_past or kept_launch_takes_no_out "
          "or one_block_logits_gives_nan or checked_steps_refuse or checked_references_refuse or torch_gives_nan")
# (kernel, shape, block size, layout, precision): the anchors' paths, TMA and the gather, both precisions.
VARIANTS = [
    ("hopper", Shape(64, 1, 8192), 64, "normal", "fp8"),
    ("hopper", Shape(64, 1, 8192), 64, "normal", "exact"),
    ("hopper", Shape(64, 1, 8192), 1, "normal", "fp8"),
    ("hopper", Shape(1, 1, 131072), 64, "normal", "fp8"),
    ("hopper", Shape(256, 2, 65536), 64, "normal", "fp8"),
    ("portable", Shape(64, 1, 8192), 64, "normal", "fp8"),
    ("portable", Shape(64, 1, 8192), 64, "normal", "exact"),
    ("portable", Shape(256, 2, 65536), 64, "normal", "fp8"),
]
HOST_SHAPES = (Shape(64, 1, 8192), Shape(1, 1, 131072))
START = time.monotonic()


def elapsed() -> float:
    return time.monotonic() - START


def run_tests() -> dict:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TESTS, "-k", SELECT],
                          cwd=ROOT, capture_output=True, text=True)
    text = done.stdout + done.stderr
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|error)", text)}
    return {"returncode": done.returncode, **counts, "seconds": time.monotonic() - started,
            "failures": re.findall(r"^FAILED (\S+)", text, re.M), "tail": text[-4000:]}


def baseline_module(name: str, directory: str | None):
    """The kernel module ``name`` as it was at BASE, loaded beside the current one (its relative imports resolve
    against this tree's package)."""
    if directory:
        source = Path(directory, f"{name}.py").read_text()
    else:
        source = subprocess.run(["git", "show", f"{BASE}:src/preshuffle/kernels/{name}.py"], cwd=ROOT,
                                capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / f"{name}_at_{BASE}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"preshuffle.kernels._{name}_at_{BASE}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def calls(kernel: str, problem, precision: str, old) -> dict:
    """The call as it is (through the entry point, unchecked: what a server runs) and as it was (the old module's
    launch, with the same launch), each writing its own output."""
    q, kv_cache, weights, context_lens, block_tables, max_model_len = problem.args
    rows = problem.batch * problem.next_n
    if kernel == "hopper":
        config = hopper_config(problem.batch, problem.next_n, exact=precision == "exact",
                               block_size=problem.block_size, layout=problem.layout)
    else:
        config = config_for(problem.batch, dot="fp8" if precision == "fp8" else "fp16")
    new_out = torch.empty(rows, max_model_len, device=q.device)
    fns = {"now": lambda: problem.call(fp8_paged_mqa_logits, precision=precision, check_values=False, config=config,
                                       out=new_out)}
    if old is not None:
        old_out = torch.empty_like(new_out)
        if kernel == "hopper":
            launch = old.launch_hopper(q, kv_cache, weights, context_lens, block_tables, max_model_len, old_out,
                                       layout=problem.layout, exact=precision == "exact", config=config)
            addresses = tuple(t.data_ptr() for t in (q, weights, context_lens, block_tables, old_out))
            fns["before"] = lambda: launch(*addresses)
        else:
            dims = contract.check_inputs(*problem.args, problem.layout, check_values=False)
            fns["before"] = lambda: old.portable_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables,
                                                                  max_model_len, dims, layout=problem.layout,
                                                                  config=config, out=old_out)
    for fn in fns.values():
        fn()
    if q.is_cuda:
        torch.cuda.synchronize()
    # Valid inputs: the contract should change no logit, bit for bit.
    same = None if old is None else bool(torch.equal(new_out, old_out))
    return fns, same


def kernel_rows(baseline: str | None, budget: float) -> list[dict]:
    olds, rows, problems = {}, [], {}
    for name in ("hopper", "portable"):
        try:
            olds[name] = baseline_module(name, baseline)
        except Exception as error:  # noqa: BLE001 (recorded: the current kernels are still timed)
            olds[name] = None
            rows.append({"baseline": name, "error": f"{type(error).__name__}: {error}"})
    for kernel, shape, block_size, layout, precision in VARIANTS:
        row = {"kernel": kernel, "shape": asdict(shape), "block_size": block_size, "layout": layout,
               "precision": precision}
        rows.append(row)
        if elapsed() > budget:
            row["error"] = "skipped: time budget"
            continue
        try:
            key = (shape, block_size, layout)
            if key not in problems:
                problems.clear()  # one problem at a time on the device
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                problems[key] = benchmark_problem(shape, block_size, layout)
            fns, row["bitwise_equal_to_before"] = calls(kernel, problems[key], precision, olds[kernel])
            times = {name: [] for name in fns}
            for _ in range(3):
                for name, fn in fns.items():
                    times[name].append(timing.time_ms(fn) * 1e3)
            row.update({f"{name}_us": statistics.median(v) for name, v in times.items()},
                       rounds={name: v for name, v in times.items()})
            if "before_us" in row:
                row["change_pct"] = 100 * (row["now_us"] / row["before_us"] - 1)
        except Exception as error:  # noqa: BLE001
            row["error"] = f"{type(error).__name__}: {error}"
            row["traceback"] = traceback.format_exc()[-2000:]
    return rows


def host_rows() -> list[dict]:
    rows = []
    for shape in HOST_SHAPES:
        row = {"shape": asdict(shape)}
        rows.append(row)
        try:
            problem = benchmark_problem(shape, 64, "normal")
            parts, profile = host_parts(problem)  # call, call_with_out, lookup, alloc, launch
            row.update(parts=parts, profile=profile)
            q, kv_cache, weights, context_lens, block_tables, max_model_len = problem.args
            kept = _kept_for(q, kv_cache, weights, context_lens, block_tables, max_model_len, precision="fp8")
            if kept is not None:
                out = kept.new_output()
                addresses = kept.addresses(q, weights, context_lens, block_tables, out)
                row["overlap_check_us"] = timing.host_us(lambda: kept.overlaps(addresses))
            checked = lambda: problem.call(fp8_paged_mqa_logits, precision="fp8", config=None)  # noqa: E731
            row["checked_call_us"] = timing.host_us(checked, calls=40)
            scale_check = contract._check_scales
            contract._check_scales = lambda *args: None
            try:
                row["checked_call_without_scale_check_us"] = timing.host_us(checked, calls=40)
            finally:
                contract._check_scales = scale_check
        except Exception as error:  # noqa: BLE001
            row["error"] = f"{type(error).__name__}: {error}"
            row["traceback"] = traceback.format_exc()[-2000:]
    return rows


def table(result: dict) -> str:
    t = result["tests"]
    tested = ("tests: not run here" if t is None else
              f"tests: {t.get('passed', 0)} passed, {t.get('failed', 0)} failed, {t.get('error', 0)} errors "
              f"({t.get('seconds', 0):.0f} s){'; FAILED: ' + ', '.join(t['failures']) if t.get('failures') else ''}")
    lines = [tested,
             f"{'kernel':9s} {'shape':26s} {'cache':12s} {'prec':5s} {'before us':>10s} {'now us':>10s} {'change':>8s}"]
    for r in result["kernel_rows"]:
        if "kernel" not in r:
            lines.append(f"baseline {r['baseline']}: {r['error']}")
            continue
        label = Shape(**r["shape"]).label
        cache = f"{r['block_size']} {r['layout']}"
        if "error" in r:
            lines.append(f"{r['kernel']:9s} {label:26s} {cache:12s} {r['precision']:5s} {r['error'][:80]}")
            continue
        before = f"{r['before_us']:10.1f}" if "before_us" in r else f"{'-':>10s}"
        change = f"{r['change_pct']:+7.1f}%" if "change_pct" in r else f"{'-':>8s}"
        same = {True: "", False: "  OUTPUTS DIFFER", None: ""}[r.get("bitwise_equal_to_before")]
        lines.append(f"{r['kernel']:9s} {label:26s} {cache:12s} {r['precision']:5s} {before} {r['now_us']:10.1f} "
                     f"{change}{same}")
    for r in result["host_rows"]:
        label = Shape(**r["shape"]).label
        if "error" in r:
            lines.append(f"host {label}: {r['error'][:100]}")
            continue
        p = r["parts"]
        lines.append(f"host {label}: unchecked call {p['call']:.1f} us, with out {p['call_with_out']:.1f} us "
                     f"(overlap check {r.get('overlap_check_us', float('nan')):.2f} us); checked call "
                     f"{r['checked_call_us']:.0f} us, without the scale check "
                     f"{r['checked_call_without_scale_check_us']:.0f} us")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", help="where the JSON goes")
    parser.add_argument("--baseline", help=f"a folder holding hopper.py and portable.py of commit {BASE}")
    parser.add_argument("--budget", type=float, default=170, help="seconds after which no kernel variant starts")
    parser.add_argument("--no-tests", action="store_true",
                        help="skip part 1 (where the whole test suite runs on the same GPU anyway)")
    args = parser.parse_args(argv)
    result = {"provenance": provenance("logits"), "base": BASE, "tests": None if args.no_tests else run_tests()}
    if result["tests"] is not None:
        print(json.dumps({k: v for k, v in result["tests"].items() if k != "tail"}), flush=True)
    result["kernel_rows"] = kernel_rows(args.baseline, args.budget)
    result["host_rows"] = host_rows()
    result["seconds"] = elapsed()
    Path(args.out).write_text(json.dumps(run_provenance.seal_record(result), indent=1))
    print(table(result))


if __name__ == "__main__":
    main()
