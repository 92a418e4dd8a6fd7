"""Compile the Hopper kernel for sm90a on a machine without a GPU and print what each variant costs: registers,
stack (spills), shared memory and warps of a program, the programs an SM's registers hold, and its tensor-core,
shared-memory and copy (TMA, cp.async) instructions. What the launch rule and HopperConfig choose can be checked
here, before a GPU runs anything.

    python benchmarks/compile_hopper.py
    python benchmarks/compile_hopper.py --next-n 3 --row-warpgroups --maxnreg 64
    python benchmarks/compile_hopper.py --json      # every variant's resources (or the one asked for), for tests
    python benchmarks/compile_hopper.py --outputs   # fp32/bf16 logits x with/without the -inf fill, every cache
                                                    # and next_n 1-4, under the launch rule's warpgroups
"""

import argparse
import json
import os

# Compiled, never interpreted: under TRITON_INTERPRET=1 Triton's own jit helpers, which Gluon calls, are interpreted.
os.environ["TRITON_INTERPRET"] = "0"

from preshuffle.kernels import HopperConfig, hopper  # noqa: E402
from preshuffle.measure import sass  # noqa: E402
from preshuffle.kernels.launch import REGISTERS_PER_SM  # noqa: E402

VARIANTS = [  # (next_n, block_size, layout, exact, row_warpgroups): the anchor shapes' paths
    (1, 64, "normal", False, False), (2, 64, "normal", False, False), (3, 64, "normal", False, True),
    (1, 64, "normal", True, False), (3, 64, "normal", True, True), (1, 16, "normal", False, False),
    (1, 64, "shuffle", False, False), (2, 16, "shuffle", False, False), (1, 1, "normal", False, False),
    (3, 1, "normal", True, True)]


# The caches the output options are compiled on: natural pages of 16 and 64 tokens, preshuffled ones, and the
# gather (block 1).
OUTPUT_CACHES = ((16, "normal"), (64, "normal"), (16, "shuffle"), (64, "shuffle"), (1, "normal"))


def output_variants() -> list[dict]:
    """Every combination of the output options (bf16 logits, no -inf fill) on :data:`OUTPUT_CACHES` at next_n 1-4,
    fp8, with the launch rule's choice of a math warpgroup per row (next_n 3)."""
    return [dict(next_n=next_n, block_size=block_size, layout=layout, exact=False, row_warpgroups=next_n == 3,
                 bf16=bf16, clean=clean)
            for bf16 in (False, True) for clean in (True, False) for block_size, layout in OUTPUT_CACHES
            for next_n in (1, 2, 3, 4)]


def compile_variant(next_n, block_size, layout, exact, row_warpgroups, maxnreg=None, stages=4, *, bf16=False,
                    clean=True, row_groups=1) -> dict:
    config = HopperConfig(1, stages, maxnreg, row_warpgroups=row_warpgroups, row_groups=row_groups)
    compiled = hopper.compile_sm90a(next_n, block_size=block_size, layout=layout, exact=exact, config=config,
                                    clean=clean, bf16=bf16)
    ops = sass.instruction_counts(compiled)
    return {"variant": [next_n, block_size, layout, exact, row_warpgroups], "bf16": bf16, "clean": clean,
            "row_groups": row_groups,
            **sass.resources(compiled),
            "gmma": ops["HGMMA"] + ops["QGMMA"], "lds": ops["LDS"], "sts": ops["STS"], "bar": ops["BAR"],
            "ldsm": ops["LDSM"], "tma": ops["UTMALDG"],
            "cp_async": ops["LDGSTS"]}


def line(r: dict) -> str:
    next_n, block_size, layout, exact, row_warpgroups = r["variant"]
    programs = REGISTERS_PER_SM // (r["registers"] * 32 * r["warps"])
    outputs = f"{'bf16' if r.get('bf16') else 'fp32'} {'clean' if r.get('clean', True) else 'unclean'}"
    return (f"next_n {next_n} block {block_size:2d} {layout:7s} {'exact' if exact else 'fp8':5s} "
            f"rows {'yes' if row_warpgroups else 'no ':3s} groups {r.get('row_groups', 1)} {outputs:12s} | "
            f"{r['registers']:3d} regs, "
            f"stack {r['stack']:3d}, "
            f"{r['shared']:6d} B shared, {r['warps']:2d} warps, {programs} programs/SM by registers | "
            f"GMMA {r['gmma']:2d}, LDS {r['lds']:3d}, LDSM {r['ldsm']:2d}, TMA {r['tma']}, cp.async {r['cp_async']:2d}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--next-n", type=int)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--layout", choices=["normal", "shuffle"], default="normal")
    ap.add_argument("--exact", action="store_true")
    ap.add_argument("--row-warpgroups", action="store_true")
    ap.add_argument("--row-groups", type=int, default=1, help="programs a sequence's query rows are cut into")
    ap.add_argument("--maxnreg", type=int)
    ap.add_argument("--stages", type=int, default=4)
    ap.add_argument("--bf16", action="store_true", help="bf16 logits instead of fp32")
    ap.add_argument("--unclean", action="store_true", help="no -inf fill past the context (clean_logits=False)")
    ap.add_argument("--json", action="store_true", help="print every variant's resources as JSON")
    ap.add_argument("--outputs", action="store_true",
                    help="compile every combination of the output options (with --json: as JSON)")
    args = ap.parse_args(argv)
    if args.outputs:
        results = []
        for variant in output_variants():
            results.append(compile_variant(**variant, stages=args.stages))
            if not args.json:
                print(line(results[-1]), flush=True)
        if args.json:
            print(json.dumps(results))
    elif args.next_n is not None:
        one = compile_variant(args.next_n, args.block_size, args.layout, args.exact, args.row_warpgroups,
                              args.maxnreg, args.stages, bf16=args.bf16, clean=not args.unclean,
                              row_groups=args.row_groups)
        print(json.dumps(one) if args.json else line(one))
    elif args.json:
        print(json.dumps([compile_variant(*variant, stages=args.stages) for variant in VARIANTS]))
    else:
        for variant in VARIANTS:
            print(line(compile_variant(*variant, stages=args.stages)), flush=True)


if __name__ == "__main__":
    main()
