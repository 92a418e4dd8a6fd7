"""Compile the sm90 top-k kernel (``preshuffle.topk.hopper``, Gluon) for sm90a on a machine without a GPU
(Triton's bundled ptxas) and print what each launch costs: registers, stack (spills), shared memory, warps, and the
SASS instructions that carry its design: shared-memory histogram increments (``ATOMS.POPC.INC``), the warps' slot
atomics (``ATOMS.ADD``), barriers, and for clusters the cluster barrier (``UCGABAR``) and remote atomics.

    python benchmarks/compile_topk_hopper.py                       # the default launch of every benchmark shape
    python benchmarks/compile_topk_hopper.py --config '{"warps": 8, "chunks": 6, "vectors": 2}' --dtype bf16
    python benchmarks/compile_topk_hopper.py --json                # machine-readable, for tests
"""

import argparse
import json
import os

os.environ["TRITON_INTERPRET"] = "0"  # compiled, never interpreted

from preshuffle.measure import sass  # noqa: E402
from preshuffle.topk import hopper as topk_hopper  # noqa: E402

# (rows, width) of the benchmark's shapes: B*next_n rows, logits 1.3x the average context wide (64-position pages).
SHAPES = ((1, 109888), (8, 83968), (32, 83968), (64, 10624), (128, 10624), (64, 83968), (128, 41984), (256, 10624),
          (512, 83968), (4096, 10624))
OPCODES = ("ATOMS.POPC.INC", "ATOMS.ADD", "BAR.SYNC", "UCGABAR_ARV", "ATOM.E.ADD", "LDG.E.128", "STG.E")


def compile_one(config: topk_hopper.HopperTopKConfig, dtype: str = "fp32", width: int = 65536) -> dict:
    compiled = topk_hopper.compile_sm90a(config, dtype=dtype, width=width)
    text = sass._cuobjdump(compiled, "-sass")
    counts = {op: text.count(op + " ") + text.count(op + ".") for op in OPCODES}
    return {"config": topk_hopper.dataclasses.asdict(config), "dtype": dtype, **sass.resources(compiled),
            "instructions": sum(sass.instruction_counts(compiled).values()), "opcodes": counts}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", action="append", help="a HopperTopKConfig as JSON (repeatable; default: the "
                                                       "default launch of each benchmark shape)")
    ap.add_argument("--dtype", default="fp32", choices=("fp32", "bf16", "fp16"))
    ap.add_argument("--json", action="store_true", help="print every launch's resources as JSON")
    args = ap.parse_args(argv)
    elem = 4 if args.dtype == "fp32" else 2
    if args.config:
        configs = [topk_hopper.HopperTopKConfig(**json.loads(c)) for c in args.config]
    else:
        configs = list(dict.fromkeys(topk_hopper.default_config(r, w, elem) for r, w in SHAPES))
    rows = [compile_one(c, args.dtype) for c in configs]
    if args.json:
        print(json.dumps(rows))
        return
    for r in rows:
        c = r["config"]
        print(f"warps {c['warps']:2d} vectors {c['vectors']} chunks {c['chunks']:2d} cluster {c['cluster']:2d} "
              f"bits {c['bits']} | {r['registers']:3d} regs, stack {r['stack']:3d}, {r['shared']:6d} B shared, "
              f"~{r['instructions']} instructions | " + ", ".join(f"{k} {v}" for k, v in r["opcodes"].items()),
              flush=True)


if __name__ == "__main__":
    main()
