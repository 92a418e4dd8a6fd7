"""The DeepGEMM-compatible API: DeepGEMM's names, argument order and output, what vLLM passes it, what it refuses, and
DeepGEMM's own test of the paged path (preshuffle.testing.deepgemm_checks) pointed at it: its small cases under
Triton's interpreter, every SM90 case DeepGEMM enumerates and ours beyond them on a GPU."""

import inspect

import pytest
import torch

from preshuffle import deepgemm_compat as dg, device
from preshuffle.contract import kv_lengths, unreadable_positions
from preshuffle.deepgemm import masked_like
from preshuffle.kernels import fp8_paged_mqa_logits
from preshuffle.reference import reference_and_magnitude
from preshuffle.testing import deepgemm_checks
from preshuffle.testing.inputs import random_problem
from preshuffle.testing.numeric import assert_bitwise_equal, compare_logits, meets_contract

DEV = device.KERNEL_DEVICE
CONTRACT = "exact" if device.INTERPRETED else "fp8"  # the interpreter computes an fp8 dot exactly


@pytest.fixture
def problem():
    """What vLLM passes: 2-D lengths, block tables wider than the contexts need."""
    return random_problem([70, 200, 1], next_n=2, heads=32, block_size=64, ctx_2d=True, spare_columns=3, seed=4,
                          device=DEV)


def call(problem, **kwargs):
    q, kv_cache, weights, context_lens, block_tables, max_model_len = problem.args
    schedule = dg.get_paged_mqa_logits_metadata(context_lens, problem.block_size, dg.get_num_sms())
    return dg.fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, context_lens, block_tables, schedule,
                                       max_model_len, **kwargs)


def test_the_names_and_argument_order_are_deepgemms():
    """DeepGEMM 54e2261's Python names and positional arguments (csrc/apis/attention.hpp), defaults included."""
    def params(fn):
        return [(p.name, p.default) for p in inspect.signature(fn).parameters.values()
                if p.kind is p.POSITIONAL_OR_KEYWORD]

    empty = inspect.Parameter.empty
    head = [("q", empty), ("kv_cache", empty), ("weights", empty), ("context_lens", empty), ("block_table", empty),
            ("schedule_meta", empty), ("max_context_len", empty), ("clean_logits", False)]
    assert params(dg.fp8_fp4_paged_mqa_logits) == head + [("logits_dtype", torch.float32), ("indices", None)]
    assert params(dg.fp8_paged_mqa_logits) == head + [("indices", None)]
    assert params(dg.get_paged_mqa_logits_metadata) == [("context_lens", empty), ("block_kv", empty),
                                                        ("num_sms", empty), ("indices", None)]


@pytest.mark.parametrize("max_context_len, logits_dtype, stride", [
    (1000, torch.float32, 1024), (1100, torch.float32, 1280), (1000, torch.bfloat16, 1024),
    (1100, torch.bfloat16, 1536), (256, torch.float32, 256), (256, torch.bfloat16, 512)])
def test_padded_row_is_deepgemms_row_stride(max_context_len, logits_dtype, stride):
    """A multiple of 256 positions, then of 1 KiB: 256 fp32 logits, 512 bf16."""
    assert dg.padded_row(max_context_len, logits_dtype) == stride


@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16])
def test_the_output_is_deepgemms_view_of_padded_rows_holding_the_kernels_logits(problem, logits_dtype):
    out = call(problem, logits_dtype=logits_dtype)
    rows, width = problem.batch * problem.next_n, problem.max_model_len
    assert out.shape == (rows, width) and out.dtype == logits_dtype
    assert out.stride() == (dg.padded_row(width, logits_dtype), 1)
    kernels = problem.call(fp8_paged_mqa_logits, precision="fp8", logits_dtype=logits_dtype)
    visible = torch.arange(width, device=DEV) < kv_lengths(problem.context_lens, problem.next_n).reshape(-1, 1)
    assert_bitwise_equal(out[visible], kernels[visible])
    ref, magnitude = problem.call(reference_and_magnitude)
    assert meets_contract(compare_logits(masked_like(out, ref), ref, magnitude), CONTRACT, logits_dtype)


def test_clean_logits_gives_minus_inf_wherever_a_row_may_not_see_even_with_2d_lengths(problem):
    ref, magnitude = problem.call(reference_and_magnitude)
    verdict = compare_logits(call(problem, clean_logits=True), ref, magnitude)
    assert verdict["same_inf_pattern"] and meets_contract(verdict, CONTRACT)


