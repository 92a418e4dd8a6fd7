"""The kernels' entry point: precision, which kernel runs where, and the unchecked fast path."""

import re

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from preshuffle import device, kernels
from preshuffle.contract import kv_lengths
from preshuffle.internals import tensor_guard
from preshuffle.kernels import HopperConfig, LaunchConfig, fp8_paged_mqa_logits, kernel_for
from preshuffle.reference import fp8_paged_mqa_logits_ref
from preshuffle.testing.inputs import (key_record, misaligned_copy, random_problem, with_nan_key, with_nan_query,
                                       with_scale)
from preshuffle.testing.numeric import assert_bitwise_equal, check_logits, check_unchecked_logits, meets_contract

DEV = device.KERNEL_DEVICE


@pytest.fixture
def problem():
    return random_problem([70, 129], next_n=2, block_size=16, layout="shuffle", seed=11, device=DEV)


def contract_of(precision):
    """Under Triton's interpreter an fp8 tl.dot is computed exactly (docs/accuracy.md): both precisions are held to the
    exact contract; only a GPU's fp8 accumulator may use the fp8 contract's wider bound."""
    return "exact" if device.INTERPRETED else precision or device.current_support().default_precision


@settings(max_examples=12)
@example(precision="fp8", seed=7, block=(16, "shuffle"), next_n=2, ctx_2d=True, logits_dtype=torch.float32)
@example(precision="fp8", seed=8, block=(64, "normal"), next_n=3, ctx_2d=False, logits_dtype=torch.bfloat16)
@given(precision=st.sampled_from(["exact", "fp8", None]), seed=st.integers(0, 2**16),
       block=st.sampled_from([(1, "normal"), (16, "normal"), (16, "shuffle"), (64, "normal"), (64, "shuffle")]),
       next_n=st.integers(1, 3), ctx_2d=st.booleans(), logits_dtype=st.sampled_from([torch.float32, torch.bfloat16]))
def test_fp8_paged_mqa_logits_holds_the_contract_of_its_precision(precision, seed, block, next_n, ctx_2d,
                                                                  logits_dtype):
    block_size, layout = block
    problem = random_problem([0, 37, 150], next_n=next_n, block_size=block_size, layout=layout, ctx_2d=ctx_2d,
                             seed=seed, device=DEV)
    out = torch.full((problem.batch * next_n, problem.max_model_len), float("nan"), dtype=logits_dtype, device=DEV)
    problem.call(fp8_paged_mqa_logits, precision=precision, out=out, logits_dtype=logits_dtype)
    assert meets_contract(check_logits(out, problem), contract_of(precision), logits_dtype)


def visible_positions(problem) -> torch.Tensor:
    """bool ``[B * next_n, max_model_len]``: where each row may see."""
    lens = kv_lengths(problem.context_lens, problem.next_n).reshape(-1, 1)
    return torch.arange(problem.max_model_len, device=lens.device) < lens


@pytest.mark.parametrize("block_size, layout, next_n, ctx_2d", [
    (64, "normal", 1, False), (16, "shuffle", 2, True), (1, "normal", 3, False), (16, "normal", 4, True)])
def test_bf16_logits_are_the_fp32_logits_rounded_to_nearest_even(block_size, layout, next_n, ctx_2d):
    """Every element, -inf included, holds the fp32 call's logit rounded to nearest even (torch's conversion):
    a kernel that truncated would differ in about half the logits."""
    problem = random_problem([0, 37, 150, 200], next_n=next_n, block_size=block_size, layout=layout, ctx_2d=ctx_2d,
                             seed=20 + next_n, device=DEV)
    fp32 = problem.call(fp8_paged_mqa_logits, precision="fp8")
    out = torch.full(fp32.shape, float("nan"), dtype=torch.bfloat16, device=DEV)
    problem.call(fp8_paged_mqa_logits, precision="fp8", logits_dtype=torch.bfloat16, out=out)
    assert_bitwise_equal(out, fp32.to(torch.bfloat16))
    assert meets_contract(check_logits(out, problem), contract_of("fp8"), torch.bfloat16)


@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("block_size, layout, next_n, ctx_2d", [
    (64, "normal", 1, False), (16, "shuffle", 2, True), (1, "normal", 3, True), (32, "normal", 4, False)])
