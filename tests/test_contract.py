import numpy as np
import pytest
import torch

from preshuffle.contract import check_inputs, output_tensor, unreadable_positions
from preshuffle.device import memory_bytes
from preshuffle.testing.inputs import random_problem


@pytest.fixture
def args():
    return random_problem([20, 7], next_n=2, heads=16, block_size=16, seed=1, device="cpu").args


def test_check_inputs_takes_a_numpy_max_model_len(args):
    assert check_inputs(*args[:5], np.int64(30)).max_model_len == 30


@pytest.mark.parametrize("value, exc", [(30.0, TypeError), (True, TypeError), (0, ValueError)])
def test_check_inputs_bad_max_model_len(args, value, exc):
    with pytest.raises(exc, match="max_model_len must be a positive int"):
        check_inputs(*args[:5], value)


def test_check_inputs_refuses_a_max_model_len_whose_output_cannot_fit(args):
    rows = 2 * 2  # batch x next_n
    too_long = memory_bytes(torch.device("cpu")) // (4 * rows) + 1
    with pytest.raises(ValueError, match=rf"max_model_len {too_long} asks for 4 rows of {too_long} fp32 logits "
                                         r"\([0-9.]+ GiB\), more than the cpu device's [0-9.]+ GiB of memory"):
        check_inputs(*args[:5], too_long)
    assert check_inputs(*args[:5], too_long // 2).max_model_len == too_long // 2  # fits: the check allocates nothing


def test_check_inputs_refuses_tensors_on_meta(args):
    with pytest.raises(ValueError, match="kv_cache is on meta"):
        check_inputs(*(t.to("meta") for t in args[:5]), args[5])


@pytest.mark.parametrize("index", [0, 2, 3, 4])  # q, weights, context_lens or block_tables; kv_cache on the CPU
def test_check_inputs_refuses_tensors_on_two_devices(args, index):
    moved = [t.to("meta") if i == index else t for i, t in enumerate(args[:5])]
    with pytest.raises(ValueError, match=r"^all tensors must be on one device, got \['cpu', 'meta'\]$"):
        check_inputs(*moved, args[5])


def test_check_inputs_refuses_no_query_rows(args):
    q, kv_cache, weights, context_lens, block_tables, max_model_len = args
    with pytest.raises(ValueError, match=r"q must have next_n >= 1, got \[2, 0, 16, 128\]"):
        check_inputs(q[:, :0], kv_cache, weights[:0], context_lens, block_tables, max_model_len)


@pytest.mark.parametrize("out, exc, message", [
    ([[0.0] * 3] * 2, TypeError, "out must be a float32 tensor, got list"),
    (torch.zeros(2, 3, dtype=torch.float64), TypeError, "out must be a float32 tensor, got torch.float64"),
    (torch.zeros(3, 2), ValueError, r"out must be a contiguous float32 tensor of shape \[2, 3\] on cpu, got \[3, 2\]"),
    (torch.zeros(3, 2).t(), ValueError, r"got \[2, 3\] on cpu, not contiguous"),
])
def test_output_tensor_refuses_a_bad_out(out, exc, message):
    with pytest.raises(exc, match=message):
        output_tensor(out, (2, 3), torch.device("cpu"))


def test_output_tensor_takes_a_matching_out():
    out = torch.zeros(2, 3)
    assert output_tensor(out, (2, 3), torch.device("cpu")) is out


def test_unreadable_positions_by_hand():
    # Two sequences, next_n 2, blocks of 4 tokens, 3 blocks in the cache, tables two entries wide.
    context_lens = torch.tensor([7, 11], dtype=torch.int32)   # row j sees p <= len - 2 + j
    block_tables = torch.tensor([[0, 3], [-1, 2]], dtype=torch.int32)
    mask = unreadable_positions(context_lens, block_tables, num_blocks=3, block_size=4, next_n=2, max_model_len=12)
    expected = torch.zeros(4, 12, dtype=torch.bool)
    expected[0, 4:6] = expected[1, 4:7] = True     # block id 3 is past the cache
    expected[2, 0:4] = expected[3, 0:4] = True     # block id -1
    expected[2, 8:10] = expected[3, 8:11] = True   # positions 8.. have no table entry
    assert torch.equal(mask, expected)
    two_d = unreadable_positions(torch.tensor([[5, 0], [9, 12]], dtype=torch.int32), block_tables, num_blocks=3,
                                 block_size=4, next_n=2, max_model_len=12)
    assert two_d.sum(dim=1).tolist() == [1, 0, 5, 8]
