"""The portable Triton kernel against the float64 reference: under the interpreter on the CPU, compiled on a GPU
(chosen there by its LaunchConfig), on the exact path; and the entry point's checks of bad input."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from preshuffle import device
from preshuffle.kernels import LaunchConfig, fp8_paged_mqa_logits
from preshuffle.testing.inputs import random_problem
from preshuffle.testing.numeric import (
    RTOL, assert_bitwise_equal, check_logits, check_repeatable, check_unchecked_logits,
)

DEV = device.KERNEL_DEVICE
PORTABLE = {"config": LaunchConfig(), "precision": "exact"}


def check_against_reference(problem, **kwargs):
    out = torch.full((problem.batch * problem.next_n, problem.max_model_len), float("nan"), device=DEV)
    # NaN poison: every element must be written
    problem.call(fp8_paged_mqa_logits, out=out, **{**PORTABLE, **kwargs})
    verdict = check_logits(out, problem)
    assert verdict["same_inf_pattern"], verdict
    assert verdict["max_rel_error"] <= RTOL, verdict
    return out


@st.composite
def problems(draw):
    block_size = draw(st.sampled_from([1, 16, 32, 64]))
    layout = draw(st.sampled_from(["normal", "shuffle"] if block_size % 16 == 0 else ["normal"]))
    batch = draw(st.integers(1, 4))
    next_n = draw(st.integers(1, 4))
    max_blocks = draw(st.integers(1, 4 if block_size > 1 else 100))
    capacity = max_blocks * block_size
    lens = draw(st.lists(st.integers(0, capacity), min_size=batch, max_size=batch))
    return random_problem(lens, next_n=next_n, heads=draw(st.sampled_from([16, 32, 64])), block_size=block_size,
                          layout=layout, ctx_2d=draw(st.booleans()), seed=draw(st.integers(0, 2**16)),
                          spare_columns=max_blocks - max(-(-n // block_size) for n in lens), device=DEV)


@settings(max_examples=60)
@given(problems())
def test_fp8_paged_mqa_logits_matches_float64_reference(problem):
    check_against_reference(problem)


@pytest.mark.parametrize("block_size, layout", [(1, "normal"), (16, "normal"), (16, "shuffle"), (64, "shuffle")])
def test_fp8_paged_mqa_logits_repeated_runs_are_bitwise_equal(block_size, layout):
    problem = random_problem([70, 129, 5], next_n=2, block_size=block_size, layout=layout, seed=3, device=DEV)
    first = check_against_reference(problem)
    assert_bitwise_equal(first, check_repeatable(lambda: problem.call(fp8_paged_mqa_logits, **PORTABLE)))


@pytest.mark.parametrize("split", [dict(tokens_per_program=64), dict(tokens_per_program=192), dict(splits=2),
                                   dict(splits=3), dict(splits=40)])
@pytest.mark.parametrize("clean_logits", [True, False])
def test_fp8_paged_mqa_logits_does_not_depend_on_the_split(split, clean_logits):
    """Fixed runs of the row, or shares of each sequence's own context (three shares of 300 positions start
    mid-block; 40 leave most programs nothing to read); a long row past the contexts, shared among them for the
    -inf fill, and an empty sequence. Without the fill, the positions a row may see hold the same bits and nothing
    past a sequence's last chunk is written."""
    problem = random_problem([300, 17, 0], block_size=16, seed=5, max_model_len=1100, device=DEV)
    whole = problem.call(fp8_paged_mqa_logits, **PORTABLE)
    out = torch.full_like(whole, 7.0)
    problem.call(fp8_paged_mqa_logits, precision="exact", config=LaunchConfig(64, **split), out=out,
                 clean_logits=clean_logits)
    if clean_logits:
        assert_bitwise_equal(whole, out)
    else:
        positions = torch.arange(1100, device=DEV)
        lens = problem.context_lens.reshape(-1, 1)
        assert_bitwise_equal(out[positions < lens], whole[positions < lens])
        assert (out[positions >= (lens + 63) // 64 * 64] == 7.0).all()


def test_fp8_paged_mqa_logits_layouts_hold_the_same_logits():
    normal = random_problem([90, 33], block_size=32, layout="normal", seed=9, device=DEV)
    shuffled = random_problem([90, 33], block_size=32, layout="shuffle", seed=9, device=DEV)
    assert not torch.equal(normal.kv_cache, shuffled.kv_cache)
    assert_bitwise_equal(normal.call(fp8_paged_mqa_logits, **PORTABLE),
                         shuffled.call(fp8_paged_mqa_logits, **PORTABLE))


def test_fp8_paged_mqa_logits_zero_context_row_is_all_neg_inf_and_the_tail_too():
    problem = random_problem([0, 40], next_n=3, block_size=16, max_model_len=100, seed=1, device=DEV)
    out = check_against_reference(problem)
    assert torch.isneginf(out[:3]).all()
    # Row j of sequence 1 sees positions <= 40 - 3 + j.
    for j in range(3):
        assert torch.isfinite(out[3 + j, :38 + j]).all() and torch.isneginf(out[3 + j, 38 + j:]).all()


def bad(problem, **changes):
    return lambda: problem.replace(**changes).call(fp8_paged_mqa_logits)


@pytest.fixture
def ok():
    return random_problem([40, 20], next_n=2, block_size=16, seed=2, device=DEV)


def test_fp8_paged_mqa_logits_rejects_bad_dtypes(ok):
    with pytest.raises(TypeError, match="q must be an fp8 tensor"):
        bad(ok, q=ok.q.float())()
    with pytest.raises(TypeError, match="weights must be a float32 tensor"):
        bad(ok, weights=ok.weights.half())()
    with pytest.raises(TypeError, match="context_lens must be an int32 tensor"):
        bad(ok, context_lens=ok.context_lens.long())()
    with pytest.raises(TypeError, match="block_tables must be an int32 tensor"):
        bad(ok, block_tables=ok.block_tables.long())()
    with pytest.raises(TypeError, match="kv_cache must be a uint8 tensor"):
        bad(ok, kv_cache=ok.kv_cache.view(torch.int8))()
    with pytest.raises(TypeError, match="the kernels take q as torch.float8_e4m3fn, got torch.float8_e4m3fnuz"):
        bad(ok, q=ok.q.float().to(torch.float8_e4m3fnuz))()


def test_fp8_paged_mqa_logits_rejects_bad_shapes(ok):
    with pytest.raises(ValueError, match=r"q must be \[batch, next_n, heads, head_dim\]"):
        bad(ok, q=ok.q[0])()
    with pytest.raises(ValueError, match="kv_cache holds head_dim 128 but q has head_dim 64"):
        bad(ok, q=ok.q[..., :64].contiguous())()
    with pytest.raises(ValueError, match=r"weights must be \[batch\*next_n, heads\]"):
        bad(ok, weights=ok.weights[:3])()
    with pytest.raises(ValueError, match="context_lens must be"):
        bad(ok, context_lens=ok.context_lens[:1])()
    with pytest.raises(ValueError, match="block_tables must be"):
        bad(ok, block_tables=ok.block_tables[:1])()
    with pytest.raises(ValueError, match="kv_cache must be"):
        bad(ok, kv_cache=ok.kv_cache[None])()
    with pytest.raises(ValueError, match="power-of-two number of heads"):
        bad(ok, q=ok.q[:, :, :24].contiguous(), weights=ok.weights[:, :24].contiguous())()


def test_fp8_paged_mqa_logits_rejects_a_block_size_the_layout_cannot_take():
    problem = random_problem([20], block_size=8, seed=4, device=DEV)
    with pytest.raises(ValueError, match="block_size must be a multiple of 16 for the shuffle layout, got 8"):
        bad(problem, layout="shuffle")()
    with pytest.raises(ValueError, match="layout must be one of"):
        bad(problem, layout="tiled")()


def test_fp8_paged_mqa_logits_rejects_bad_values(ok):
    lens = ok.context_lens.clone()
    lens[0] = 16 * ok.block_tables.shape[1] + 1
    with pytest.raises(ValueError, match="beyond what block_tables can hold"):
        bad(ok, context_lens=lens)()
    with pytest.raises(ValueError, match="max_model_len 10 is smaller than the longest context length 40"):
        bad(ok, max_model_len=10)()
    with pytest.raises(ValueError, match="max_model_len must be a positive int"):
        bad(ok, max_model_len=0)()
    with pytest.raises(ValueError, match="context_lens must be >= 0"):
        bad(ok, context_lens=-ok.context_lens)()
    tables = ok.block_tables.clone()
    tables[1, 0] = ok.kv_cache.shape[0]
    with pytest.raises(ValueError, match=r"block id \d+ outside \[0, \d+\)"):
        bad(ok, block_tables=tables)()
    tables = ok.block_tables.clone()
    tables[0, 0] = -1
    with pytest.raises(ValueError, match="block id -1"):
        bad(ok, block_tables=tables)()


# Sequence 0 of each problem (next_n = 2, blocks of 16) and the table column that gets a bad block id: whether a
# row reads that block decides whether the checked call must refuse it.
@pytest.mark.parametrize("bad_id", ["past the cache", "negative"])
@pytest.mark.parametrize("length, ctx_2d, column, read", [
    (40, False, 2, True),   # rows see 39 and 40 positions: block 2 is the last, partly read one (32..39)
    (33, True, 2, True),    # rows see 32 and 33 positions: block 2 is read by the last row, j = 1, alone
    (33, False, 2, True),   # the same with 1-D lengths (row j sees ctx - next_n + j + 1 positions)
    (32, True, 2, False),   # rows see 31 and 32 positions: block 2 is just past what any row reads
    (32, False, 2, False),
    (40, False, 3, False),
])
def test_fp8_paged_mqa_logits_checks_the_block_ids_the_rows_read(length, ctx_2d, column, read, bad_id):
    problem = random_problem([length, 20], next_n=2, block_size=16, ctx_2d=ctx_2d, seed=6, device=DEV)
    assert problem.block_tables.shape[1] > column
    tables = problem.block_tables.clone()
    tables[0, column] = problem.num_blocks if bad_id == "past the cache" else -3
    if read:
        with pytest.raises(ValueError, match=rf"block id {int(tables[0, column])} outside \[0, {problem.num_blocks}\) "
                                             r"in a block the context reads"):
            bad(problem, block_tables=tables)()
    else:
        check_against_reference(problem.replace(block_tables=tables))


def test_fp8_paged_mqa_logits_padding_past_the_context_may_hold_anything(ok):
    tables = ok.block_tables.clone()
    tables[:, -1] = -7  # the spare column: read by no sequence
    check_against_reference(ok.replace(block_tables=tables))


def test_fp8_paged_mqa_logits_out_must_match(ok):
    with pytest.raises(ValueError, match="out must be a float32 tensor of shape .* with contiguous rows"):
        ok.call(fp8_paged_mqa_logits, out=torch.empty(1, device=DEV))


def test_fp8_paged_mqa_logits_refuses_an_out_that_requires_grad(ok):
    out = torch.zeros(ok.batch * ok.next_n, ok.max_model_len, device=DEV, requires_grad=True)
    with pytest.raises(ValueError, match="out must not require grad"):
        ok.call(fp8_paged_mqa_logits, out=out)
    assert not out.detach().any()


def check_unchecked(problem, **bad):
    """The kernel with ``check_values=False`` on ``problem`` with ``bad`` context_lens or block_tables, into a
    poisoned ``out`` (every element must be written): NaN exactly where no key can be read, the reference
    elsewhere."""
    out = torch.full((problem.batch * problem.next_n, problem.max_model_len), 1.0e30, device=DEV)
    problem.replace(**bad).call(fp8_paged_mqa_logits, check_values=False, out=out, **PORTABLE)
    verdict = check_unchecked_logits(out, problem, bad.get("context_lens", problem.context_lens),
                                     bad.get("block_tables", problem.block_tables))
    assert verdict["nan_exact"] and verdict["nan"] > 0, verdict
    assert verdict["same_inf_pattern"] and verdict["max_rel_error"] <= RTOL, verdict


UNCHECKED_VARIANTS = pytest.mark.parametrize("block_size, layout, next_n", [
    (1, "normal", 1), (1, "normal", 2), (16, "normal", 1), (16, "shuffle", 2), (64, "shuffle", 1), (64, "normal", 3),
])


@UNCHECKED_VARIANTS
def test_fp8_paged_mqa_logits_unchecked_bad_block_ids_give_nan(block_size, layout, next_n):
    problem = random_problem([150, 70, 129], next_n=next_n, heads=16, block_size=block_size, layout=layout, seed=11,
                             device=DEV)
    tables = problem.block_tables.clone()
    tables[0, 1] = problem.num_blocks  # just past the cache
    tables[1, 0] = -1
    tables[2, 2] = 2**31 - 1           # as far past it as an int32 id goes
    check_unchecked(problem, block_tables=tables)


@UNCHECKED_VARIANTS
def test_fp8_paged_mqa_logits_unchecked_lengths_past_the_table_give_nan(block_size, layout, next_n):
    problem = random_problem([150, 70, 129], next_n=next_n, heads=16, block_size=block_size, layout=layout, seed=12,
                             max_model_len=512, device=DEV)
    capacity = problem.block_tables.shape[1] * block_size
    lens = problem.context_lens.clone()
    lens[0] = -5                # sees nothing
    lens[1] = capacity + 30     # reading past its table row would read the next row
    lens[2] = capacity + 100    # and past the last row, the end of the table
    check_unchecked(problem, context_lens=lens)


@UNCHECKED_VARIANTS
def test_fp8_paged_mqa_logits_unchecked_int32_max_length_gives_nan_past_the_table(block_size, layout, next_n):
    """A length of 2**31 - 1 (as far as an int32 length goes): each row sees every position below max_model_len,
    NaN from where its table row ends (and at the unwritten slots of its last block: scale 0), no position wraps."""
    problem = random_problem([150, 70, 129], next_n=next_n, heads=16, block_size=block_size, layout=layout, seed=14,
                             max_model_len=512, device=DEV)
    lens = problem.context_lens.clone()
    lens[1] = 2**31 - 1
    check_unchecked(problem, context_lens=lens)
    bad = problem.replace(context_lens=lens)
    out = bad.call(fp8_paged_mqa_logits, check_values=False, **PORTABLE)
    rows = out[next_n:2 * next_n]
    capacity = problem.block_tables.shape[1] * block_size
    assert not torch.isneginf(rows).any() and torch.isnan(rows[:, capacity:]).all()


def test_fp8_paged_mqa_logits_unchecked_length_past_the_written_keys_reads_what_the_slots_hold():
    """A length past a sequence's keys but within its table row reads the slots there: NaN where a slot was never
    written (a zeroed cache's scale 0), a finite logit of whatever key a slot holds where its table entry names a
    written block (here the table's padding, block 0, whose first 8 slots hold sequence 1's last keys)."""
    problem = random_problem([20, 40], next_n=1, heads=16, block_size=16, seed=15, spare_columns=1,
                             max_model_len=80, device=DEV)
    lens = torch.tensor([40, 40], dtype=torch.int32, device=problem.context_lens.device)
    out = problem.replace(context_lens=lens).call(fp8_paged_mqa_logits, check_values=False, **PORTABLE)
    check_unchecked(problem, context_lens=lens)
    assert problem.block_tables[0, 2] == 0 and problem.block_tables[1, 2] == 0  # the premise: seed 15's draw
    assert torch.isnan(out[0, 20:32]).all()  # sequence 0's second block, past its 20 keys
    assert torch.isfinite(out[0, 32:40]).all()  # its padding entry: block 0, written by sequence 1


def test_fp8_paged_mqa_logits_unchecked_empty_table_gives_nan():
    problem = random_problem([40, 7], next_n=2, heads=16, block_size=16, seed=13, device=DEV)
    check_unchecked(problem, block_tables=problem.block_tables[:, :0])


def test_fp8_paged_mqa_logits_checked_bad_ids_still_raise_first(ok):
    tables = ok.block_tables.clone()
    tables[0, 0] = ok.num_blocks
    with pytest.raises(ValueError, match="block id"):
        bad(ok, block_tables=tables)()