def test_unclean_logits_are_the_clean_ones_where_a_row_may_see_and_the_fill_past_the_context_is_skipped(
        block_size, layout, next_n, ctx_2d, logits_dtype):
    """``clean_logits=False``: the same bits wherever a row may see; from the end of the 64-position chunk that holds
    a sequence's last visible position on, nothing is written (the -inf fill it saves)."""
    problem = random_problem([0, 37, 150, 64], next_n=next_n, block_size=block_size, layout=layout, ctx_2d=ctx_2d,
                             max_model_len=400, seed=30 + next_n, device=DEV)
    clean = problem.call(fp8_paged_mqa_logits, logits_dtype=logits_dtype)
    out = torch.full(clean.shape, 7.0, dtype=logits_dtype, device=DEV)
    problem.call(fp8_paged_mqa_logits, logits_dtype=logits_dtype, clean_logits=False, out=out)
    visible = visible_positions(problem)
    assert_bitwise_equal(out[visible], clean[visible])
    read = kv_lengths(problem.context_lens, next_n).amax(dim=1).repeat_interleave(next_n).reshape(-1, 1)
    untouched = torch.arange(400, device=read.device) >= (read + 63) // 64 * 64
    assert untouched.sum() > 400 * next_n and (out[untouched] == 7.0).all()


@pytest.mark.parametrize("options, error, message", [
    ({"clean_logits": 0}, TypeError, "clean_logits must be a bool, got int 0"),
    ({"logits_dtype": torch.float16}, ValueError, "logits_dtype must be torch.float32 or torch.bfloat16, got "
                                                  "torch.float16"),
    ({"logits_dtype": torch.bfloat16, "out": torch.zeros(4, 132)}, TypeError,
     "out must be a bfloat16 tensor, got torch.float32"),
])
@pytest.mark.parametrize("check_values", [True, False])
def test_fp8_paged_mqa_logits_names_a_bad_output_option(problem, options, error, message, check_values):
    if "out" in options:
        options = {**options, "out": options["out"].to(DEV)}
    with pytest.raises(error, match=message):
        problem.call(fp8_paged_mqa_logits, check_values=check_values, **options)


