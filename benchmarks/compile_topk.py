"""Compile the top-k kernels for NVIDIA GPUs on a machine without one (Triton's bundled ptxas) and print what each
costs: registers, stack (spills), shared memory and warps of a program, and its instructions. Every GPU the
logits kernel runs on (sm80 and newer) must build every kernel.

    python benchmarks/compile_topk.py                      # the default launch, sm80 to sm100
    python benchmarks/compile_topk.py --row-tile 8192 --row-warps 8 --capability 9.0
    python benchmarks/compile_topk.py --json               # every kernel's resources, for tests
"""

import argparse
import dataclasses
import json
import os

# Compiled, never interpreted.
os.environ["TRITON_INTERPRET"] = "0"

from preshuffle.measure import sass  # noqa: E402
from preshuffle.topk import portable as topk  # noqa: E402

CAPABILITIES = ((8, 0), (8, 6), (8, 9), (9, 0), (10, 0))


def compile_all(config: topk.TopKConfig, capabilities=CAPABILITIES, dtypes=("fp32", "bf16")) -> list[dict]:
    rows = []
    for capability in capabilities:
        for dtype in dtypes:
            for name in topk.kernels(config):
                if dtype != "fp32" and name == "reduce":  # reads no logits
                    continue
                compiled = topk.compile_kernel(name, capability, config, dtype=dtype)
                ops = sass.instruction_counts(compiled)
                rows.append({"capability": list(capability), "dtype": dtype, "kernel": name,
                             **sass.resources(compiled), "instructions": sum(ops.values())})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for field in dataclasses.fields(topk.TopKConfig):
        kind = (lambda v: bool(int(v))) if isinstance(field.default, bool) else int
        ap.add_argument("--" + field.name.replace("_", "-"), type=kind, default=field.default)
    ap.add_argument("--capability", help="compute capabilities, e.g. 8.0,9.0 (default: sm80 to sm100)")
    ap.add_argument("--json", action="store_true", help="print every kernel's resources as JSON")
    args = ap.parse_args(argv)
    config = topk.TopKConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(topk.TopKConfig)})
    caps = CAPABILITIES if args.capability is None else tuple(tuple(int(v) for v in c.split("."))
                                                            for c in args.capability.split(","))
    rows = compile_all(config, caps)
    if args.json:
        print(json.dumps(rows))
        return
    for r in rows:
        sm = "sm{}{}".format(*r["capability"])
        print(f"{sm} {r['dtype']:4s} {r['kernel']:7s} | {r['registers']:3d} regs, "
              f"stack {r['stack']:4d}, {r['shared']:6d} B shared, {r['warps']:2d} warps, ~{r['instructions']} "
              f"instructions", flush=True)


if __name__ == "__main__":
    main()
