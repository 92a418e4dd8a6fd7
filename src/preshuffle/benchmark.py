"""The benchmark: every kernel variant checked against the float64 reference before it is timed, on inputs
built the way the performance spec says (:func:`preshuffle.testing.inputs.benchmark_problem`), times and the
copy ceiling of the same run from :mod:`preshuffle.testing.timing`, bytes and flops counted by
:class:`preshuffle.problem.PagedMQAProblem`, and the run's provenance.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from dataclasses import asdict

import torch

from .kernels import LaunchConfig, fp8_paged_mqa_logits
from .kernels.launch import config_for, default_programs_per_sm
from .problem import PagedMQAProblem
from .reference import fp8_paged_mqa_logits_torch
from .shapes import ANCHOR_SHAPES, VARIANTS, Shape
from .testing import timing
from .testing.inputs import HEAD_DIM, HEADS, benchmark_problem
from .testing.numeric import RTOL, check_logits, check_repeatable


def measure(fn, problem: PagedMQAProblem, *, copy_bytes_per_s: float, graph: bool = True,
            require_accuracy: bool = True, checked: tuple | None = None) -> dict:
    """Check ``fn`` against the float64 reference and for bitwise repeatability, then time it (unless it fails
    and ``require_accuracy``).

    ``checked = (output, verdict)`` of an already verified run of the same function (another split of the same
    kernel): then ``fn`` must reproduce that output bit for bit, which is cheaper than a second reference."""
    try:
        out, repeatable = check_repeatable(fn), True
    except AssertionError:
        out, repeatable = fn(), False
    if checked is None:
        verdict = check_logits(out, problem)
        verdict["meets_rtol"] = verdict["same_inf_pattern"] and verdict["max_rel_error"] <= RTOL
    else:
        reference_out, reference_verdict = checked
        same = bool(torch.equal(out, reference_out))
        verdict = {**reference_verdict, "meets_rtol": reference_verdict["meets_rtol"] and same,
                   "bitwise_equal_to_checked_split": same}
    verdict["bitwise_repeatable"] = repeatable
    if require_accuracy and not verdict["meets_rtol"]:
        return verdict
    ms = timing.time_ms(fn, graph=graph)
    nbytes, flops = problem.bytes, problem.flops
    return {**verdict, "us": ms * 1e3, "bytes": nbytes, "gb_per_s": nbytes / (ms * 1e-3) / 1e9,
            "pct_copy": 100 * nbytes / (ms * 1e-3) / copy_bytes_per_s, "tflop_per_s": flops / (ms * 1e-3) / 1e12}


def measure_splits(problem: PagedMQAProblem, configs: list[LaunchConfig], *, copy_bytes_per_s: float) -> list[dict]:
    """Measure configs of one compiled kernel that differ only in how the work is split: the first is checked
    against the float64 reference, the others must reproduce its output bit for bit."""
    rows, checked = [], None
    for config in configs:
        fn = kernel_fn(problem, config)
        row = measure(fn, problem, copy_bytes_per_s=copy_bytes_per_s, checked=checked)
        if checked is None:
            checked = (fn(), {k: row[k] for k in ("same_inf_pattern", "max_rel_error", "finite", "meets_rtol")})
        rows.append(row)
    return rows


def kernel_fn(problem: PagedMQAProblem, config: LaunchConfig | None = None):
    return lambda: problem.call(fp8_paged_mqa_logits, check_values=False, config=config)


def torch_fn(problem: PagedMQAProblem):
    return lambda: problem.call(fp8_paged_mqa_logits_torch)


def torch_baseline_fits(shape: Shape, limit_bytes: int = 24 << 30) -> bool:
    """The vectorised baseline materialises fp32 keys and scores for the longest context of every sequence."""
    n = int(1.3 * shape.avg_ctx)
    return shape.batch * n * (HEAD_DIM + 2 * shape.next_n * HEADS) * 4 < limit_bytes


def provenance() -> dict:
    import triton

    def git(*args):
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    # A copy of the tree without .git (a lent GPU machine) names its commit through the environment.
    commit = git("rev-parse", "HEAD")
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit or os.environ.get("PRESHUFFLE_GIT_COMMIT"),
        "git_dirty": bool(git("status", "--porcelain")) if commit else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, sms=props.multi_processor_count, cuda=torch.version.cuda,
                    driver=_driver_version())
    return info


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return None


def config_record(config: LaunchConfig | None) -> dict | None:
    return asdict(config) if config else None


PROGRAMS_PER_SM_SWEEP = (1, 2, 4, 8, 16)


def run(shapes=ANCHOR_SHAPES, variants=tuple(VARIANTS), *, programs_per_sm=PROGRAMS_PER_SM_SWEEP,
        torch_baseline: bool = True, fp8_mma: bool = True, on_row=None) -> dict:
    """The whole measurement: copy ceiling, then for every shape and variant the reference check and the
    time of each split (``programs_per_sm``), the vectorised PyTorch baseline where it fits, and, for the record,
    the same kernel on fp8 tensor-core MMAs (faster, but outside the 1e-5 accuracy contract on Hopper)."""
    from tqdm.auto import tqdm

    timing.refuse_interpreter()
    record = {"provenance": provenance(), "copy_bytes_per_s": timing.copy_bandwidth(), "rtol": RTOL, "rows": []}
    ceiling = record["copy_bytes_per_s"]
    jobs = [(shape, name) for shape in shapes for name in variants]
    for shape, name in tqdm(jobs, desc="shapes x variants"):
        block_size, layout = VARIANTS[name]
        problem = benchmark_problem(shape, block_size, layout)
        rule = default_programs_per_sm(shape.batch)
        splits = (rule, *(p for p in programs_per_sm if p != rule))
        configs = [config_for(shape.batch, problem.max_model_len, programs_per_sm=pps) for pps in splits]
        rows = [{"kind": "kernel", "programs_per_sm": pps, "rule": pps == rule, "config": config_record(config), **row}
                for pps, config, row in zip(splits, configs,
                                            measure_splits(problem, configs, copy_bytes_per_s=ceiling))]
        if fp8_mma and name == "block64-normal":
            for dot in ("fp8", "fp8-acc32"):
                config = config_for(shape.batch, problem.max_model_len, dot=dot)
                rows.append({"kind": f"kernel-{dot}-mma", "programs_per_sm": rule, "rule": True,
                             "config": config_record(config),
                             **measure(kernel_fn(problem, config), problem, copy_bytes_per_s=ceiling,
                                       require_accuracy=False)})
        if torch_baseline and name == "block64-normal" and torch_baseline_fits(shape):
            rows.append({"kind": "torch", **measure(torch_fn(problem), problem, copy_bytes_per_s=ceiling,
                                                    graph=False)})
        for row in rows:
            row.update(shape=asdict(shape), variant=name)
            record["rows"].append(row)
            if on_row:
                on_row(record, row)
        del problem
        torch.cuda.empty_cache()
    return record
