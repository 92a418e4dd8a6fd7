import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from preshuffle import device
from preshuffle.topk.portable import MAX_TILE, TopKConfig, default_config, path_for
from preshuffle.topk.selection import indexer_topk, topk_reference

DEV = device.KERNEL_DEVICE


def as_sets(selection):
    return [set(row) - {-1} for row in selection.tolist()]


@pytest.mark.parametrize("field, value, error, match", [
    ("row_tile", 100, ValueError, "row_tile must be a power of two in"),
    ("row_tile", 2 * MAX_TILE, ValueError, "row_tile must be a power of two in"),
    ("candidates", 8, ValueError, "candidates must be a power of two in"),
    ("segment", 3000, ValueError, "segment must be a power of two in"),
    ("split_candidates", 0, ValueError, "split_candidates must be a positive int"),
    ("row_warps", 3, ValueError, "row_warps must be a power of two up to 32"),
    ("final_warps", 64, ValueError, "final_warps must be a power of two up to 32"),
    ("split_warps", 2.0, TypeError, "split_warps must be a positive int"),
    ("search_bits", 17, ValueError, r"search_bits must be in \[1, 16\]"),
    ("hist_bits", 4, ValueError, "hist_bits must be in .* at least 32 bins"),
    ("row_halves", 1, TypeError, "row_halves must be a bool"),
])
def test_topk_config_refuses_launches_the_kernels_cannot_run(field, value, error, match):
    with pytest.raises(error, match=match):
        TopKConfig(**{field: value})


def test_default_config_takes_the_row_path_up_to_the_largest_tile():
    assert path_for(MAX_TILE, default_config(MAX_TILE)) == "row"
    assert path_for(MAX_TILE + 1, default_config(MAX_TILE + 1)) == "split"
    small = default_config(300)
    assert small.row_tile == 512 and small.candidates <= small.row_tile and path_for(300, small) == "row"


def equal_rows(width=300):
    """Logits whose rows hold few distinct values: the k-th value's bucket is larger than the candidate list."""
    logits = (torch.arange(3 * width) % 7 // 3).float().reshape(3, width).to(DEV)
    return logits, torch.tensor([width, width - 1, 200], dtype=torch.int32, device=DEV)


@pytest.mark.parametrize("config", [
    TopKConfig(row_tile=512, row_warps=2, candidates=16),                                   # the row path's
    TopKConfig(row_tile=16, row_warps=1, segment=64, hist_bits=5, split_candidates=16, final_warps=1),  # the split's
])
def test_a_bucket_larger_than_the_candidate_list_is_selected_from_the_row(config):
    logits, ctx = equal_rows()
    assert as_sets(indexer_topk(logits, ctx, 40, config=config)) == as_sets(topk_reference(logits, ctx, 40))


@pytest.mark.parametrize("search_bits", [1, 5, 12, 16])
def test_the_row_paths_first_bisection_depth_changes_no_position(search_bits):
    g = torch.Generator().manual_seed(search_bits)
    logits = (torch.randn(3, 400, generator=g) * 2).to(DEV)
    ctx = torch.tensor([400, 399, 150], dtype=torch.int32, device=DEV)
    config = TopKConfig(row_tile=512, row_warps=2, search_bits=search_bits, candidates=512)
    assert as_sets(indexer_topk(logits, ctx, 64, config=config)) == as_sets(topk_reference(logits, ctx, 64))


@pytest.mark.parametrize("halves", [True, False])
def test_a_row_half_the_tiles_length_is_bisected_over_half_a_tile(halves):
    g = torch.Generator().manual_seed(7)
    logits = (torch.randn(3, 512, generator=g) * 2).to(DEV)
    ctx = torch.tensor([512, 256, 100], dtype=torch.int32, device=DEV)  # over half, exactly half, under
    config = TopKConfig(row_tile=512, row_warps=2, row_halves=halves)
    assert as_sets(indexer_topk(logits, ctx, 64, config=config)) == as_sets(topk_reference(logits, ctx, 64))


@pytest.mark.parametrize("segment, hist_bits", [(16, 5), (64, 8), (128, 11)])
def test_the_split_paths_segments_and_bins_change_no_position(segment, hist_bits):
    g = torch.Generator().manual_seed(segment)
    logits = (torch.randn(2, 500, generator=g) * 2).to(DEV)
    ctx = torch.tensor([500, 260], dtype=torch.int32, device=DEV)
    config = TopKConfig(row_tile=16, row_warps=1, segment=segment, hist_bits=hist_bits, split_candidates=256)
    assert as_sets(indexer_topk(logits, ctx, 100, config=config)) == as_sets(topk_reference(logits, ctx, 100))


def test_every_kernel_compiles_for_sm80_and_sm90_without_spilling():
    """benchmarks/compile_topk.py builds every kernel of the default launch of both paths, for fp32 and bf16 logits,
    for an A100 and an H100/H200 (Triton's bundled ptxas, no GPU): no Hopper-only feature, and no stack beyond the
    8 bytes ptxas gives the sm80 bf16 histogram (two registers' worth: no tile of the row in local memory)."""
    tool = Path(__file__).resolve().parents[1] / "benchmarks" / "compile_topk.py"
    done = subprocess.run([sys.executable, str(tool), "--json", "--capability", "8.0,9.0"], capture_output=True,
                          text=True, env={**os.environ, "TRITON_INTERPRET": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    rows = json.loads(done.stdout)
    built = {(tuple(r["capability"]), r["dtype"], r["kernel"]) for r in rows}
    kernels = ("row", "hist", "reduce", "compact", "final")
    assert built == {(c, d, k) for c in ((8, 0), (9, 0)) for d in ("fp32", "bf16") for k in kernels
                     if not (d == "bf16" and k == "reduce")}
    assert all(r["stack"] <= 8 for r in rows), [r for r in rows if r["stack"] > 8]


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_the_row_kernel_compiles_for_sm90a_for_every_logits_dtype(dtype):
    """Compiled without a GPU (Triton's bundled ptxas), in a child process that does not interpret kernels: the
    row path builds for half-precision logits too, at a row stride that is no multiple of 16 (Triton 3.6's sm90
    layout pass once broke it there)."""
    script = ("from preshuffle.topk import portable; portable.compile_kernel('row', (9, 0), "
              f"portable.default_config(200), dtype={dtype!r}, ctx_2d=True, strides_of_16=False)")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
