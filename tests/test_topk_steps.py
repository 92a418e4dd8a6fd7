import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from preshuffle import device
from preshuffle.topk.selection import indexer_topk, topk_reference
from preshuffle.topk.steps import bisect, fp16_buckets, order_keys, row_path

SPECIALS = (0.0, -0.0, 1.0, -1.0, 3.0e-8, -3.0e-8, 7.0e4, -7.0e4, math.inf, -math.inf, math.nan)


@settings(max_examples=50)
@given(st.lists(st.one_of(st.sampled_from(SPECIALS), st.floats(width=32, allow_nan=False)), min_size=1, max_size=60))
def test_order_keys_sort_as_the_reference_orders(values):
    x = torch.tensor(values, dtype=torch.float32)
    n = torch.tensor([len(values)], dtype=torch.int32)
    # A stable sort by descending key is the selection's order: numbers, then NaN, ties by position.
    by_key = torch.sort(order_keys(x), descending=True, stable=True).indices
    assert by_key.tolist() == topk_reference(x.unsqueeze(0), n, len(values))[0].tolist()
    # Buckets never reverse two values' order.
    for bits in (1, 8, 16):
        b = fp16_buckets(x, bits)[by_key]
        assert (b[1:] <= b[:-1]).all(), bits


def test_order_keys_tie_the_zeros_and_the_nans():
    keys = order_keys(torch.tensor([0.0, -0.0, math.nan, -math.nan, -math.inf]))
    assert keys[0] == keys[1] and keys[2] == keys[3] < keys[4]


@pytest.mark.parametrize("r", [1, 7, 50])
def test_bisect_finds_the_rth_largest_key(r):
    keys = order_keys(torch.randn(50, generator=torch.Generator().manual_seed(r)))
    t, trace = bisect(keys, r)
    assert t == keys.sort(descending=True).values[r - 1]
    assert len(trace) <= 32 and all(step["lo"] <= step["mid"] <= step["hi"] for step in trace)


def test_bisect_refuses_more_than_it_has():
    with pytest.raises(ValueError, match="r must be at most the 3 keys"):
        bisect(torch.tensor([1, 2, 3]), 4)


@pytest.mark.parametrize("search_bits", [4, 12, 16])
def test_row_path_selects_what_the_kernel_and_the_reference_select(search_bits):
    g = torch.Generator().manual_seed(search_bits)
    values = torch.randn(600, generator=g).round(decimals=2)  # ties
    steps = row_path(values, 100, search_bits)
    n = torch.tensor([600], dtype=torch.int32)
    reference = set(topk_reference(values.unsqueeze(0), n, 100)[0].tolist())
    assert set(steps["selected"].tolist()) == reference and steps["selected"].numel() == 100
    kernel = indexer_topk(values.unsqueeze(0).to(device.KERNEL_DEVICE), n.to(device.KERNEL_DEVICE), 100)
    assert set(kernel[0].tolist()) == reference
    assert steps["above"].numel() < 100 <= steps["above"].numel() + steps["candidates"].numel()


def test_row_path_and_buckets_refuse_bad_arguments():
    with pytest.raises(ValueError, match="more than k = 5 logits"):
        row_path(torch.randn(5), 5)
    with pytest.raises(ValueError, match=r"bits must be in \[1, 16\]"):
        fp16_buckets(torch.randn(5), 17)
