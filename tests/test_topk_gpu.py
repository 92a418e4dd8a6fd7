"""benchmarks/topk_gpu.py's CPU-side pieces: the sub-problem the agreement is measured on, which of its launches
is the default one, and its table."""

import copy

import pytest
import torch

from preshuffle.topk.portable import TopKConfig, default_config
from preshuffle.reference import fp8_paged_mqa_logits_ref
from preshuffle.testing.inputs import random_problem


@pytest.fixture(scope="module")
def topk_gpu(load_benchmark):
    return load_benchmark("topk_gpu")


def test_a_sub_problem_gives_its_sequences_rows_of_the_whole(topk_gpu):
    problem = random_problem([30, 5, 17, 22], next_n=2, heads=16, seed=3)
    whole = problem.call(fp8_paged_mqa_logits_ref)
    part = topk_gpu.sub_problem(problem, [1, 3]).call(fp8_paged_mqa_logits_ref)
    assert torch.equal(part, whole[[2, 3, 6, 7]])


def test_same_launch_compares_what_the_path_taken_uses(topk_gpu):
    assert topk_gpu.same_launch(topk_gpu.CONFIGS["row-16w"], default_config(10_000), 10_000)
    assert topk_gpu.same_launch(topk_gpu.CONFIGS["split-4k"], default_config(100_000), 100_000)
    assert not topk_gpu.same_launch(topk_gpu.CONFIGS["split-4k"], default_config(10_000), 10_000)
    assert not topk_gpu.same_launch(TopKConfig(search_bits=10), TopKConfig(), 10_000)
    assert topk_gpu.same_launch(TopKConfig(search_bits=10), TopKConfig(), 100_000)  # the split path ignores it


def test_the_table_prints_every_shape(topk_gpu, topk_record):
    record = copy.deepcopy(topk_record)
    for s in record["shapes"]:
        s["rows"] = [dict(r, impl="row-16w" if r["impl"].startswith(("row", "split")) else r["impl"])
                     for r in s["rows"]]
    text = topk_gpu.table(record).splitlines()
    assert len(text) == 3 and text[1].split()[:4] == ["1,", "1,", "131072", "11.0"]
    assert "row-16w" in text[2] and "40.0" in text[1]


def test_every_launch_the_run_times_covers_its_logits(topk_gpu):
    """Each shape's sm90 launches (the default first, then variants of one option each) and Triton launches cover
    the logits the run builds, and the width the run compiles for ahead is the width of those logits."""
    from preshuffle.topk.portable import path_for
    from preshuffle.topk.hopper import HopperTopKConfig, default_config as hopper_default
    from preshuffle.testing.inputs import _contexts

    for shape in topk_gpu.SHAPES:
        width = topk_gpu.logits_width(shape)
        longest = int(_contexts(shape, torch.Generator().manual_seed(0)).max())
        assert width == -(-longest // 64) * 64
        rows = shape.batch * shape.next_n
        launches = topk_gpu.hopper_launches(rows, width)
        assert next(iter(launches)) == "sm90" and launches["sm90"] == hopper_default(rows, width)
        assert len(launches) >= 4 and len(set(launches.values())) == len(launches)
        for config in launches.values():
            assert isinstance(config, HopperTopKConfig) and config.reach() >= width
            assert config.segment() // (32 * config.warps) <= topk_gpu.MAX_PER_THREAD
        triton = topk_gpu.triton_launches(width)
        assert all(name.startswith(path_for(width, c)) for name, c in triton.items())