def test_fp8_paged_mqa_logits_is_the_fp32_call_of_a_bare_q(problem):
    q, kv_cache, weights, context_lens, block_tables, max_model_len = problem.args
    schedule = dg.get_paged_mqa_logits_metadata(context_lens, 64, 4)
    legacy = dg.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, schedule, max_model_len, True)
    assert legacy.dtype == torch.float32
    assert_bitwise_equal(legacy, call(problem, clean_logits=True))


@pytest.mark.parametrize("block_size, layout, next_n", [(1, "normal", 3), (16, "shuffle", 4), (32, "normal", 1),
                                                        (128, "shuffle", 2)])
def test_it_takes_what_deepgemms_sm90_kernel_does_not(block_size, layout, next_n):
    """next_n 3 and 4, pages of 1, 16, 32 and 128 tokens, preshuffled pages (a keyword), 16 heads, 1-D lengths."""
    problem = random_problem([40, 130], next_n=next_n, heads=16, block_size=block_size, layout=layout,
                             ctx_2d=next_n != 1, spare_columns=2, seed=block_size, device=DEV)
    ref, magnitude = problem.call(reference_and_magnitude)
    out = call(problem, layout=layout, clean_logits=True)
    assert meets_contract(compare_logits(out, ref, magnitude), CONTRACT)


def test_it_reads_no_length_or_block_id_on_the_host_and_gives_nan_where_a_key_cannot_be_read(problem):
    """An invalid block id is not refused (that would take a device sync): the logits that would read it are NaN."""
    tables = problem.block_tables.clone()
    tables[1, 1] = problem.num_blocks + 3
    bad = problem.replace(block_tables=tables)
    out = call(bad, clean_logits=True)
    nan = unreadable_positions(problem.context_lens, tables, problem.num_blocks, 64, 2, problem.max_model_len)
    assert nan.any() and torch.equal(torch.isnan(out), nan.to(out.device))
    with pytest.raises(ValueError, match=rf"block_tables holds block id {problem.num_blocks + 3} outside "
                                         rf"\[0, {problem.num_blocks}\)"):
        call(bad, check_values=True)


@pytest.mark.parametrize("change, error, message", [
    ({"q": "q"}, TypeError, r"^fp8_fp4_paged_mqa_logits: q must be the pair \(values, scales\), \(q, None\) for fp8 "
                            r"queries, got Tensor$"),
    ({"scales": True}, ValueError, r"^fp8_fp4_paged_mqa_logits: fp4 queries \(q with scales\) are not supported"),
    ({"indices": True}, ValueError, r"^fp8_fp4_paged_mqa_logits: varlen indices are not supported"),
    ({"schedule": "int64"}, TypeError, r"^fp8_fp4_paged_mqa_logits: schedule_meta must be the int32 tensor "
                                       r"get_paged_mqa_logits_metadata returns, got torch.int64$"),
    ({"schedule": "shape"}, ValueError, r"^fp8_fp4_paged_mqa_logits: schedule_meta must be \[num_sms \+ 1, 2\], got "
                                        r"\[5, 3\]$"),
    ({"schedule": "none"}, TypeError, r"schedule_meta must be the int32 tensor .*, got NoneType$"),
    ({"max_context_len": 0}, ValueError, r"^max_context_len must be a positive int, got 0$"),
    ({"max_context_len": 2.5}, TypeError, r"^max_context_len must be a positive int, got float 2.5$"),
    ({"logits_dtype": torch.float16}, ValueError, r"logits_dtype must be torch.float32 or torch.bfloat16"),
    ({"weights": "bf16"}, TypeError, r"^weights must be a float32 tensor, got torch.bfloat16$"),
    ({"q_dtype": torch.float8_e4m3fnuz}, TypeError, r"the kernels take q as torch.float8_e4m3fn, got "
                                                     r"torch.float8_e4m3fnuz"),
])
def test_it_refuses_what_it_cannot_do_naming_what_failed(problem, change, error, message):
    q, kv_cache, weights, context_lens, block_tables, max_model_len = problem.args
    schedule = dg.get_paged_mqa_logits_metadata(context_lens, 64, 4)
    pair = (q, torch.zeros(q.shape[:3], dtype=torch.int32, device=DEV) if change.get("scales") else None)
    if "q_dtype" in change:
        pair = (q.float().to(change["q_dtype"]), None)
    schedule = {"int64": schedule.long(), "shape": torch.zeros(5, 3, dtype=torch.int32, device=DEV),
                "none": None}.get(change.get("schedule"), schedule)
    args = [q if "q" in change else pair, kv_cache,
            weights.to(torch.bfloat16) if "weights" in change else weights, context_lens, block_tables, schedule,
            change.get("max_context_len", max_model_len), False, change.get("logits_dtype", torch.float32),
            context_lens[:, 0] if change.get("indices") else None]
    with pytest.raises(error, match=message):
        dg.fp8_fp4_paged_mqa_logits(*args)


