import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from preshuffle import deepgemm_compat, device
from preshuffle.cache import read_slots
from preshuffle.contract import (bad_scale_positions, byte_span, cache_scales, check_inputs, check_output_options,
                                 output_tensor, refuse_overlap, unreadable_positions, valid_scales)
from preshuffle.device import memory_bytes
from preshuffle.kernels import fp8_paged_mqa_logits
from preshuffle.teaching.steps import chunked_logits, per_block_grid_logits, portable_logits
from preshuffle.reference import (fp8_paged_mqa_logits_loops, fp8_paged_mqa_logits_ref, fp8_paged_mqa_logits_torch,
                                  logits_magnitude, reference_and_magnitude)
from preshuffle.testing.inputs import key_record, random_problem, with_nan_key, with_nan_query, with_scale
from preshuffle.testing.numeric import check_unchecked_logits, meets_contract


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


def test_byte_span_covers_every_element():
    buffer = torch.zeros(64)
    assert byte_span(buffer) == (buffer.data_ptr(), buffer.data_ptr() + 256)
    strided = buffer.view(8, 8)[1:3, ::2]                         # elements 8..14 and 16..22, every other one
    assert byte_span(strided) == (buffer.data_ptr() + 32, buffer.data_ptr() + 4 * 23)
    first, end = byte_span(buffer[5:5])
    assert first == end                                               # no bytes (torch gives it address 0)


def test_refuse_overlap_compares_byte_ranges_not_tensors():
    buffer = torch.zeros(64)
    refuse_overlap(buffer[32:], first=buffer[:32], other=torch.zeros(8), empty=buffer[40:40])
    with pytest.raises(ValueError, match=r"^out overlaps weights \(out's bytes \[0x[0-9a-f]+, 0x[0-9a-f]+\), weights's "
                                         r"\[0x[0-9a-f]+, 0x[0-9a-f]+\)\): the logits would be written over an input"):
        refuse_overlap(buffer[31:], weights=buffer[:32])
    with pytest.raises(ValueError, match="out overlaps kv_cache"):  # another dtype's view of the same bytes
        refuse_overlap(buffer[:4], kv_cache=buffer.view(torch.uint8)[12:20])


def test_valid_scales_are_the_finite_positive_ones():
    scales = torch.tensor([1e-38, 3.0, 0.0, -0.0, -2.0, math.nan, math.inf, -math.inf])
    assert valid_scales(scales).tolist() == [True, True] + [False] * 6


def test_cache_scales_is_a_view_of_the_cache():
    problem = random_problem([20], heads=16, block_size=16, seed=2, device="cpu")
    scales = cache_scales(problem.kv_cache)
    block, token = key_record(problem, 0, 18)
    assert scales[block, token] == read_slots(problem.kv_cache, torch.tensor([block * 16 + token]))[1]
    scales[block, token] = -1.0
    assert read_slots(problem.kv_cache, torch.tensor([block * 16 + token]))[1].item() == -1.0


def test_bad_scale_positions_by_hand():
    problem = random_problem([7, 11], next_n=2, heads=16, block_size=4, seed=0, device="cpu")
    bad = with_scale(with_scale(problem, 0, 5, -1.0), 1, 10, math.nan)
    mask = bad_scale_positions(bad.kv_cache, bad.context_lens, bad.block_tables, 2, bad.max_model_len)
    expected = torch.zeros(4, bad.max_model_len, dtype=torch.bool)
    expected[0, 5] = expected[1, 5] = True       # row j of sequence 0 sees p <= 5 + j
    expected[3, 10] = True                       # only the second row of sequence 1 sees position 10
    assert torch.equal(mask, expected)


def test_check_inputs_refuses_a_bad_scale_only_where_a_row_reads(args):
    problem = random_problem([20, 7], next_n=2, heads=16, block_size=16, seed=1, device="cpu")
    block, token = key_record(problem, 1, 6)
    with pytest.raises(ValueError, match=rf"^kv_cache holds scale -0.0 at block {block}, token {token} \(position 6 "
                                         r"of sequence 1\): scales must be finite and positive$"):
        check_inputs(*with_scale(problem, 1, 6, -0.0).args)
    assert check_inputs(*with_scale(problem, 1, 7, -0.0).args).batch == 2      # position 7 is past the context
    assert check_inputs(*with_scale(problem, 1, 6, -0.0).args, check_values=False).batch == 2


@pytest.mark.parametrize("value", ["no", 1, None])
def test_check_inputs_refuses_a_check_values_that_is_no_bool(args, value):
    with pytest.raises(TypeError, match="^check_values must be a bool"):
        check_inputs(*args, check_values=value)


# The contract for non-finite and non-positive inputs, drawn at random for every public kernel entry point: NaN in
# q, the keys or the weights gives NaN exactly where it enters; a scale that is not finite and positive is refused
# by a checked call, NaN in an unchecked one; an out over any input is refused; nothing refused changes the cache.
BAD_SCALES = (-1.0, -1e-3, -0.0, 0.0, math.nan, math.inf, -math.inf)
ENTRIES = {  # name -> (function, whether it checks values, what it takes)
    "kernel": (lambda p, **kw: p.call(fp8_paged_mqa_logits, **kw), True, "any"),
    "kernel unchecked": (lambda p, **kw: p.call(fp8_paged_mqa_logits, check_values=False, **kw), False, "any"),
    "reference": (lambda p: p.call(fp8_paged_mqa_logits_ref), True, "any"),
    "loops": (lambda p: p.call(fp8_paged_mqa_logits_loops), True, "any"),
    "magnitude": (lambda p: p.call(logits_magnitude), True, "magnitude"),
    "reference and magnitude": (lambda p: p.call(reference_and_magnitude)[0], True, "any"),
    "torch": (lambda p: p.call(fp8_paged_mqa_logits_torch), False, "any"),
    "step 2": (lambda p: p.call(per_block_grid_logits), True, "step 2"),
    "chunked": (lambda p: p.call(chunked_logits, keys_as_a=True, scale_after_sum=True), True, "any"),
    "portable steps": (lambda p: p.call(portable_logits), True, "any"),
    "deepgemm_compat": (lambda p: deepgemm_api(p, False), False, "any"),
    "deepgemm_compat checked": (lambda p: deepgemm_api(p, True), True, "any"),
}


