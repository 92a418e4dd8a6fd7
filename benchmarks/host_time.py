"""Host time of an unchecked call (``benchmark.host_parts``) in one process through the states the benchmark passes
before it measures host time: fresh, after the call's CUDA graph was timed by do_bench, after the plain call was
timed back to back (the benchmark's eager row), and (where ``deep_gemm`` imports) after DeepGEMM was timed on the
same inputs.

    python3 benchmarks/host_time.py OUT.json [REPEATS]

The benchmark's own host figures can come out well above this script's (docs/kernel-design.md, "Host path"); the
state after the eager timing was added after the run of results/h200-host-time.json, which did not pass through it. The
script also times Triton's C launcher on a kernel of one pointer argument (``one_argument_launch``): the floor of
any launch through it, most of it the driver's. Each row's ``profile`` (``testing.timing.host_profile``) is that of its
``call`` measurement: what the host did meanwhile (the timed thread's share of the CPU, its preemptions, the other
threads' CPU time, a fixed Python loop's time). results/h200-host-time.json (f438412) profiled its rows in
a second measurement of the call."""

import json
import sys
from dataclasses import asdict

import torch
import triton
import triton.language as tl

from preshuffle import deepgemm
from preshuffle import provenance as run_provenance
from preshuffle.benchmark import host_parts, kernel_fn, provenance
from preshuffle.shapes import Shape
from preshuffle.testing import timing
from preshuffle.testing.inputs import benchmark_problem

SHAPES = (Shape(64, 1, 8192), Shape(1, 1, 131072))


def parts(problems, state: str, repeats: int) -> list[dict]:
    rows = []
    for shape, problem in problems.items():
        for repeat in range(repeats):
            us, profile = host_parts(problem)
            row = {"shape": asdict(shape), "state": state, "repeat": repeat, "us": us, "profile": profile}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


@triton.jit
def _one_store(ptr):
    tl.store(ptr, 1.0)


def one_argument_launch_us() -> float:
    x = torch.empty(1, device="cuda")
    compiled = _one_store[(1,)](x)
    raw = compiled.run.launch  # the C launcher: no descriptor arguments to wrap
    head = (compiled.function, False, False, None, None, compiled.packed_metadata, None, None, None)
    address = x.data_ptr()
    return timing.host_us(lambda: raw(1, 1, 1, torch._C._cuda_getCurrentRawStream(0), *head, address))


def main(path: str, repeats: int = 3):
    problems = {shape: benchmark_problem(shape, 64, "normal") for shape in SHAPES}
    rows = parts(problems, "fresh", repeats)
    floor = [one_argument_launch_us() for _ in range(repeats)]
    print("one-argument launch", floor, flush=True)
    for problem in problems.values():
        timing.time_ms(kernel_fn(problem, "fp8"))
    rows += parts(problems, "after the call's graph timed", repeats)
    # The eager row: plain calls back to back, a queue of launches the host waits on.
    for problem in problems.values():
        timing.time_ms(kernel_fn(problem, "fp8"), graph=False)
    rows += parts(problems, "after the plain call timed", repeats)
    dg = deepgemm.load()
    if dg is not None:
        for problem in problems.values():
            timing.time_ms(deepgemm.logits_fn(dg, problem))
        rows += parts(problems, "after DeepGEMM timed", repeats)
    with open(path, "w") as f:
        json.dump(run_provenance.seal_record({"provenance": provenance("logits"), "one_argument_launch_us": floor,
                                              "rows": rows}), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], *(int(x) for x in sys.argv[2:]))
