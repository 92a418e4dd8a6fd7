import importlib.util
import os
import types
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings

from preshuffle import device, report
from preshuffle.topk.portable import TopKConfig, default_config
from preshuffle.topk.hopper import HopperTopKConfig
from preshuffle.shapes import Shape
from preshuffle.testing.inputs import benchmark_problem

# Reproducible examples in CI; no deadline, since interpreter timings vary with the machine's load. On the GPU
# (benchmarks/run_hopper.sh tests) each compiled launch costs seconds: fewer examples, still reproducible.
settings.register_profile("ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", deadline=None, suppress_health_check=[HealthCheck.too_slow])
GPU_EXAMPLES = 10
settings.register_profile("gpu", max_examples=GPU_EXAMPLES, derandomize=True, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = os.environ.get("PRESHUFFLE_HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
if PROFILE not in ("ci", "dev", "gpu"):
    raise ValueError(f"PRESHUFFLE_HYPOTHESIS_PROFILE must be ci, dev or gpu, got {PROFILE!r}")
settings.load_profile(PROFILE)


def cap_examples(items, limit: int) -> None:
    """Hold every hypothesis test of ``items`` to at most ``limit`` examples, its own ``@settings`` included (a
    profile sets only the default)."""
    for item in items:
        test = getattr(item, "obj", None)
        own = getattr(test, "_hypothesis_internal_use_settings", None)  # where @given reads them at call time
        if own is not None and own.max_examples > limit:
            test._hypothesis_internal_use_settings = settings(own, max_examples=limit)


def pytest_collection_modifyitems(config, items):
    if PROFILE == "gpu":
        cap_examples(items, GPU_EXAMPLES)


@pytest.fixture
def on(monkeypatch):
    """Pretend this process runs on a GPU of a given compute capability (for what is decided before a launch; the
    kernels still run here: under the interpreter, or on this GPU)."""
    def use(capability, name):
        monkeypatch.setattr(device, "current_support", lambda: device.kernel_support(capability, name))
    return use


@pytest.fixture
def small_benchmark_problem():
    """A problem built like the benchmark's, small enough for the interpreter (3 sequences, 16 heads)."""
    return benchmark_problem(Shape(3, 2, 120), 16, "shuffle", heads=16)


ROOT = Path(__file__).resolve().parents[1]


def _load_script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_tool():
    """Load a stdlib-only script of tools/ (not a package: the Makefile and Jupyter run them by path)."""
    return lambda name: _load_script(ROOT / "tools" / f"{name}.py")


@pytest.fixture(scope="session")
def load_benchmark():
    """Load a script of benchmarks/ (run by path on the GPU machine, not part of the package)."""
    return lambda name: _load_script(ROOT / "benchmarks" / f"{name}.py")


@pytest.fixture(scope="session")
def record():
    """The committed H200 results."""
    return report.load()


@pytest.fixture
def stand_in_deepgemm():
    """A ``deep_gemm`` (version 2.5.0) that computes its logits with our kernel (exact products) and records, in
    ``calls``, the query rows and schedule slots of each call."""
    from preshuffle.kernels import fp8_paged_mqa_logits

    calls = []

    def metadata(visible, block_size, slots):
        return torch.zeros(slots + 1, 2, dtype=torch.int32, device=visible.device)

    def logits(q_pair, kv_cache, weights, visible, block_tables, schedule, max_model_len, clean, *, logits_dtype):
        calls.append((q_pair[0].shape[1], schedule.shape[0] - 1))
        return fp8_paged_mqa_logits(q_pair[0], kv_cache, weights, visible, block_tables, max_model_len,
                                    precision="exact", logits_dtype=logits_dtype)

    return types.SimpleNamespace(__version__="2.5.0", get_num_sms=lambda: 132, get_paged_mqa_logits_metadata=metadata,
                                 fp8_fp4_paged_mqa_logits=logits, calls=calls)


# The split path on inputs small enough for the interpreter: rows wider than 16 positions in segments of 64, 32
# histogram bins (the fewest tl.histogram takes), a candidate list of 32.
SMALL_SPLIT = TopKConfig(row_tile=16, row_warps=1, candidates=16, segment=64, split_warps=1, hist_bits=5,
                         split_candidates=32, final_warps=1)


@pytest.fixture(scope="session")
def small_split():
    return SMALL_SPLIT


# The sm90 kernel on small rows: one CTA of 4 warps a row (512 positions), and clusters of 2 CTAs of 2 warps (256
# positions each), with the smallest list and a ranking limit of 4, so that radix levels run on most rows.
SMALL_HOPPER = HopperTopKConfig(warps=4, vectors=1, chunks=1, cluster=1, candidates=128, rank_limit=4)
SMALL_CLUSTER = HopperTopKConfig(warps=2, vectors=1, chunks=1, cluster=2, candidates=128, rank_limit=4)


@pytest.fixture(params=["row", "split", "hopper", "hopper-cluster"])
def topk_launch(request):
    """Each top-k path for logits ``width`` positions wide (up to 512): the row path's default launch, the split
    path on small segments (for widths above 16), and the sm90 kernel, one CTA or a cluster a row (on an sm90 GPU
    only)."""
    if request.param.startswith("hopper") and not device.current_support().hopper:
        pytest.skip("the sm90 top-k kernel runs on an sm90 GPU only")
    return {"row": lambda width: default_config(width), "split": lambda width: SMALL_SPLIT,
            "hopper": lambda width: SMALL_HOPPER, "hopper-cluster": lambda width: SMALL_CLUSTER}[request.param]


def topk_shape_record(batch, ctx, logits, ours, vllm, step=None, dg_step=None, valid=1.0):
    """A shape of a benchmarks/topk_gpu.py run: ``ours`` {launch: us}, ``vllm`` {kernel: us}, one failed torch.topk."""
    rows = [{"impl": name, "us": us, "valid_rows": valid, "path": "row" if name.startswith("row") else "split"}
            for name, us in ours.items()]
    rows += [{"impl": name, "us": us, "valid_rows": 1.0} for name, us in vllm.items()]
    rows.append({"impl": "torch.topk", "error": "selection is not a top-2048 on every row", "valid_rows": 0.5})
    rows.append({"impl": "ours on bf16 logits", "us": 7.0, "valid_rows": 1.0})  # faster, but not on these logits
    steps = {k: v for k, v in (("ours (fastest launch)", step), ("deepgemm + vllm decode_topk", dg_step))
             if v is not None}
    return {"shape": {"batch": batch, "next_n": 1, "avg_ctx": ctx}, "logits_us": logits, "rows": rows,
            "steps_us": steps, "default_config": next(iter(ours)),
            "agreement": [{"precision": "fp8", "rows": 3, "min": 0.999, "mean": 0.9999, "changed_per_row": 0.2,
                           "gaps_dropped": [1e-4], "gaps_added": [-2e-4]}]}


@pytest.fixture(scope="session")
def topk_shape():
    return topk_shape_record


@pytest.fixture(scope="session")
def topk_record():
    """A synthetic top-k run of two shapes (made up, not measured)."""
    return {"provenance": {"gpu": "H200", "torch": "2.11", "triton": "3.6", "date": "d"}, "shapes": [
        topk_shape_record(1, 131072, 11.0, {"split-4k": 12.0, "split-2k": 10.0},
                          {"vllm decode_topk": 26.0, "vllm persistent_topk": 27.0, "vllm cooperative_topk": 26.0},
                          step=21.0, dg_step=40.0),
        topk_shape_record(64, 8192, 30.0, {"row-16w": 8.0},
                          {"vllm top_k_per_row_decode": 15.0, "vllm persistent_topk": 11.0}),
    ]}