@pytest.mark.parametrize("logits_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("clean", [True, False])
def test_unchecked_repeats_take_each_output_option_and_rows_padded_as_deepgemm_pads_them(problem, logits_dtype,
                                                                                         clean):
    """Unchecked calls (kept launches, on an sm90 GPU) give the checked call's logits with either option, into a new
    output or into rows padded to 256: a launch kept for one row stride gives calls of another to the checked path."""
    checked = problem.call(fp8_paged_mqa_logits, clean_logits=clean, logits_dtype=logits_dtype)
    written = torch.ones_like(checked, dtype=torch.bool) if clean else visible_positions(problem)
    rows, width = checked.shape
    for padded in (False, True, False, True):
        buffer = torch.full((rows, 256), 7.0, dtype=logits_dtype, device=DEV)
        out = buffer[:, :width] if padded else None
        got = problem.call(fp8_paged_mqa_logits, check_values=False, clean_logits=clean, logits_dtype=logits_dtype,
                           out=out)
        assert got.dtype == logits_dtype and got.shape == checked.shape
        assert_bitwise_equal(got[written], checked[written])
        assert (buffer[:, width:] == 7.0).all()
        if padded:
            assert got.data_ptr() == buffer.data_ptr() and got.stride() == (256, 1)


def test_fp8_paged_mqa_logits_refuses_an_unknown_precision(problem):
    with pytest.raises(ValueError, match=r"precision must be one of \('exact', 'fp8'\), got 'fp16'"):
        problem.call(fp8_paged_mqa_logits, precision="fp16")


def test_fp8_paged_mqa_logits_names_what_the_gpu_lacks(problem, on):
    on((8, 0), "NVIDIA A100-SXM4-80GB")
    with pytest.raises(ValueError, match=r"NVIDIA A100-SXM4-80GB \(sm80\) cannot run the fp8 kernel path: it lacks "
                                         r"compute capability 8\.9"):
        problem.call(fp8_paged_mqa_logits, precision="fp8")


def test_fp8_paged_mqa_logits_refuses_a_config_of_another_type(problem):
    with pytest.raises(TypeError, match="config must be a HopperConfig or a LaunchConfig, got dict"):
        problem.call(fp8_paged_mqa_logits, config={"chunk": 64})


@pytest.mark.skipif(device.current_support().hopper, reason="this process runs the Hopper kernel")
def test_fp8_paged_mqa_logits_refuses_a_hopper_config_without_hopper(problem):
    with pytest.raises(ValueError, match="a HopperConfig needs an sm90 GPU"):
        problem.call(fp8_paged_mqa_logits, config=HopperConfig(64))


def test_kernel_for_picks_the_hopper_kernel_on_sm90_for_what_it_takes(on):
    on((9, 0), "NVIDIA H200")
    assert kernel_for(64, 64, 128, 1) == kernel_for(16, 32, 128, 4) == "hopper"
    assert kernel_for(1, 64, 128, 1) == kernel_for(8, 64, 128, 2) == "hopper"  # pages TMA cannot copy: gathered
    assert kernel_for(64, 64, 128, 5) == "portable"            # more query rows than its accumulators
    assert kernel_for(64, 64, 128, 1, LaunchConfig()) == "portable"
    with pytest.raises(ValueError, match="the Hopper kernel cannot take this call: next_n 5 is above 4"):
        kernel_for(64, 64, 128, 5, HopperConfig(64))
    # The gather reads natural pages only: preshuffled pages TMA cannot copy go to the portable kernel.
    assert kernel_for(48, 64, 128, 1) == kernel_for(192, 64, 128, 1, layout="shuffle") == "hopper"
    assert kernel_for(48, 64, 128, 1, layout="shuffle") == "portable"
    with pytest.raises(ValueError, match="cannot take this call: preshuffled pages of 80 tokens would be gathered"):
        kernel_for(80, 64, 128, 1, HopperConfig(64), layout="shuffle")


@pytest.mark.parametrize("capability", [(8, 9), (10, 0), None])
def test_kernel_for_picks_the_portable_kernel_elsewhere(on, capability):
    on(capability, "a GPU")
    assert kernel_for(64, 64, 128, 1) == "portable"


def test_fp8_paged_mqa_logits_unchecked_repeat_matches_the_checked_call(problem):
    checked = problem.call(fp8_paged_mqa_logits)
    for _ in range(3):  # the first unchecked call compiles and keeps the launch, the others reuse it
        out = problem.call(fp8_paged_mqa_logits, check_values=False)
        assert torch.equal(out, checked)
    again = torch.empty_like(checked)
    problem.call(fp8_paged_mqa_logits, check_values=False, out=again)
    assert torch.equal(again, checked)


def test_a_kept_launch_serves_only_calls_its_guard_and_key_match(problem, monkeypatch):
    """The unchecked fast path's lookup: the launch kept for a call is found again only by calls whose tensors
    have the same dtypes, devices, sizes and strides, whose cache is at the same address, and whose scalars match;
    its addresses only where all are 16-byte aligned."""
    monkeypatch.setattr(kernels, "_LAUNCHES", {})
    q, kv_cache, weights, context_lens, block_tables, max_model_len = problem.args
    kept = object()

    def keep():  # what the entry point stores once an unchecked call has compiled its launch
        guard = tensor_guard(*problem.args[:5])
        kernels._LAUNCHES[kernels._launch_key(q, kv_cache, max_model_len, problem.layout, "fp8", None)] = \
            kernels._Kept(guard, kept, torch.zeros((), device=DEV).expand(problem.batch * problem.next_n,
                                                                          max_model_len),
                          max_model_len, kv_cache, (q, weights, context_lens, block_tables))

    keep()

    def found(**changes):
        found = problem.replace(**changes).call(kernels._kept_for, precision="fp8")
        return found is not None and found.launch is kept

    assert found()
    assert found(q=q.clone(), weights=weights.clone(), block_tables=block_tables.clone())  # new tensors, same kind
    wider = torch.cat([block_tables, block_tables], dim=1)
    assert not found(block_tables=wider)                                      # sizes
    assert not found(block_tables=wider[:, ::2])                              # strides
    assert not found(weights=weights.t().contiguous().t())                    # strides (not contiguous)
    assert not found(context_lens=context_lens.to(torch.int64))               # dtype
    assert not found(context_lens=context_lens.view(-1, 1).expand(-1, problem.next_n).contiguous())  # 2-D lengths
    assert not found(q=q[:1], weights=weights[:problem.next_n], context_lens=context_lens[:1],
                     block_tables=block_tables[:1])                           # the key's q.shape
    assert not found(kv_cache=kv_cache.clone())                               # the cache's address
    assert not found(max_model_len=max_model_len + 16)
    assert problem.call(kernels._kept_for, precision="exact") is None
    assert problem.call(kernels._kept_for, precision="fp8", clean_logits=False) is None    # the output options
    assert problem.call(kernels._kept_for, precision="fp8", logits_dtype=torch.bfloat16) is None
    if DEV == "cuda":
        assert not found(q=q.cpu(), weights=weights.cpu())                    # devices
    with torch.inference_mode():  # how vLLM calls it: a launch kept there is found there
        keep()
        assert found()
    out = torch.empty(problem.batch * problem.next_n, max_model_len, device=DEV)
    assert kernels._Kept.addresses(q, weights, context_lens, block_tables, out) == tuple(
        t.data_ptr() for t in (q, weights, context_lens, block_tables, out))
    for i in range(5):
        tensors = [q, weights, context_lens, block_tables, out]
        tensors[i] = misaligned_copy(tensors[i])
        assert kernels._Kept.addresses(*tensors) is None, i


def test_an_option_that_only_compares_equal_to_a_bool_finds_no_kept_launch(problem, monkeypatch):
    """1 == True and hash(1) == hash(True): a kept launch keyed by clean_logits=True must not serve clean_logits=1,
    which the checks refuse."""
    monkeypatch.setattr(kernels, "_LAUNCHES", {})
    q, kv_cache, weights, context_lens, block_tables, max_model_len = problem.args
    launched = []
    guard = tensor_guard(*problem.args[:5])
    output = torch.zeros((), device=DEV).expand(problem.batch * problem.next_n, max_model_len)
    kernels._LAUNCHES[kernels._launch_key(q, kv_cache, max_model_len, problem.layout, "fp8", None, True)] = \
        kernels._Kept(guard, lambda *addresses: launched.append(addresses), output, max_model_len, kv_cache,
                      (q, weights, context_lens, block_tables))
    assert problem.call(fp8_paged_mqa_logits, precision="fp8", check_values=False) is not None and launched
    with pytest.raises(TypeError, match="clean_logits must be a bool, got int 1"):
        problem.call(fp8_paged_mqa_logits, precision="fp8", check_values=False, clean_logits=1)
    assert len(launched) == 1


@pytest.mark.parametrize("field, error, message", [
    ("q", TypeError, r"q must be an fp8 tensor .*, got <class 'NoneType'>"),
    ("kv_cache", TypeError, "kv_cache must be a uint8 tensor, got ndarray"),
    ("max_model_len", TypeError, r"max_model_len must be a positive int, got list \[23\]")])
def test_an_unchecked_call_names_an_argument_that_cannot_key_a_kept_launch(problem, field, error, message):
    """The kept-launch key reads q's shape, the cache's address and hashes the scalars before any check runs:
    arguments that cannot make one still meet the checks' errors."""
    bad = {"q": None, "kv_cache": problem.kv_cache.cpu().numpy(), "max_model_len": [23]}[field]
    with pytest.raises(error, match=message):
        problem.replace(**{field: bad}).call(fp8_paged_mqa_logits, check_values=False)


def test_fp8_paged_mqa_logits_takes_a_numpy_max_model_len(problem):
    expected = problem.call(fp8_paged_mqa_logits)
    assert_bitwise_equal(problem.replace(max_model_len=np.int64(problem.max_model_len)).call(fp8_paged_mqa_logits),
                         expected)


@pytest.mark.parametrize("check_values", [True, False])
def test_fp8_paged_mqa_logits_refuses_a_max_model_len_whose_output_cannot_fit(problem, check_values):
    too_long = device.memory_bytes(problem.q.device) // (4 * problem.batch * problem.next_n) + 1
    with pytest.raises(ValueError, match=rf"max_model_len {too_long} asks for 4 rows of {too_long} fp32 logits"):
        problem.replace(max_model_len=too_long).call(fp8_paged_mqa_logits, check_values=check_values)


# The contract for non-finite and non-positive inputs (docs/input-contract.md), on whichever kernel this process
# runs by default (the Hopper kernel on sm90) and on the portable one.
KERNELS = {"default": None, "portable": LaunchConfig()}
BAD_SCALES = [-1.0, -0.0, 0.0, float("nan"), float("inf"), float("-inf")]


@pytest.fixture
def small():
    return random_problem([40, 0, 75], next_n=2, heads=16, block_size=16, seed=3, device=DEV)


@pytest.mark.parametrize("check_values", [True, False])
@pytest.mark.parametrize("precision", ["exact", "fp8"])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("poison", ["query", "key"])
def test_fp8_paged_mqa_logits_gives_nan_wherever_a_nan_in_q_or_a_key_enters(small, kernel, precision, check_values,
                                                                          poison):
    # The relu kept no NaN (maximum(nan, 0) was 0 on a GPU; the interpreter decoded e4m3 NaN as 480).
    poisoned = with_nan_query(small, 2, 1, 5, 17) if poison == "query" else with_nan_key(small, 2, 30, 17)
    out = poisoned.call(fp8_paged_mqa_logits, config=KERNELS[kernel], precision=precision, check_values=check_values)
    verdict = check_unchecked_logits(out, poisoned, poisoned.context_lens, poisoned.block_tables)
    expected_nan = 75 if poison == "query" else 2   # row 5 sees 75 positions; position 30 is seen by both rows
    assert verdict["nan_exact"] and verdict["nan"] == expected_nan, verdict
    assert meets_contract(verdict, contract_of(precision)), verdict


@pytest.mark.parametrize("scale", BAD_SCALES)
@pytest.mark.parametrize("precision", ["exact", "fp8"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_fp8_paged_mqa_logits_refuses_a_bad_scale_checked_and_gives_nan_unchecked(small, kernel, precision, scale):
    # Unchecked before, the kernels factored the scale out of the relu: -1 gave finite wrong logits, inf gave inf.
    bad = with_scale(small, 2, 50, scale)
    block, token = key_record(bad, 2, 50)
    before = bad.kv_cache.clone()
    with pytest.raises(ValueError, match=rf"^kv_cache holds scale {re.escape(str(scale))} at block {block}, token "
                                         rf"{token} \(position 50 of sequence 2\): scales must be finite and "
                                         r"positive$"):
        bad.call(fp8_paged_mqa_logits, config=KERNELS[kernel], precision=precision)
    assert torch.equal(bad.kv_cache, before)
    out = bad.call(fp8_paged_mqa_logits, config=KERNELS[kernel], precision=precision, check_values=False)
    verdict = check_unchecked_logits(out, bad, bad.context_lens, bad.block_tables)
    assert verdict["nan_exact"] and verdict["nan"] == 2, verdict
    assert meets_contract(verdict, contract_of(precision)), verdict


def test_fp8_paged_mqa_logits_reads_no_scale_past_the_context(small):
    # The unwritten token after a context's last (scale 0 in a zeroed cache) is not read: no refusal, no NaN.
    unread = with_scale(small, 2, 75, -1.0)
    precision = device.current_support().default_precision
    assert meets_contract(check_logits(unread.call(fp8_paged_mqa_logits), unread), contract_of(precision))


def overlapping(problem, name: str) -> tuple:
    """``problem`` with input ``name`` moved into a buffer, and an ``out`` on the same buffer whose first bytes are
    that input's last ones."""
    t = getattr(problem, name)
    nbytes = t.numel() * t.element_size()
    rows, length = problem.batch * problem.next_n, problem.max_model_len
    start = (nbytes - 1) // 16 * 16
    buffer = torch.zeros(start + 4 * rows * length, dtype=torch.uint8, device=t.device)
    buffer[:nbytes] = t.contiguous().view(-1).view(torch.uint8)
    moved = buffer[:nbytes].view(t.dtype).view(t.shape)
    out = buffer[start:].view(torch.float32).view(rows, length)
    return problem.replace(**{name: moved}), out, buffer


@pytest.mark.parametrize("check_values", [True, False])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ["kv_cache", "q", "weights", "context_lens", "block_tables"])
def test_fp8_paged_mqa_logits_refuses_an_out_over_an_input(small, name, kernel, check_values):
    # Unchecked before: the logits were written over the cache's bytes (or the queries', the weights', ...).
    problem, out, buffer = overlapping(small, name)
    expected = problem.call(fp8_paged_mqa_logits, config=KERNELS[kernel])
    problem.call(fp8_paged_mqa_logits, config=KERNELS[kernel], check_values=check_values)  # keeps a launch (sm90)
    before = buffer.clone()
    with pytest.raises(ValueError, match=rf"^out overlaps {name} \(out's bytes \[0x"):
        problem.call(fp8_paged_mqa_logits, config=KERNELS[kernel], check_values=check_values, out=out)
    assert torch.equal(buffer, before)
    assert_bitwise_equal(problem.call(fp8_paged_mqa_logits, config=KERNELS[kernel], check_values=check_values,
                                      out=torch.empty_like(expected)), expected)


def test_a_kept_launch_takes_no_out_over_an_input(small, monkeypatch):
    """The unchecked fast path checks a given ``out`` against the spans it keeps, and leaves an overlapping one to
    the checked path (which names the input)."""
    monkeypatch.setattr(kernels, "_LAUNCHES", {})
    for name in ("kv_cache", "q", "weights", "context_lens", "block_tables"):
        problem, over, _ = overlapping(small, name)
        q, kv_cache, weights, context_lens, block_tables, max_model_len = problem.args
        launched = []
        guard = tensor_guard(*problem.args[:5])
        kernels._LAUNCHES[kernels._launch_key(q, kv_cache, max_model_len, "normal", None, None)] = kernels._Kept(
            guard, lambda *addresses: launched.append(addresses), torch.zeros((), device=DEV).expand(over.shape),
            over.stride(0), kv_cache, (q, weights, context_lens, block_tables))
        own = torch.empty_like(over)
        assert problem.call(fp8_paged_mqa_logits, check_values=False, out=own) is own
        assert launched[-1][-1] == own.data_ptr()
        with pytest.raises(ValueError, match=f"^out overlaps {name} "):
            problem.call(fp8_paged_mqa_logits, check_values=False, out=over)
        assert len(launched) == 1, name


def test_fp8_paged_mqa_logits_names_a_cache_off_the_word_grid(small):
    # The reference reads a cache at any byte offset; the kernels raised a storage-offset RuntimeError inside.
    nbytes = small.kv_cache.numel()
    shifted = torch.zeros(nbytes + 1, dtype=torch.uint8, device=DEV)[1:]
    shifted.copy_(small.kv_cache.view(-1))
    problem = small.replace(kv_cache=shifted.view(small.kv_cache.shape))
    assert meets_contract(check_logits(problem.call(fp8_paged_mqa_logits_ref).float(), small), "exact")
    with pytest.raises(ValueError, match=r"^kv_cache must start on a (4|16)-byte boundary for the \w+ kernel, got "
                                         r"address 0x[0-9a-f]+ \(storage offset 1 bytes\): pass kv_cache.clone\(\)$"):
        problem.call(fp8_paged_mqa_logits)


@pytest.mark.parametrize("value", ["no", 0, None])
def test_fp8_paged_mqa_logits_refuses_a_check_values_that_is_no_bool(small, value):
    # "no" was true: the checks ran, and a caller who asked for none was told nothing.
    with pytest.raises(TypeError, match=f"^check_values must be a bool, got {type(value).__name__} {value!r}$"):
        small.call(fp8_paged_mqa_logits, check_values=value)


@pytest.mark.parametrize("args, name", [((-1, 0, 0, 0), "block_size"), ((16, 0, 128, 1), "heads"),
                                        ((16, 64, 128.0, 1), "head_dim"), ((16, 64, 128, 0), "next_n")])
def test_kernel_for_refuses_dimensions_that_are_not_positive_ints(args, name):
    # kernel_for(-1, 0, 0, 0) answered "portable".
    with pytest.raises((TypeError, ValueError), match=f"^{name} must be a positive int"):
        kernel_for(*args)
