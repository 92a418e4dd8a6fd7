"""DeepGEMM's own test in our words: its cases are DeepGEMM's SM90 enumeration, its inputs are built as DeepGEMM
builds them, its references hold, and each of its checks can fail."""

import pytest
import torch

from preshuffle import deepgemm_compat, device
from preshuffle.layout import preshuffle
from preshuffle.problem import PagedMQAProblem
from preshuffle.reference import reference_and_magnitude
from preshuffle.testing import deepgemm_checks
from preshuffle.testing.deepgemm_checks import PagedCase
from preshuffle.testing.numeric import calc_diff

DEV = device.KERNEL_DEVICE


def test_the_sm90_cases_are_deepgemms_enumeration_and_ours_go_beyond():
    sm90 = deepgemm_checks.SM90_CASES
    # logits bf16 and fp32 x B 256 and 4096 x next_n 1 and 2 x 32 and 64 heads x 8K and 64K, but 4096 x 64K
    assert len(sm90) == 24 and {(c.batch, c.avg_kv) for c in sm90} == {(256, 8192), (256, 65536), (4096, 8192)}
    assert {c.next_n for c in sm90} == {1, 2} and {c.heads for c in sm90} == {32, 64}
    assert {c.logits_dtype for c in sm90} == {torch.float32, torch.bfloat16}
    assert all(c.block_kv == 64 and c.layout == "normal" and not c.clean_logits for c in sm90)
    assert {(c.next_n, c.block_kv, c.layout, c.logits_dtype) for c in deepgemm_checks.OUR_CASES} == {
        (n, 16, layout, dtype) for n in (3, 4) for layout in ("normal", "shuffle")
        for dtype in (torch.float32, torch.bfloat16)}
    assert PagedCase(2, 3, 16, 100, torch.bfloat16, 16, "shuffle", True).label == (
        "B=2 next_n=3 H=16 L=100 bf16 logits, 16-token preshuffled pages, clean")


@pytest.mark.parametrize("layout", ["normal", "shuffle"])
def test_paged_inputs_are_built_as_deepgemm_builds_them(layout):
    case = PagedCase(5, 3, 16, 100, block_kv=16, layout=layout)
    inputs = deepgemm_checks.paged_inputs(case, seed=3, device=DEV)
    lens = inputs.context_lens
    assert inputs.q.dtype == torch.float8_e4m3fn and inputs.q.shape == (5, 3, 16, 128)
    assert lens.dtype == torch.int32 and lens.shape == (5, 3) and lens.is_contiguous()
    context = lens[:, -1]                                  # the last row sees the whole context
    assert ((70 <= context) & (context < 130)).all() and (lens <= context[:, None]).all() and (lens >= 0).all()
    blocks = (context + 15) // 16
    assert inputs.max_context_len == int(blocks.max()) * 16
    used = torch.cat([inputs.block_table[b, :n] for b, n in enumerate(blocks.tolist())])
    assert sorted(used.tolist()) == list(range(inputs.kv_cache.shape[0]))  # one permutation of every page
    visible = torch.arange(inputs.max_context_len, device=DEV) < lens.reshape(-1, 1)
    assert torch.equal(inputs.hidden, ~visible)
    # The cache holds e4m3 keys with their scales: its float64 reference is the simulated one up to bf16 rounding.
    # Both references score every row over the whole context, and so does this one.
    whole = context[:, None].expand(-1, 3).contiguous()
    problem = PagedMQAProblem(inputs.q, inputs.kv_cache, inputs.weights, whole, inputs.block_table,
                              inputs.max_context_len, layout)
    exact, _ = problem.call(reference_and_magnitude)
    assert torch.equal(torch.isneginf(inputs.simulated), torch.isneginf(exact))
    assert calc_diff(inputs.simulated, exact) < 1e-5                       # bf16 scores
    assert 1e-4 < calc_diff(inputs.reference, exact) < 3e-3                # before the fp8 casts
    if layout == "shuffle":
        natural = deepgemm_checks.paged_inputs(PagedCase(5, 3, 16, 100, block_kv=16), seed=3, device=DEV)
        flat = natural.kv_cache.view(natural.kv_cache.shape[0], -1)
        assert torch.equal(inputs.kv_cache.view(flat.shape)[:, :16 * 128],
                           preshuffle(flat[:, :16 * 128].view(-1, 16, 128)))
        assert torch.equal(inputs.kv_cache.view(flat.shape)[:, 16 * 128:], flat[:, 16 * 128:])


def test_deepgemms_checks_can_fail():
    """Each check on its own: a rerun that differs, a wrong dtype, logits off by 1e-2, -inf missing with clean."""
    case = next(case for case in deepgemm_checks.CPU_CASES if case.clean_logits)
    inputs = deepgemm_checks.paged_inputs(case, seed=9, device=DEV)
    good = deepgemm_checks.call_of(deepgemm_compat, inputs)
    assert deepgemm_checks.check(good, inputs, reruns=2)["passed"]
    runs = []

    def drifting():
        runs.append(None)
        out = good()
        out[-1, 0] += len(runs)  # the last row sees every position of its sequence
        return out

    failures = {
        "bitwise_repeatable": drifting,
        "dtype": lambda: good().float(),
        "diff": lambda: good() * 1.1,
        "mask_exact": lambda: good().masked_fill(inputs.hidden, 0.0),
    }
    for check, fn in failures.items():
        verdict = deepgemm_checks.check(fn, inputs, reruns=2)
        assert not verdict["passed"], check
        assert verdict[check] in (False, "float32") or verdict[check] > deepgemm_checks.DIFF_BOUND, (check, verdict)
