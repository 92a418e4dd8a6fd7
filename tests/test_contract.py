import numpy as np
import pytest
import torch

from preshuffle.contract import check_inputs, check_output_options, output_tensor, unreadable_positions
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
    (torch.zeros(3, 2), ValueError,
     r"out must be a float32 tensor of shape \[2, 3\] on cpu with contiguous rows, got \[3, 2\] on cpu$"),
    (torch.zeros(3, 2).t(), ValueError, r"got \[2, 3\] on cpu, rows not contiguous"),
    (torch.zeros(2, 5)[:, ::2], ValueError, r"got \[2, 3\] on cpu, rows not contiguous"),
    (torch.zeros(8).as_strided((2, 3), (2, 1)), ValueError, r"rows not contiguous"),  # rows that overlap
    (torch.zeros(2, 3, dtype=torch.bfloat16), TypeError, "out must be a float32 tensor, got torch.bfloat16"),
])
def test_output_tensor_refuses_a_bad_out(out, exc, message):
    with pytest.raises(exc, match=message):
        output_tensor(out, (2, 3), torch.device("cpu"))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_output_tensor_takes_a_matching_out_and_rows_padded_as_deepgemm_pads_them(dtype):
    out = torch.zeros(2, 3, dtype=dtype)
    assert output_tensor(out, (2, 3), torch.device("cpu"), dtype) is out
    padded = torch.zeros(2, 256, dtype=dtype)[:, :3]
    assert output_tensor(padded, (2, 3), torch.device("cpu"), dtype) is padded
    new = output_tensor(None, (2, 3), torch.device("cpu"), dtype)
    assert new.dtype == dtype and new.shape == (2, 3) and new.is_contiguous()
    with pytest.raises(TypeError, match="out must be a bfloat16 tensor, got torch.float32"):
        output_tensor(torch.zeros(2, 3), (2, 3), torch.device("cpu"), torch.bfloat16)


@pytest.mark.parametrize("clean_logits, logits_dtype, exc, message", [
    (1, torch.float32, TypeError, "clean_logits must be a bool, got int 1"),
    (None, torch.float32, TypeError, "clean_logits must be a bool, got NoneType None"),
    (True, torch.float16, ValueError, "logits_dtype must be torch.float32 or torch.bfloat16, got torch.float16"),
    (False, "bfloat16", TypeError, "logits_dtype must be torch.float32 or torch.bfloat16, got str 'bfloat16'"),
])
def test_check_output_options_names_a_bad_option(clean_logits, logits_dtype, exc, message):
    with pytest.raises(exc, match=message):
        check_output_options(clean_logits, logits_dtype)
    for dtype in (torch.float32, torch.bfloat16):
        check_output_options(False, dtype)


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