def deepgemm_api(p, check_values: bool):
    """DeepGEMM's call on the package's kernels, every position written (its default leaves the masked ones)."""
    schedule = deepgemm_compat.get_paged_mqa_logits_metadata(p.context_lens, p.block_size,
                                                             deepgemm_compat.get_num_sms())
    precision = device.current_support().default_precision
    return deepgemm_compat.fp8_fp4_paged_mqa_logits((p.q, None), p.kv_cache, p.weights, p.context_lens,
                                                    p.block_tables, schedule, p.max_model_len, clean_logits=True,
                                                    layout=p.layout, precision=precision, check_values=check_values)


# Caches drawn from: on a GPU fewer, since each compiles kernels of its own.
BLOCKS = [(1, "normal"), (16, "normal"), (16, "shuffle"), (32, "normal")] if device.INTERPRETED else \
    [(1, "normal"), (16, "normal"), (16, "shuffle")]


@st.composite
def poisoned_problems(draw):
    block_size, layout = draw(st.sampled_from(BLOCKS))
    lens = draw(st.lists(st.integers(0, 40), min_size=1, max_size=3))
    next_n = draw(st.integers(1, 2))
    problem = random_problem(lens, next_n=next_n, heads=16, block_size=block_size, layout=layout,
                             seed=draw(st.integers(0, 999)), device=device.KERNEL_DEVICE)
    read = [b for b, n in enumerate(lens) if n] or [0]
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["query", "key", "weight", "scale"]))
        sequence = draw(st.sampled_from(read))
        if kind == "query":
            problem = with_nan_query(problem, sequence, draw(st.integers(0, next_n - 1)), draw(st.integers(0, 15)),
                                     draw(st.integers(0, 127)))
        elif kind == "weight":
            weights = problem.weights.clone()
            weights[sequence * next_n + draw(st.integers(0, next_n - 1)), draw(st.integers(0, 15))] = math.nan
            problem = problem.replace(weights=weights)
        elif lens[sequence]:
            position = draw(st.integers(0, lens[sequence] - 1))
            if kind == "key":
                problem = with_nan_key(problem, sequence, position, draw(st.integers(0, 127)))
            else:
                problem = with_scale(problem, sequence, position, draw(st.sampled_from(BAD_SCALES)))
    return problem


@settings(max_examples=300)
@given(problem=poisoned_problems(), entry=st.sampled_from(sorted(ENTRIES)), overlap=st.booleans())
def test_every_entry_point_holds_the_contract_for_non_finite_inputs(problem, entry, overlap):
    fn, checked, takes = ENTRIES[entry]
    if takes == "step 2" and (problem.next_n != 1 or problem.block_size < 16 or problem.layout != "normal"):
        return
    cache = problem.kv_cache.clone()
    refused = None
    bad_scales = bad_scale_positions(problem.kv_cache, problem.context_lens, problem.block_tables, problem.next_n,
                                     problem.max_model_len).any()
    if overlap and entry.startswith("kernel"):  # (the DeepGEMM call makes its own output)
        shape = (problem.batch * problem.next_n, problem.max_model_len)
        buffer = torch.zeros(problem.kv_cache.numel() + 4 * shape[0] * shape[1], dtype=torch.uint8,
                             device=problem.kv_cache.device)
        buffer[:problem.kv_cache.numel()] = problem.kv_cache.view(-1)
        problem = problem.replace(kv_cache=buffer[:problem.kv_cache.numel()].view(problem.kv_cache.shape))
        out = buffer[-4 * shape[0] * shape[1] - 16:-16].view(torch.float32).view(shape)
        if shape[0] * shape[1] >= 4:  # an out of 16 bytes or more reaches into the cache
            refusal = "^kv_cache holds scale " if checked and bad_scales else "^out overlaps kv_cache"
            with pytest.raises(ValueError, match=refusal):
                fn(problem, out=out)
            assert torch.equal(problem.kv_cache, cache)
            return
    try:
        out = fn(problem)
    except ValueError as error:
        refused = str(error)
    assert torch.equal(problem.kv_cache, cache)
    if checked and bad_scales:
        assert refused and refused.startswith("kv_cache holds scale "), refused
        return
    assert refused is None, refused
    if takes == "magnitude":  # the reference of the weights' magnitudes
        problem = problem.replace(weights=problem.weights.abs())
    verdict = check_unchecked_logits(out.float(), problem, problem.context_lens, problem.block_tables)
    assert verdict["nan_exact"], verdict
    # The kernels run their default precision (fp8 on a GPU with fp8 MMAs); the references and steps are exact.
    precision = "exact" if device.INTERPRETED or not entry.startswith(("kernel", "deepgemm")) else \
        device.current_support().default_precision
    assert meets_contract(verdict, precision), verdict
