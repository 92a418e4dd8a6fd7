"""The sm90 top-k kernel (preshuffle.topk.hopper): its launch options, its default launch, its algorithm's
step-by-step model (preshuffle.topk.radix) against the float64 reference on every path, the kernel compiled for
sm90a without a GPU, and on an sm90 GPU the kernel itself against the reference."""

import json
import math
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from preshuffle import device
from preshuffle.topk import hopper as topk_hopper, smem_ptx
from preshuffle.topk.portable import TopKConfig
from preshuffle.topk.hopper import MAX_K, HopperTopKConfig, default_config
from preshuffle.topk.selection import indexer_topk, is_top_k, topk_launch, topk_reference
from preshuffle.topk.radix import fp16_keys, fp32_keys, select

HOPPER = device.current_support().hopper
needs_hopper = pytest.mark.skipif(not HOPPER, reason="the sm90 top-k kernel runs on an sm90 GPU only")
NAN, INF = math.nan, math.inf


def as_sets(selection):
    return [set(row) - {-1} for row in selection.tolist()]


# ------------------------------------------------------------------------------------------------------------------
# Launch options


@pytest.mark.parametrize("field, value, error, match", [
    ("warps", 3, ValueError, "warps must be a power of two up to 32"),
    ("warps", 64, ValueError, "warps must be a power of two up to 32"),
    ("warps", 4.0, TypeError, "warps must be a positive int"),
    ("vectors", 3, ValueError, "vectors must be a power of two up to 16"),
    ("chunks", 0, ValueError, "chunks must be a positive int"),
    ("chunks", 65, ValueError, r"chunks must be in \[1, 64\]"),
    ("cluster", 3, ValueError, "cluster must be one of"),
    ("cluster", 32, ValueError, "cluster must be one of"),
    ("bits", 10, ValueError, r"bits must be in \[11, 13\]"),
    ("bits", True, TypeError, "bits must be a positive int"),
    ("candidates", 96, ValueError, "candidates must be a power of two in"),
    ("candidates", 512, ValueError, r"candidates must be a power of two in \[max\(128, 32 \* warps\)"),
    ("rank_limit", 0, ValueError, "rank_limit must be a positive int"),
    ("rank_limit", 2000, ValueError, r"rank_limit must be in \[1, 960\] \(the list's capacity"),
    ("eager", 1, TypeError, "eager must be a bool"),
    ("registers", 16, ValueError, r"registers must be 0 \(the compiler's choice\) or in \[24, 255\]"),
    ("registers", 64.0, ValueError, "registers must be 0"),
])
def test_hopper_config_refuses_launches_the_kernel_cannot_run(field, value, error, match):
    base = dict(warps=32, candidates=1024)
    if field == "candidates" and value == 512:
        base["warps"] = 32  # 512 < 32 * 32 threads
    with pytest.raises(error, match=match):
        HopperTopKConfig(**{**base, field: value})


def test_the_ranking_leaves_the_list_8_slots_to_read_past_its_last_candidate():
    HopperTopKConfig(warps=8, candidates=512, rank_limit=504)
    with pytest.raises(ValueError, match=r"rank_limit must be in \[1, 504\]"):
        HopperTopKConfig(warps=8, candidates=512, rank_limit=505)


def test_the_list_shares_its_end_with_the_control_words_only_where_the_buffer_is_full():
    # 4096 bins and two lists of 1024 fill 8192 words exactly: the control words take the last 64 slots.
    assert HopperTopKConfig(bits=12, candidates=1024).shared_words() == 8192
    assert HopperTopKConfig(bits=12, candidates=1024).capacity() == 960
    assert HopperTopKConfig(warps=8, bits=12, candidates=512).capacity() == 512
    assert HopperTopKConfig(bits=11, candidates=1024).shared_words() == 8192