def test_a_schedule_on_another_device_is_refused(problem):
    if DEV == "cpu":
        pytest.skip("needs a second device")
    q, kv_cache, weights, context_lens, block_tables, max_model_len = problem.args
    with pytest.raises(ValueError, match="schedule_meta is on cpu, q on cuda"):
        dg.fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, context_lens, block_tables,
                                    torch.zeros(5, 2, dtype=torch.int32), max_model_len)


def test_get_paged_mqa_logits_metadata_has_deepgemms_shape(problem):
    meta = dg.get_paged_mqa_logits_metadata(problem.context_lens, 64, 132)
    assert meta.shape == (133, 2) and meta.dtype == torch.int32 and meta.device == problem.context_lens.device
    assert dg.get_paged_mqa_logits_metadata(problem.context_lens, 64, 66).shape == (67, 2)  # nv_dev's next_n = 4
    assert dg.get_num_sms() == (1 if device.INTERPRETED else torch.cuda.get_device_properties(0).multi_processor_count)


@pytest.mark.parametrize("args, error, message", [
    ((torch.zeros(2, 2), 64, 4), TypeError, r"^get_paged_mqa_logits_metadata: context_lens must be an int32 tensor "
                                            r"\[batch, next_n\], got torch.float32$"),
    ((torch.zeros(2, 2, 2, dtype=torch.int32), 64, 4), ValueError, r"context_lens must be \[batch, next_n\] \(or "
                                                                   r"\[batch\]\), got \[2, 2, 2\]"),
    ((torch.zeros(2, 2, dtype=torch.int32), 0, 4), ValueError, "^block_kv must be a positive int, got 0$"),
    ((torch.zeros(2, 2, dtype=torch.int32), 64, True), TypeError, "^num_sms must be a positive int, got bool True$"),
    ((torch.zeros(2, 2, dtype=torch.int32), 64, 4, torch.zeros(2, dtype=torch.int32)), ValueError,
     "^get_paged_mqa_logits_metadata: varlen indices are not supported"),
])
def test_get_paged_mqa_logits_metadata_refuses_what_deepgemm_would(args, error, message):
    with pytest.raises(error, match=message):
        dg.get_paged_mqa_logits_metadata(*args)


def test_an_output_the_device_cannot_hold_is_refused_before_it_is_allocated(problem):
    q, kv_cache, weights, context_lens, block_tables, _ = problem.args
    too_long = device.memory_bytes(q.device) // (4 * 4) + 1
    with pytest.raises(ValueError, match=rf"max_context_len {too_long} asks for 6 rows of \d+ torch.float32 logits"):
        dg.fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, context_lens, block_tables,
                                    dg.get_paged_mqa_logits_metadata(context_lens, 64, 4), too_long)


# Every SM90 case DeepGEMM enumerates (batches of 256 and 4096, contexts to 64K) runs on a GPU in
# benchmarks/deepgemm_test_gpu.py, beside DeepGEMM itself on the same inputs; the suite keeps to sizes it can
# repeat on every run.
CASES = deepgemm_checks.CPU_CASES if device.INTERPRETED else deepgemm_checks.CPU_CASES + deepgemm_checks.OUR_CASES


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.label)
def test_deepgemms_own_test_passes_on_this_module(case):
    """DeepGEMM's test_paged_mqa_logits, its inputs, checks and tolerances, on this module: its small cases, and
    on a GPU ours too (next_n 3 and 4, 16-token natural and preshuffled pages)."""
    inputs = deepgemm_checks.paged_inputs(case, seed=CASES.index(case), device=DEV)
    verdict = deepgemm_checks.check(deepgemm_checks.call_of(dg, inputs), inputs)
    assert verdict["passed"], verdict
