"""One launch of the Hopper kernel, or of DeepGEMM on the same inputs, for `ncu` (after a first, compiling call):

    ncu --clock-control none --launch-skip 1 --launch-count 1 -k regex:_hopper_kernel \\
        python benchmarks/ncu_hopper.py 64 2 8192 '{"row_warpgroups": true}'
    ncu --clock-control none --launch-skip 1 --launch-count 1 -k regex:sm90_fp8_paged_mqa_logits \\
        python benchmarks/ncu_hopper.py 64 2 8192 '{"kernel": "deepgemm"}'

Arguments: batch, next_n, average context, and HopperConfig fields as JSON (the launch rule's unless given);
precision fp8 and block size 64 unless the JSON names "precision" or "block_size"; "kernel": "deepgemm" runs
DeepGEMM instead (where `deep_gemm` imports)."""

import json
import sys
from dataclasses import asdict

import torch

from preshuffle import deepgemm
from preshuffle.kernels import HopperConfig, fp8_paged_mqa_logits
from preshuffle.kernels.launch import hopper_config
from preshuffle.shapes import Shape
from preshuffle.testing.inputs import benchmark_problem


def main(argv):
    batch, next_n, avg_ctx = (int(x) for x in argv[:3])
    fields = json.loads(argv[3]) if len(argv) > 3 else {}
    precision = fields.pop("precision", "fp8")
    block_size = fields.pop("block_size", 64)
    problem = benchmark_problem(Shape(batch, next_n, avg_ctx), block_size, "normal")
    if fields.pop("kernel", "hopper") == "deepgemm":
        call = deepgemm.logits_fn(deepgemm.load(), problem)
        for _ in range(2):
            call()
        torch.cuda.synchronize()
        print("done", batch, next_n, avg_ctx, "deepgemm")
        return
    rule = hopper_config(batch, next_n, exact=precision == "exact", block_size=block_size)
    config = HopperConfig(**{**asdict(rule), **fields})
    for _ in range(2):
        problem.call(fp8_paged_mqa_logits, precision=precision, check_values=False, config=config)
    torch.cuda.synchronize()
    print("done", batch, next_n, avg_ctx, precision, config)


if __name__ == "__main__":
    main(sys.argv[1:])