@pytest.mark.parametrize("rows", [1, 8, 32, 64, 128, 256, 512, 4096])
@pytest.mark.parametrize("width", [64, 2048, 10624, 41984, 83968, 109888, 163840])
@pytest.mark.parametrize("elem", [4, 2])
def test_default_launch_covers_the_width_and_fills_the_gpu(rows, width, elem):
    config = default_config(rows, width, elem)
    assert config.reach(elem) >= width
    assert config.cluster <= topk_hopper.DEFAULT_CLUSTER
    per_thread = config.segment(elem) // (32 * config.warps)
    rounding = config.vectors * 16 // elem  # a chunk's rounding
    if config.cluster < topk_hopper.DEFAULT_CLUSTER:
        assert per_thread <= topk_hopper.MAX_PER_THREAD + rounding  # no thread holds more
        if rows * config.cluster * 2 <= topk_hopper.SMS * topk_hopper.RESIDENT[config.warps]:  # twice the CTAs would still fit at once
            assert per_thread <= topk_hopper.SPREAD_PER_THREAD + rounding
    if rows * 4 <= topk_hopper.SMS and width >= 8192 * 2:
        assert config.cluster > 1  # few long rows share the SMs
    if rows > topk_hopper.SMS:
        assert config.warps < 32  # several CTAs a multiprocessor, their registers capped to fit
        assert config.registers * 32 * config.warps * topk_hopper.RESIDENT[config.warps] <= 65536
    assert config.bits == (12 if config.warps == 32 else 11)
    assert config.eager


def test_the_dispatch_takes_the_sm90_kernel_on_hopper_only():
    sm90, cpu = device.kernel_support((9, 0)), device.kernel_support(None)
    assert isinstance(topk_launch(64, 10624, 2048, support=sm90), HopperTopKConfig)
    assert isinstance(topk_launch(64, 10624, 2048, torch.bfloat16, support=sm90), HopperTopKConfig)
    assert isinstance(topk_launch(64, 10624, 2048, support=cpu), TopKConfig)
    assert isinstance(topk_launch(64, 10624, MAX_K + 1, support=sm90), TopKConfig)  # k past its counters
    assert isinstance(topk_launch(64, 10624, 2048), HopperTopKConfig if HOPPER else TopKConfig)


@pytest.mark.skipif(HOPPER, reason="checks the refusal where the sm90 kernel cannot run")
def test_a_hopper_launch_is_refused_where_it_cannot_run():
    logits = torch.randn(2, 64, device=device.KERNEL_DEVICE)
    ctx = torch.tensor([64, 30], dtype=torch.int32, device=device.KERNEL_DEVICE)
    with pytest.raises(ValueError, match="config is a HopperTopKConfig, for the sm90 kernel"):
        indexer_topk(logits, ctx, 8, config=HopperTopKConfig(warps=4, chunks=1, candidates=128, rank_limit=64))


def test_a_compiled_kernel_with_scratch_beside_its_buffer_is_refused():
    fake = types.SimpleNamespace(metadata=types.SimpleNamespace(shared=8192 * 4 + 16, name="k"))
    with pytest.raises(RuntimeError, match="Triton allocated scratch beside it"):
        smem_ptx.check_single_allocation(fake, 8192)
    smem_ptx.check_single_allocation(types.SimpleNamespace(metadata=types.SimpleNamespace(shared=4096, name="k")),
                                     1024)


# ------------------------------------------------------------------------------------------------------------------
# The algorithm, step by step, on the CPU


def test_fp16_keys_order_as_the_values_with_zeros_and_nan_tied_below():
    x = torch.tensor([-INF, -65504.0, -1.0, -1e-30, -0.0, 0.0, 1e-30, 0.5, 1.0, 70000.0, INF, NAN])
    keys = fp16_keys(x)
    assert (keys[1:-1] >= keys[:-2]).all()              # never reversed
    assert keys[4] == keys[5] and keys[-1] == keys[0]   # -0.0 is +0.0, NaN is -inf
    assert keys.min() > 0                               # no logit has key 0, the kernel's mark of a missing one
    f32 = fp32_keys(x)
    assert f32[-1] < f32[0] and f32[4] == f32[5] and (f32[1:-1] > f32[:-2]).sum() == len(x) - 3


