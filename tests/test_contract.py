import numpy as np
import pytest

from preshuffle.contract import check_inputs
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


def test_check_inputs_refuses_tensors_on_meta(args):
    with pytest.raises(ValueError, match="kv_cache is on meta"):
        check_inputs(*(t.to("meta") for t in args[:5]), args[5])


def test_check_inputs_refuses_no_query_rows(args):
    q, kv_cache, weights, context_lens, block_tables, max_model_len = args
    with pytest.raises(ValueError, match=r"q must have next_n >= 1, got \[2, 0, 16, 128\]"):
        check_inputs(q[:, :0], kv_cache, weights[:0], context_lens, block_tables, max_model_len)
