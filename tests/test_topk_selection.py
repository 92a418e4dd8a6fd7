import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from preshuffle import device
from preshuffle.cache import sequence_slots
from preshuffle.contract import kv_lengths
from preshuffle.topk.portable import default_config
from preshuffle.topk.selection import agreement, indexer_topk, is_top_k, row_lengths, selected_slots, topk_reference

DEV = device.KERNEL_DEVICE
NAN, INF = math.nan, math.inf
SPECIALS = (0.0, -0.0, 1.0, -1.0, 2.5, INF, -INF, NAN)


def by_definition(values: list[float], n: int, k: int) -> list[int]:
    """The selection as the module's docstring words it, with Python's sort: numbers by value (-0.0 == 0.0), then
    NaN, ties by position; the first min(k, n), then -1."""
    def order(p):
        v = values[p]
        return (1, 0.0, p) if math.isnan(v) else (0, -v, p)
    best = sorted(range(n), key=order)[:k]
    return best + [-1] * (k - len(best))


def as_sets(selection: torch.Tensor) -> list[set]:
    return [set(row) - {-1} for row in selection.tolist()]


def test_topk_reference_orders_numbers_then_nan_ties_by_position():
    # position:        0    1    2     3    4     5    6    7     8
    row = torch.tensor([[1.0, NAN, -INF, 2.0, -0.0, 0.0, 2.0, NAN, -3.0]])
    full = torch.tensor([9], dtype=torch.int32)
    assert topk_reference(row, full, 9).tolist() == [[3, 6, 0, 4, 5, 8, 2, 1, 7]]
    assert topk_reference(row, full, 4).tolist() == [[3, 6, 0, 4]]
    assert topk_reference(row, full, 12).tolist() == [[3, 6, 0, 4, 5, 8, 2, 1, 7, -1, -1, -1]]
    # With next_n = 2 row 0 sees one position fewer than row 1 (the logits kernel's rule): -inf, not -0.0.
    two = torch.cat([row, row])
    assert topk_reference(two, torch.tensor([5], dtype=torch.int32), 3).tolist() == [[3, 0, 2], [3, 0, 4]]
    assert topk_reference(two, torch.tensor([6], dtype=torch.int32), 3).tolist() == [[3, 0, 4], [3, 0, 4]]


finite_or_special = st.one_of(st.sampled_from(SPECIALS), st.floats(-4, 4, width=32))


@settings(max_examples=60)
@given(st.lists(st.lists(finite_or_special, min_size=0, max_size=40), min_size=1, max_size=4), st.data())
def test_topk_reference_is_the_definition(rows, data):
    width = max(len(r) for r in rows)
    values = [r + [0.0] * (width - len(r)) for r in rows]
    lens = [data.draw(st.integers(0, width)) for _ in rows]
    k = data.draw(st.integers(1, width + 3))
    got = topk_reference(torch.tensor(values, dtype=torch.float32).reshape(len(rows), width),
                         torch.tensor(lens, dtype=torch.int32).reshape(len(rows), 1), k)
    v32 = torch.tensor(values, dtype=torch.float32).reshape(len(rows), width).tolist()
    assert got.tolist() == [by_definition(v, n, k) for v, n in zip(v32, lens)]


