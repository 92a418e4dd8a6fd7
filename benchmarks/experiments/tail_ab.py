"""The -inf tail in 512-position stores (the package's Hopper kernel) beside the same kernel with 64-position
stores (``hopper_tail64.py``, the previous commit's module, copied in for the run) and DeepGEMM, on the anchor shapes
and next_n = 3 (fp8, block 64, the launch rule's config): every row checked against the float64 reference, then
timed; new and old twice each, in the order new, old, DeepGEMM, old, new.

    python benchmarks/experiments/tail_ab.py out.json
"""

import json
import sys

from preshuffle import benchmark, deepgemm, kernels
from preshuffle.kernels import hopper, hopper_tail64
from preshuffle.reference import reference_and_magnitude
from preshuffle.shapes import ANCHOR_SHAPES, Shape
from preshuffle.testing import timing
from preshuffle.testing.inputs import benchmark_problem

KERNELS = {"wide": hopper._hopper_kernel, "tail64": hopper_tail64._hopper_kernel}


def main(out: str) -> None:
    record = {"provenance": benchmark.provenance(), "rows": []}
    copy = timing.copy_bandwidth()
    dg = deepgemm.load()
    for shape in (*ANCHOR_SHAPES, Shape(64, 3, 8192)):
        problem = benchmark_problem(shape, 64)
        reference = problem.call(reference_and_magnitude)
        for name in ("wide", "tail64", "deepgemm", "tail64", "wide"):
            if name == "deepgemm":
                if dg is None or deepgemm.refusal(problem):
                    continue
                fn = deepgemm.logits_fn(dg, problem)
            else:
                hopper._hopper_kernel = KERNELS[name]
                kernels._LAUNCHES.clear()
                fn = benchmark.kernel_fn(problem, "fp8")
            row = benchmark.measure(fn, problem, reference, precision="fp8", copy_bytes_per_s=copy,
                                    masked=name == "deepgemm")
            record["rows"].append({"shape": shape.label, "kernel": name, "us": row.get("us"),
                                   "meets_contract": row["meets_contract"],
                                   "bitwise_repeatable": row["bitwise_repeatable"]})
            print(f"{shape.label:28s} {name:10s} {row.get('us', float('nan')):8.1f} us {row['meets_contract']}",
                  flush=True)
            with open(out, "w") as f:
                json.dump(record, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
