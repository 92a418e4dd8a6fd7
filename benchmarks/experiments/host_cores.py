"""Is a slow spell of the lent host its core or the whole machine? The timed thread pinned to each CPU in turn:
the fixed Python loop's time (``testing.timing.host_profile``'s gauge of the host's speed) and the unchecked
call's host time at B=64 (``benchmark.host_parts``), with each CPU's SMT siblings and clock as Linux reports them.

    python3 benchmarks/experiments/host_cores.py OUT.json
"""

import json
import os
import statistics
import sys
import time

from preshuffle.benchmark import host_parts, provenance
from preshuffle.shapes import Shape
from preshuffle.testing import timing
from preshuffle.testing.inputs import benchmark_problem


def loop_us(samples: int = 200) -> float:
    times = []
    for _ in range(samples):
        start = time.perf_counter()
        timing._python_loop()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def main(path: str):
    problem = benchmark_problem(Shape(64, 1, 8192), 64, "normal")
    host_parts(problem)  # compile and keep the launch
    cpus = sorted(os.sched_getaffinity(0))
    rows = []
    for cpu in cpus + cpus[:1]:  # the first CPU again last: did the machine's speed drift meanwhile?
        os.sched_setaffinity(0, {cpu})
        parts, profile = host_parts(problem)
        row = {"cpu": cpu, "loop_us": loop_us(), "call_us": parts["call"], "launch_us": parts.get("launch"),
               "profile_loop_us": profile["python_loop_us"],
               "siblings": read(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list"),
               "khz": read(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_cur_freq")}
        print(json.dumps(row), flush=True)
        rows.append(row)
    os.sched_setaffinity(0, set(cpus))
    with open(path, "w") as f:
        json.dump({"provenance": provenance(), "loadavg": read("/proc/loadavg"), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