def rows_of_every_kind(seed):
    g = torch.Generator().manual_seed(seed)
    n = 6000
    yield "normal", torch.randn(n, generator=g) * 3
    yield "ties", torch.randint(-3, 4, (n,), generator=g).float()
    yield "bf16", (torch.randn(n, generator=g) * 3).bfloat16().float()
    specials = torch.randn(n, generator=g)
    specials[torch.randint(0, n, (n // 4,), generator=g)] = NAN
    specials[:500] = -INF
    specials[500:700] = -0.0
    specials[700:900] = 0.0
    yield "specials", specials
    yield "one fp16 bucket", 1000 + torch.randn(n, generator=g) * 1e-3
    yield "all equal", torch.full((n,), 2.5)


@pytest.mark.parametrize("bits, capacity, rank_limit", [(12, 960, 128), (11, 448, 448), (12, 960, 1), (12, 64, 16),
                                                       (13, 16, 1)])
def test_the_kernels_algorithm_selects_the_reference_set_on_every_path(bits, capacity, rank_limit):
    paths = set()
    for seed, k in ((0, 2048), (1, 37)):
        for name, x in rows_of_every_kind(seed):
            want = set(topk_reference(x[None], torch.tensor([x.numel()], dtype=torch.int32), k)[0].tolist())
            got, trace = select(x, k, bits, capacity, rank_limit)
            assert got == want - {-1}, (name, k)
            kinds = {level[0] for level in trace.levels}
            paths |= {f"{kind} levels" for kind in kinds} | ({"ranked"} if trace.ranked else set())
    if capacity <= 64:  # buckets larger than the list: the slow path over the row
        assert "row levels" in paths, paths
    if rank_limit > 1:
        assert "ranked" in paths, paths
    if capacity > 64 and rank_limit == 1:  # radix levels on the list
        assert "list levels" in paths, paths


def test_the_kernels_algorithm_on_short_rows():
    x = torch.randn(30)
    assert select(x, 40)[0] == set(range(30))
    assert select(x, 30)[0] == set(range(30))
    assert select(x, 29)[0] == set(topk_reference(x[None], torch.tensor([30], dtype=torch.int32), 29)[0].tolist())


# ------------------------------------------------------------------------------------------------------------------
# Compiled for sm90a, without a GPU

COMPILED = [  # (config, dtype): one CTA and clusters, fp32 and 16-bit logits, every bins option
    (dict(warps=32, vectors=1, chunks=3), "fp32"),
    (dict(warps=32, vectors=2, chunks=3, cluster=4), "fp32"),
    (dict(warps=8, vectors=2, chunks=6, bits=11, candidates=512), "bf16"),
    (dict(warps=16, vectors=1, chunks=2, cluster=16, bits=13, candidates=2048), "fp16"),
]


@pytest.fixture(scope="module")
def compiled():
    tool = Path(__file__).resolve().parents[1] / "benchmarks" / "compile_topk_hopper.py"
    rows = []
    for config, dtype in COMPILED:
        done = subprocess.run([sys.executable, str(tool), "--json", "--dtype", dtype, "--config", json.dumps(config)],
                              capture_output=True, text=True, env={**os.environ, "TRITON_INTERPRET": "0"})
        assert done.returncode == 0, done.stderr[-3000:]
        rows += json.loads(done.stdout)
    return rows


def test_the_kernel_compiles_for_sm90a_with_one_shared_buffer_and_no_spill(compiled):
    for row in compiled:
        config = HopperTopKConfig(**row["config"])
        assert row["shared"] == 4 * config.shared_words()   # the one buffer its inline PTX addresses
        assert row["stack"] <= 32, row                       # no tile of keys in local memory
        assert row["registers"] <= 65536 // (32 * config.warps)


def test_the_histogram_counts_in_shared_memory_with_atomics(compiled):
    for row in compiled:
        ops = row["opcodes"]
        assert ops["ATOMS.POPC.INC"] >= 2 * row["config"]["chunks"], ops   # a shared increment a position
        assert ops["LDG.E.128"] >= row["config"]["chunks"], ops             # 16-byte loads
        if row["config"]["cluster"] > 1:
            assert ops["UCGABAR_ARV"] >= 2 and ops["ATOM.E.ADD"] >= 1, ops  # cluster barriers, remote counters
        else:
            assert ops["UCGABAR_ARV"] == 0 and ops["ATOMS.ADD"] >= 1, ops


# ------------------------------------------------------------------------------------------------------------------
# On an sm90 GPU

LAUNCHES = {
    "one CTA": HopperTopKConfig(warps=32, vectors=1, chunks=4),
    "8 warps": HopperTopKConfig(warps=8, vectors=2, chunks=8, candidates=256),
    "16 warps, 11 bits": HopperTopKConfig(warps=16, vectors=2, chunks=2, bits=11, candidates=512),
    "cluster of 2": HopperTopKConfig(warps=32, vectors=1, chunks=2, cluster=2),
    "cluster of 8, 13 bits": HopperTopKConfig(warps=16, vectors=1, chunks=1, cluster=8, bits=13, candidates=2048),
    "cluster of 16": HopperTopKConfig(warps=8, vectors=1, chunks=1, cluster=16),
    "rank 1": HopperTopKConfig(warps=32, vectors=1, chunks=4, rank_limit=1),
}


def gpu_rows(kind, rows, width, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    if kind == "normal":
        x = torch.randn(rows, width, generator=g) * 3
    elif kind == "ties":
        x = torch.randint(-2, 3, (rows, width), generator=g).float()
    else:  # specials
        x = torch.randn(rows, width, generator=g)
        x[torch.rand(rows, width, generator=g) < 0.2] = NAN
        x[:, :300] = -INF
        x[:, 300:400] = -0.0
        x[:, 400:500] = 0.0
    return x.to(dtype).cuda()


@needs_hopper
@pytest.mark.parametrize("launch", LAUNCHES)
@pytest.mark.parametrize("kind", ["normal", "ties", "specials"])
def test_the_kernel_selects_the_reference_set(launch, kind):
    config = LAUNCHES[launch]
    width = min(config.reach(), 16384)
    logits = gpu_rows(kind, 6, width, seed=len(launch))
    ctx = torch.tensor([width, width - 1, width // 2 + 3, 2049, 2048, 100], dtype=torch.int32, device="cuda")
    got = indexer_topk(logits, ctx, 2048, config=config)
    ref = topk_reference(logits, ctx, 2048)
    assert as_sets(got) == as_sets(ref)
    assert is_top_k(got, logits, ctx, 2048, reference=ref).all()
    assert got[4:].lt(0).sum().item() == 2048 - 100  # short rows: their positions, then -1


@needs_hopper
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("width", [20480, 20483])  # whole 16-byte vectors, and not
def test_the_kernel_on_16_bit_logits_and_odd_widths(dtype, width):
    logits = gpu_rows("normal", 4, width, seed=3, dtype=dtype)
    ctx = torch.tensor([[width, 9000], [4097, width - 5]], dtype=torch.int32, device="cuda")  # 2-D lengths
    for config in (default_config(4, width, 2), HopperTopKConfig(warps=16, vectors=1, chunks=3, cluster=2)):
        got = indexer_topk(logits, ctx, 2048, config=config)
        assert as_sets(got) == as_sets(topk_reference(logits, ctx, 2048))


@needs_hopper
def test_the_kernel_reads_only_each_rows_prefix_and_takes_a_row_stride():
    wide = gpu_rows("normal", 3, 12288 + 64, seed=4)
    logits = wide[:, :12288]
    ctx = torch.tensor([12288, 7001, 3000], dtype=torch.int32, device="cuda")
    past = torch.arange(12288, device="cuda") >= ctx[:, None]
    dirty = torch.where(past, NAN, logits)
    config = HopperTopKConfig(warps=32, vectors=1, chunks=3)
    assert as_sets(indexer_topk(dirty, ctx, 2048, config=config)) == as_sets(topk_reference(logits, ctx, 2048))
    assert as_sets(indexer_topk(logits, ctx, 2048, config=config)) == as_sets(topk_reference(logits, ctx, 2048))


@needs_hopper
@pytest.mark.parametrize("rows, width", [(1, 109888), (8, 83968), (64, 10624), (300, 10624)])
def test_the_default_launch_on_benchmark_sized_rows(rows, width):
    logits = gpu_rows("normal", rows, width, seed=rows)
    ctx = torch.randint(int(width * 0.55), width + 1, (rows,), dtype=torch.int32)
    ctx = ctx.cuda()
    got = indexer_topk(logits, ctx, 2048)
    ref = topk_reference(logits, ctx, 2048)
    assert as_sets(got) == as_sets(ref)
