"""Compare compiled launch configurations of the kernel on chosen anchor shapes (H200), to set the rule in
preshuffle/tuning.py. Every configuration is checked against the float64 reference before it is timed.

    python benchmarks/tune.py --out tune.json --shapes 0 2 4 --variants block64-normal \\
        --configs '{"chunk": 64, "num_warps": 4, "num_stages": 5}' '{"chunk": 64, "num_warps": 4, "num_stages": 1, "register_prefetch": true}'
"""

import argparse
import json

import torch
from tqdm import tqdm

from preshuffle import bench
from preshuffle.access import VARIANTS
from preshuffle.tuning import config_for


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", type=int, nargs="+", required=True, help="indices into bench.ANCHOR_SHAPES")
    ap.add_argument("--variants", nargs="+", default=["block64-normal"])
    ap.add_argument("--configs", nargs="+", required=True, help="LaunchConfig fields as JSON")
    ap.add_argument("--programs-per-sm", type=int, nargs="+", default=[1, 4, 8, 16])
    args = ap.parse_args()
    record = {"provenance": bench.provenance(), "copy_bytes_per_s": bench.copy_bandwidth(), "rows": []}
    jobs = [(bench.ANCHOR_SHAPES[i], v) for i in args.shapes for v in args.variants]
    for shape, variant in tqdm(jobs):
        inputs = bench.build_inputs(shape, *VARIANTS[variant])
        for fields in args.configs:
            fields = json.loads(fields)
            configs = [config_for(shape.batch, inputs["max_model_len"], programs_per_sm=pps, **fields)
                       for pps in args.programs_per_sm]
            rows = bench.measure_splits(inputs, configs, copy_bytes_per_s=record["copy_bytes_per_s"])
            for pps, row in zip(args.programs_per_sm, rows):
                record["rows"].append({"shape": shape.label, "variant": variant, "pps": pps, "config": fields, **row})
                print(f"{shape.label:28s} {variant:15s} {json.dumps(fields):70s} pps {pps:2d} "
                      f"{row.get('us', float('nan')):9.1f} us {row.get('pct_copy', 0):5.1f}%", flush=True)
        del inputs
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)


if __name__ == "__main__":
    main()
