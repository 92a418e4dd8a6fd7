"""Benchmark harness: inputs built the way the performance spec says, every variant checked against the
float64 reference before it is timed, times from ``triton.testing.do_bench`` (median, L2 flushed between
runs), and the HBM copy ceiling measured in the same run.

Counting (so figures compare with the spec's): bytes = sum(ctx) * 132 + q + weights + block table
+ sum(ctx) * next_n * 4; flops = 2 * sum(ctx) * next_n * H * D.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from dataclasses import asdict, dataclass

import torch

from . import device
from .access import VARIANTS
from .cache import SCALE_BYTES, allocate_k_cache
from .kernels import LaunchConfig, fp8_paged_mqa_logits
from .problem import kernel_args, scattered_block_tables
from .reference import check_logits, fp8_paged_mqa_logits_torch

HEADS = 64
HEAD_DIM = 128
RTOL = 1e-5  # of each logit's sum of absolute terms; see reference.compare_logits


@dataclass(frozen=True)
class Shape:
    batch: int
    next_n: int
    avg_ctx: int

    @property
    def label(self) -> str:
        return f"B={self.batch} next_n={self.next_n} ctx={self.avg_ctx}"


# The spec's anchor run on an H200 (2026-11-29): DeepGEMM 2.6.1's fp8_paged_mqa_logits, block size 64.
# Recorded numbers, cited, not measured here: (us, GB/s, % of the 4.25 TB/s copy ceiling, naive Triton us, torch us).
DEEPGEMM_H200 = {
    Shape(64, 1, 8192): (30.0, 2462, 58, 48.4, 1107),
    Shape(64, 2, 8192): (30.7, 2425, 57, 82.5, 1612),
    Shape(128, 1, 32768): (146.1, 3844, 90, 299.0, None),
    Shape(256, 1, 8192): (81.7, 3540, 83, 159.9, 4118),
    Shape(4096, 1, 8192): (1104.7, 4173, 98, 2628.0, None),
    Shape(8, 1, 65536): (30.3, 2579, 61, 50.8, 1124),
    Shape(1, 1, 131072): (14.6, 1555, 37, 20.5, 353),
    Shape(256, 2, 65536): (641.1, 3649, 86, 2233.3, None),
}
ANCHOR_SHAPES = tuple(DEEPGEMM_H200)



def build_inputs(shape: Shape, block_size: int, layout: str = "normal", *, heads: int = HEADS, seed: int = 0,
                 device_name: str | None = None) -> dict:
    """Random inputs like DeepGEMM's test: ctx_b uniform in [0.7, 1.3] x average, pages drawn from a random
    permutation of all blocks, random fp8 keys (never zeros) with positive scales, fp32 weights.

    The cache bytes are written directly (random fp8 values are valid in either layout), which keeps building
    a 4 GB cache cheap; the correctness of the writer itself is tested in tests/test_cache.py."""
    dev = torch.device(device_name or device.KERNEL_DEVICE)
    g = torch.Generator(device="cpu").manual_seed(seed)
    lo, hi = int(0.7 * shape.avg_ctx), int(1.3 * shape.avg_ctx)
    ctx = torch.randint(lo, hi + 1, (shape.batch,), generator=g, dtype=torch.int64)
    ctx = ctx.clamp(min=shape.next_n)
    blocks_per_seq = (ctx + block_size - 1) // block_size
    num_blocks = int(blocks_per_seq.sum())
    max_blocks = int(blocks_per_seq.max())
    block_tables = scattered_block_tables(blocks_per_seq.tolist(), num_blocks, max_blocks, g)

    gd = torch.Generator(device=dev).manual_seed(seed + 1)
    kv_cache = allocate_k_cache(num_blocks, block_size, HEAD_DIM, device=dev)
    flat = kv_cache.view(num_blocks, -1)
    value_bytes = block_size * HEAD_DIM
    step = max(1, (1 << 27) // value_bytes)  # fill in slices of ~128 MB of fp32 temporaries
    for first in range(0, num_blocks, step):
        last = min(num_blocks, first + step)
        values = torch.randn(last - first, value_bytes, generator=gd, device=dev).to(torch.float8_e4m3fn)
        flat[first:last, :value_bytes] = values.view(torch.uint8)
        scales = torch.rand(last - first, block_size, generator=gd, device=dev) * 1e-2 + 1e-3
        flat[first:last, value_bytes:] = scales.view(torch.uint8).view(last - first, -1)
    q = torch.randn(shape.batch, shape.next_n, heads, HEAD_DIM, generator=gd, device=dev).to(torch.float8_e4m3fn)
    weights = torch.randn(shape.batch * shape.next_n, heads, generator=gd, device=dev)
    max_model_len = int(ctx.max())
    return {
        "q": q, "kv_cache": kv_cache, "weights": weights, "context_lens": ctx.to(torch.int32).to(dev),
        "block_tables": block_tables.to(dev), "max_model_len": max_model_len, "layout": layout,
        "sum_ctx": int(ctx.sum()),
    }


def count_bytes(inputs: dict) -> int:
    q, w, bt = inputs["q"], inputs["weights"], inputs["block_tables"]
    next_n, head_dim = q.shape[1], q.shape[3]
    token_bytes = head_dim + SCALE_BYTES
    return (inputs["sum_ctx"] * token_bytes + q.numel() * q.element_size() + w.numel() * 4 + bt.numel() * 4
            + inputs["sum_ctx"] * next_n * 4)


def count_flops(inputs: dict) -> int:
    _, next_n, heads, head_dim = inputs["q"].shape
    return 2 * inputs["sum_ctx"] * next_n * heads * head_dim


def check(out: torch.Tensor, inputs: dict) -> dict:
    """Compare with the float64 reference on the same fp8 inputs."""
    return check_logits(out, *kernel_args(inputs), layout=inputs["layout"])


def _require_gpu() -> None:
    if device.INTERPRETED:
        raise RuntimeError("refusing to time Triton's interpreter: interpreter timings are not kernel timings")


def time_ms(fn, *, graph: bool = True, warmup: int = 25, rep: int = 100) -> float:
    """Median milliseconds of ``fn`` by ``triton.testing.do_bench``, which flushes L2 before every run.

    With ``graph`` the call is captured once in a CUDA graph and its replays are timed, so the figure is the
    kernel's, not Python's launch overhead (vLLM runs decode under CUDA graphs too)."""
    _require_gpu()
    import triton.testing
    if graph:
        fn()  # compile outside the capture
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        fn = g.replay
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def copy_bandwidth(nbytes: int = 4 << 30) -> float:
    """The HBM ceiling: a large device-to-device copy, bytes read + written per second."""
    _require_gpu()
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = time_ms(lambda: dst.copy_(src), graph=False, rep=200)
    return 2 * nbytes / (ms * 1e-3)


def measure(fn, inputs: dict, *, copy_bytes_per_s: float, graph: bool = True, require_accuracy: bool = True,
            checked: tuple | None = None) -> dict:
    """Check ``fn`` against the float64 reference, then time it (unless it fails and ``require_accuracy``).

    ``checked = (output, verdict)`` of an already verified run of the same function (another split of the same
    kernel): then ``fn`` must reproduce that output bit for bit, which is cheaper than a second reference."""
    out = fn()
    if checked is None:
        verdict = check(out, inputs)
        verdict["meets_rtol"] = verdict["same_inf_pattern"] and verdict["max_rel_error"] <= RTOL
    else:
        reference_out, reference_verdict = checked
        same = bool(torch.equal(out, reference_out))
        verdict = {**reference_verdict, "meets_rtol": reference_verdict["meets_rtol"] and same,
                   "bitwise_equal_to_checked_split": same}
    verdict["bitwise_repeatable"] = bool(torch.equal(out, fn()))
    if require_accuracy and not verdict["meets_rtol"]:
        return verdict
    ms = time_ms(fn, graph=graph)
    nbytes, flops = count_bytes(inputs), count_flops(inputs)
    return {**verdict, "us": ms * 1e3, "bytes": nbytes, "gb_per_s": nbytes / (ms * 1e-3) / 1e9,
            "pct_copy": 100 * nbytes / (ms * 1e-3) / copy_bytes_per_s, "tflop_per_s": flops / (ms * 1e-3) / 1e12}


def measure_splits(inputs: dict, configs: list[LaunchConfig], *, copy_bytes_per_s: float) -> list[dict]:
    """Measure configs of one compiled kernel that differ only in how the work is split: the first is checked
    against the float64 reference, the others must reproduce its output bit for bit."""
    rows, checked = [], None
    for config in configs:
        fn = kernel_fn(inputs, config)
        row = measure(fn, inputs, copy_bytes_per_s=copy_bytes_per_s, checked=checked)
        if checked is None:
            checked = (fn(), {k: row[k] for k in ("same_inf_pattern", "max_rel_error", "finite", "meets_rtol")})
        rows.append(row)
    return rows


def kernel_fn(inputs: dict, config: LaunchConfig | None = None):
    args = kernel_args(inputs)
    return lambda: fp8_paged_mqa_logits(*args, layout=inputs["layout"], check_values=False, config=config)


def torch_fn(inputs: dict):
    args = kernel_args(inputs)
    return lambda: fp8_paged_mqa_logits_torch(*args, layout=inputs["layout"])


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

    from .tuning import config_for, default_programs_per_sm

    _require_gpu()
    record = {"provenance": provenance(), "copy_bytes_per_s": copy_bandwidth(), "rtol": RTOL, "rows": []}
    ceiling = record["copy_bytes_per_s"]
    jobs = [(shape, name) for shape in shapes for name in variants]
    for shape, name in tqdm(jobs, desc="shapes x variants"):
        block_size, layout = VARIANTS[name]
        inputs = build_inputs(shape, block_size, layout)
        rule = default_programs_per_sm(shape.batch)
        splits = (rule, *(p for p in programs_per_sm if p != rule))
        configs = [config_for(shape.batch, inputs["max_model_len"], programs_per_sm=pps) for pps in splits]
        rows = [{"kind": "kernel", "programs_per_sm": pps, "rule": pps == rule, "config": config_record(config), **row}
                for pps, config, row in zip(splits, configs,
                                            measure_splits(inputs, configs, copy_bytes_per_s=ceiling))]
        if fp8_mma and name == "block64-normal":
            for dot in ("fp8", "fp8-acc32"):
                config = config_for(shape.batch, inputs["max_model_len"], dot=dot)
                rows.append({"kind": f"kernel-{dot}-mma", "programs_per_sm": rule, "rule": True,
                             "config": config_record(config),
                             **measure(kernel_fn(inputs, config), inputs, copy_bytes_per_s=ceiling,
                                       require_accuracy=False)})
        if torch_baseline and name == "block64-normal" and torch_baseline_fits(shape):
            rows.append({"kind": "torch", **measure(torch_fn(inputs), inputs, copy_bytes_per_s=ceiling,
                                                    graph=False)})
        for row in rows:
            row.update(shape=asdict(shape), variant=name)
            record["rows"].append(row)
            if on_row:
                on_row(record, row)
        del inputs
        torch.cuda.empty_cache()
    return record
