"""Host time of an unchecked call (``benchmark.host_parts``), in a process that has done nothing else, then again
after what the benchmark does before it measures host time: the call's CUDA graph timed by do_bench, and (where
``deep_gemm`` imports) DeepGEMM timed on the same inputs.

    python3 benchmarks/host_time.py OUT.json [REPEATS]

The benchmark's own host figures once came out 1.5-1.9x this script's fresh ones (notes, part 9); this puts the
two states side by side in one process."""

import json
import sys
from dataclasses import asdict

from preshuffle import deepgemm
from preshuffle.benchmark import host_parts, kernel_fn, provenance
from preshuffle.shapes import Shape
from preshuffle.testing import timing
from preshuffle.testing.inputs import benchmark_problem

SHAPES = (Shape(64, 1, 8192), Shape(1, 1, 131072))


def parts(problems, state: str, repeats: int) -> list[dict]:
    rows = []
    for shape, problem in problems.items():
        for repeat in range(repeats):
            row = {"shape": asdict(shape), "state": state, "repeat": repeat, "us": host_parts(problem)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def main(path: str, repeats: int = 3):
    problems = {shape: benchmark_problem(shape, 64, "normal") for shape in SHAPES}
    rows = parts(problems, "fresh", repeats)
    for problem in problems.values():
        timing.time_ms(kernel_fn(problem, "fp8"))
    rows += parts(problems, "after the call's graph timed", repeats)
    dg = deepgemm.load()
    if dg is not None:
        for problem in problems.values():
            timing.time_ms(deepgemm.logits_fn(dg, problem))
        rows += parts(problems, "after DeepGEMM timed", repeats)
    with open(path, "w") as f:
        json.dump({"provenance": provenance(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], *(int(x) for x in sys.argv[2:]))
