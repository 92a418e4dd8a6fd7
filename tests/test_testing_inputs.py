import pytest
import torch

from preshuffle import device
from preshuffle.cache import gather_k_cache
from preshuffle.testing.inputs import random_problem, scattered_block_tables


def test_benchmark_problem_follows_the_spec(small_benchmark_problem):
    problem = small_benchmark_problem
    ctx = problem.context_lens
    assert ((ctx >= int(0.7 * 120)) & (ctx <= int(1.3 * 120))).all()
    tables = problem.block_tables
    used = [tables[b, :-(-int(n) // 16)] for b, n in enumerate(ctx)]
    ids = sorted(int(i) for row in used for i in row)
    assert ids == list(range(problem.kv_cache.shape[0]))           # every block used once: a permutation
    assert problem.kv_cache.ne(0).any(dim=-1).all()                # no all-zero records
    assert problem.layout == "shuffle" and problem.max_model_len == int(ctx.max())


def test_scattered_block_tables_deals_one_permutation():
    tables = scattered_block_tables([3, 0, 2], 7, 4, torch.Generator().manual_seed(0))
    assert tables.dtype == torch.int32 and tables.shape == (3, 4)
    dealt = tables[0, :3].tolist() + tables[2, :2].tolist()
    assert len(set(dealt)) == 5 and all(0 <= i < 7 for i in dealt)
    assert tables[0, 3] == 0 and (tables[1] == 0).all() and (tables[2, 2:] == 0).all()


def test_random_problem_writes_each_sequence_through_its_table():
    problem = random_problem([20, 0, 33], next_n=2, heads=16, block_size=16, layout="shuffle", ctx_2d=True, seed=6,
                             device="cpu")
    assert problem.layout == "shuffle" and problem.sum_ctx == 53 and problem.max_model_len == 36
    assert problem.context_lens.tolist() == [[19, 20], [0, 0], [32, 33]]
    values, scales = gather_k_cache(problem.kv_cache, problem.block_tables[2], 33, layout="shuffle")
    assert values.shape == (33, 128) and (scales > 0).all()


@pytest.mark.skipif(not device.INTERPRETED, reason="the builders' default device under the interpreter")
def test_random_problem_lands_on_the_kernel_device():
    assert random_problem([5], heads=16).q.device == torch.device("cpu")


@pytest.mark.parametrize("context_lens, kwargs, exc, message", [
    # max_model_len=0 became 13 (0 is falsy), 20.7 tokens became 20, block_size 0 divided by zero.
    ([10], dict(max_model_len=0), ValueError, "max_model_len must be a positive int, got 0"),
    ([20.7], {}, TypeError, r"context_lens\[0\] must be a non-negative int, got float 20.7"),
    ([5, -1], {}, ValueError, r"context_lens\[1\] must be a non-negative int, got -1"),
    ([10], dict(block_size=0), ValueError, "block_size must be a positive int, got 0"),
    ([10], dict(next_n=0), ValueError, "next_n must be a positive int, got 0"),
    ([10], dict(heads=16.0), TypeError, "heads must be a positive int, got float 16.0"),
    ([10], dict(extra_blocks=-1), ValueError, "extra_blocks must be a non-negative int, got -1"),
    ([10], dict(spare_columns=1.5), TypeError, "spare_columns must be a non-negative int, got float 1.5"),
    ([10], dict(ctx_2d="yes"), TypeError, "ctx_2d must be a bool, got str 'yes'"),
    ([10], dict(seed=1.5), TypeError, "seed must be a non-negative int, got float 1.5"),
    (10, {}, TypeError, "context_lens must be a list of ints, got int"),
])
def test_random_problem_refuses_what_it_would_otherwise_fix(context_lens, kwargs, exc, message):
    with pytest.raises(exc, match=f"^{message}$"):
        random_problem(context_lens, heads=kwargs.pop("heads", 16), **kwargs)