def random_logits(rows, width, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(rows, width, generator=g) * 3).to(dtype).to(DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("next_n, ctx_2d", [(1, False), (2, False), (3, True)])
def test_indexer_topk_selects_the_reference_set(topk_launch, dtype, next_n, ctx_2d):
    batch, width, k = 3, 200, 37
    g = torch.Generator().manual_seed(next_n)
    if ctx_2d:
        ctx = torch.randint(0, width + 1, (batch, next_n), generator=g, dtype=torch.int32)
    else:
        ctx = torch.randint(next_n, width + 1, (batch,), generator=g, dtype=torch.int32)
    logits = random_logits(batch * next_n, width, seed=next_n, dtype=dtype)
    ctx = ctx.to(DEV)
    got = indexer_topk(logits, ctx, k, config=topk_launch(width))
    assert got.dtype == torch.int32 and got.shape == (batch * next_n, k)
    # Ties are broken by position, so the set is exactly the reference's (bf16 and fp16 logits tie often).
    assert as_sets(got) == as_sets(topk_reference(logits, ctx, k))
    assert is_top_k(got, logits, ctx, k).all()


@settings(max_examples=40)
@given(st.integers(1, 3), st.integers(1, 150), st.data())
def test_indexer_topk_on_ties_and_specials(small_split, rows, width, data):
    """Logits drawn from a few values (so most positions tie), infinities and NaN among them."""
    pool = data.draw(st.lists(st.sampled_from(SPECIALS), min_size=1, max_size=4))
    values = data.draw(st.lists(st.sampled_from(pool), min_size=rows * width, max_size=rows * width))
    logits = torch.tensor(values, dtype=torch.float32).reshape(rows, width).to(DEV)
    ctx = torch.tensor(data.draw(st.lists(st.integers(0, width), min_size=rows, max_size=rows)),
                       dtype=torch.int32).reshape(rows, 1).to(DEV)
    k = data.draw(st.integers(1, width + 5))
    config = data.draw(st.sampled_from([default_config(width), small_split]))
    got = indexer_topk(logits, ctx, k, config=config)
    assert as_sets(got) == as_sets(topk_reference(logits, ctx, k))


CASES = {  # name -> (a row of 300 logits, visible positions, k)
    "all equal": (lambda: torch.full((300,), 0.5), 300, 40),
    "shorter than k": (lambda: torch.randn(300), 25, 40),
    "exactly k": (lambda: torch.randn(300), 40, 40),
    "one more than k": (lambda: torch.randn(300), 41, 40),
    "k above the width": (lambda: torch.randn(300), 300, 301),
    "all -inf": (lambda: torch.full((300,), -INF), 300, 40),
    "all NaN": (lambda: torch.full((300,), NAN), 300, 40),
    "NaN but for a few": (lambda: torch.where(torch.arange(300) % 50 == 7, torch.arange(300.0), NAN), 300, 40),
    "-inf but for a few": (lambda: torch.where(torch.arange(300) % 30 == 1, -torch.arange(300.0), -INF), 300, 40),
    "nothing visible": (lambda: torch.randn(300), 0, 40),
    "two values": (lambda: (torch.arange(300) % 2).float(), 300, 200),
    "zeros of both signs": (lambda: torch.where(torch.arange(300) % 3 == 0, -0.0, 0.0), 300, 40),
}


@pytest.mark.parametrize("case", CASES)
def test_indexer_topk_on_adversarial_rows(topk_launch, case):
    make, n, k = CASES[case]
    torch.manual_seed(0)
    logits = make().reshape(1, -1).float().to(DEV)
    ctx = torch.tensor([n], dtype=torch.int32, device=DEV)
    got = indexer_topk(logits, ctx, k, config=topk_launch(300))
    expected = by_definition(logits[0].tolist(), n, k)
    assert as_sets(got) == [set(expected) - {-1}]
    # A short row's slots past its positions hold -1, and only those.
    assert got[0, min(n, k):].eq(-1).all() and got[0, :min(n, k)].ge(0).all()


@pytest.mark.parametrize("garbage", [INF, NAN, 1e30, -INF])
def test_indexer_topk_reads_only_each_rows_prefix(topk_launch, garbage):
    """Logits written with clean_logits=False: whatever lies past a row's prefix changes nothing."""
    width, k = 240, 30
    logits = random_logits(4, width, seed=1)
    ctx = torch.tensor([240, 100, 31, 7], dtype=torch.int32, device=DEV)
    past = torch.arange(width, device=DEV) >= ctx.unsqueeze(1)
    dirty = torch.where(past, garbage, logits)
    clean = torch.where(past, -INF, logits)
    config = topk_launch(width)
    got = indexer_topk(dirty, ctx, k, config=config)
    assert torch.equal(got, indexer_topk(clean, ctx, k, config=config))
    assert as_sets(got) == as_sets(topk_reference(clean, ctx, k))


def test_indexer_topk_takes_a_view_of_wider_logits(topk_launch):
    wide = random_logits(3, 300, seed=2)
    ctx = torch.tensor([100, 50, 120], dtype=torch.int32, device=DEV)
    view = wide[:, :120]
    got = indexer_topk(view, ctx, 20, config=topk_launch(120))
    assert as_sets(got) == as_sets(topk_reference(view.contiguous(), ctx, 20))


def test_indexer_topk_is_repeatable_and_the_paths_agree(small_split):
    logits = random_logits(5, 180, seed=3)
    ctx = torch.tensor([180, 170, 90, 60, 5], dtype=torch.int32, device=DEV)
    row = indexer_topk(logits, ctx, 50, config=default_config(180))
    assert torch.equal(row, indexer_topk(logits, ctx, 50, config=default_config(180)))
    assert as_sets(row) == as_sets(indexer_topk(logits, ctx, 50, config=small_split))


def test_indexer_topk_writes_into_out():
    logits = random_logits(2, 64, seed=4)
    ctx = torch.tensor([64, 20], dtype=torch.int32, device=DEV)
    out = torch.full((2, 30), 7, dtype=torch.int32, device=DEV)
    assert indexer_topk(logits, ctx, 30, out=out) is out
    assert as_sets(out) == as_sets(topk_reference(logits, ctx, 30))


@pytest.mark.parametrize("rows, width", [(0, 10), (3, 0)])
def test_indexer_topk_on_empty_logits(rows, width):
    got = indexer_topk(torch.zeros(rows, width, device=DEV), torch.zeros(rows, dtype=torch.int32, device=DEV), 5)
    assert got.shape == (rows, 5) and got.eq(-1).all()


def test_unchecked_lengths_see_nothing_below_zero_and_the_width_above_it():
    logits = random_logits(3, 50, seed=5)
    ctx = torch.tensor([-4, 80, 10], dtype=torch.int32, device=DEV)
    got = indexer_topk(logits, ctx, 20, check_values=False)
    clamped = ctx.clamp(0, 50)
    assert as_sets(got) == as_sets(topk_reference(logits, clamped, 20))
    assert got[0].eq(-1).all()


def bad(**overrides):
    args = dict(logits=torch.randn(4, 32, device=DEV), context_lens=torch.tensor([30, 32], dtype=torch.int32,
                                                                                  device=DEV), k=8)
    args.update(overrides)
    return args


@pytest.mark.parametrize("overrides, error, match", [
    (dict(logits=[[1.0]]), TypeError, "logits must be a floating-point tensor"),
    (dict(logits=torch.zeros(4, 32, dtype=torch.int32)), TypeError, "logits must be a floating-point tensor"),
    (dict(logits=torch.zeros(4, 32, dtype=torch.float64)), TypeError, "logits must be one of"),
    (dict(logits=torch.zeros(4, 32, 1)), ValueError, r"logits must be \[rows, positions\]"),
    (dict(logits=torch.zeros(32, 4).t()), ValueError, "logits must have unit column stride"),
    (dict(context_lens=torch.tensor([30, 32])), TypeError, "context_lens must be an int32 tensor"),
    (dict(context_lens=torch.tensor([30, 32, 3], dtype=torch.int32)), ValueError,
     "logits' 4 rows must be batch x next_n for the 3 sequences"),
    (dict(context_lens=torch.ones(2, 3, dtype=torch.int32)), ValueError, "must give one length a row of logits"),
    (dict(context_lens=torch.ones(2, 2, 1, dtype=torch.int32)), ValueError, r"context_lens must be \[batch\]"),
    (dict(context_lens=torch.tensor([30, -1], dtype=torch.int32)), ValueError, "context_lens must be >= 0"),
    (dict(context_lens=torch.tensor([30, 33], dtype=torch.int32)), ValueError,
     "lets a row see 33 positions, more than the logits' 32"),
    (dict(k=0), ValueError, "k must be a positive int"),
    (dict(k=2.0), TypeError, "k must be a positive int"),
    (dict(k=True), TypeError, "k must be a positive int"),
    (dict(k=2 ** 31), ValueError, "k must be below 2"),
    (dict(out=torch.zeros(4, 8)), TypeError, "out must be an int32 tensor"),
    (dict(out=torch.zeros(4, 9, dtype=torch.int32)), ValueError, r"out must be a contiguous int32 tensor of shape"),
    (dict(config="row"), TypeError, "config must be a HopperTopKConfig or a TopKConfig, got str"),
])
def test_indexer_topk_refuses_bad_arguments(overrides, error, match):
    args = bad(**overrides)
    for name in ("logits", "context_lens", "out"):
        if isinstance(args.get(name), torch.Tensor):
            args[name] = args[name].to(DEV)
    with pytest.raises(error, match=match):
        indexer_topk(**args)


def test_indexer_topk_refuses_lengths_on_another_device():
    with pytest.raises(ValueError, match="context_lens is on meta"):
        indexer_topk(torch.zeros(2, 8, device=DEV), torch.zeros(2, dtype=torch.int32, device="meta"), 4)


def test_is_top_k_takes_any_tie_and_nothing_else():
    logits = torch.tensor([[3.0, 1.0, 1.0, 1.0, 0.0, 5.0]])
    ctx = torch.tensor([6], dtype=torch.int32)
    assert is_top_k(torch.tensor([[5, 0, 1]]), logits, ctx, 3).item()
    assert is_top_k(torch.tensor([[3, 5, 0]]), logits, ctx, 3).item()       # another of the tied 1.0s, any order
    assert not is_top_k(torch.tensor([[5, 0, 4]]), logits, ctx, 3).item()   # 0.0 instead of a 1.0
    assert not is_top_k(torch.tensor([[5, 1, 2]]), logits, ctx, 3).item()   # a 1.0 instead of 3.0
    assert not is_top_k(torch.tensor([[5, 0, 0]]), logits, ctx, 3).item()   # a position twice
    assert not is_top_k(torch.tensor([[5, 0, 6]]), logits, ctx, 3).item()   # past the row
    short = torch.tensor([2], dtype=torch.int32)
    assert is_top_k(torch.tensor([[0, 1, -1]]), logits, short, 3).item()
    assert not is_top_k(torch.tensor([[0, 1, 1]]), logits, short, 3).item()  # no -1 for the missing slot
    assert not is_top_k(torch.tensor([[0, -1, -1]]), logits, short, 3).item()  # a position missing


def test_is_top_k_ranks_nan_last():
    logits = torch.tensor([[NAN, -INF, 2.0]])
    ctx = torch.tensor([3], dtype=torch.int32)
    assert is_top_k(torch.tensor([[2, 1]]), logits, ctx, 2).item()
    assert not is_top_k(torch.tensor([[2, 0]]), logits, ctx, 2).item()


def test_agreement_counts_shared_positions():
    ref = torch.tensor([[0, 1, 2, 3], [4, 5, -1, -1], [-1, -1, -1, -1]])
    sel = torch.tensor([[3, 2, 9, 8], [5, 4, -1, -1], [-1, -1, -1, -1]])
    assert agreement(sel, ref, 10).tolist() == [0.5, 1.0, 1.0]
    with pytest.raises(ValueError, match="must have one shape"):
        agreement(sel[:, :2], ref, 10)


def test_row_lengths_follow_the_logits_kernels_rule():
    ctx = torch.tensor([5, 1, 0], dtype=torch.int32)
    logits = torch.zeros(6, 4)
    assert row_lengths(logits, ctx).tolist() == kv_lengths(ctx, 2).reshape(-1).clamp(max=4).tolist() \
        == [4, 4, 0, 1, 0, 0]


def test_selected_slots_are_the_block_tables_slots():
    tables = torch.tensor([[3, 0, 2], [1, 4, 5]], dtype=torch.int32)
    sel = torch.tensor([[0, 9, -1], [3, 4, 10], [7, -1, -1], [1, 2, 0]])
    slots = selected_slots(sel, tables, 4, next_n=2)
    for r in range(4):
        table = sequence_slots(tables[r // 2], 12, 4)
        assert slots[r].tolist() == [table[p].item() if p >= 0 else -1 for p in sel[r].tolist()]
    with pytest.raises(ValueError, match="must be block_tables' 2 sequences x next_n 1"):
        selected_slots(sel, tables, 4, next_n=1)
