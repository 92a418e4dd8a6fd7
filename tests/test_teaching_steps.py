import sys

import pytest
import torch

from preshuffle import contract, device
from preshuffle.kernels import LaunchConfig
from preshuffle.teaching import steps
from preshuffle.teaching.steps import chunked_logits, one_block_logits, per_block_grid_logits, portable_logits
from preshuffle.reference import fp8_paged_mqa_logits_ref, logits_magnitude
from preshuffle.testing.inputs import key_record, random_problem, with_nan_key, with_nan_query, with_scale
from preshuffle.testing.numeric import (RTOL, assert_bitwise_equal, check_logits, check_unchecked_logits,
                                        compare_logits)

DEV = device.KERNEL_DEVICE


@pytest.fixture
def problem():
    return random_problem([40, 17, 0], block_size=16, seed=7, device=DEV)


def test_per_block_grid_logits_matches_the_reference(problem):
    verdict = check_logits(problem.call(per_block_grid_logits), problem)
    assert verdict["same_inf_pattern"] and verdict["max_rel_error"] < 1e-5
    with pytest.raises(ValueError, match="step 3's grid handles next_n = 1"):
        random_problem([5], next_n=2, block_size=16, device=DEV).call(per_block_grid_logits)
    with pytest.raises(ValueError, match="the normal layout only, got .* layout 'shuffle'"):
        random_problem([5], block_size=16, layout="shuffle", device=DEV).call(per_block_grid_logits)


def test_per_block_grid_logits_rejects_what_it_cannot_run(problem):
    with pytest.raises(TypeError, match="q must be torch.float8_e4m3fn for step 3's grid, got torch.float8_e4m3fnuz"):
        problem.replace(q=problem.q.to(torch.float8_e4m3fnuz)).call(per_block_grid_logits)  # e4m3fnuz bytes misread
    with pytest.raises(ValueError, match="power-of-two block sizes >= 16 .* got .* block size 48"):
        random_problem([5], block_size=48, device=DEV).call(per_block_grid_logits)
    with pytest.raises(ValueError, match="step 3's grid needs a power-of-two number of heads >= 16 .* got 24 heads"):
        random_problem([5], heads=24, device=DEV).call(per_block_grid_logits)


def test_one_block_logits_matches_the_reference(problem):
    q, kv, w, _, bt, _ = problem.args
    block = one_block_logits(q[0, 0], kv[bt[0, 0]], w[0])
    ref, magnitude = problem.call(fp8_paged_mqa_logits_ref), problem.call(logits_magnitude)
    assert compare_logits(block, ref[0, :16], magnitude[0, :16])["max_rel_error"] < 1e-5
    with pytest.raises(TypeError, match="q_row must be torch.float8_e4m3fn for step 3's one-block kernel, got torch.float32"):
        one_block_logits(q[0, 0].float(), kv[0], w[0])
    with pytest.raises(TypeError, match="q_row must be torch.float8_e4m3fn for step 3's one-block kernel, got .*e4m3fnuz"):
        one_block_logits(q[0, 0].to(torch.float8_e4m3fnuz), kv[0], w[0])
    with pytest.raises(TypeError, match="weights_row must be a tensor, got NoneType"):
        one_block_logits(q[0, 0], kv[0], None)
    with pytest.raises(ValueError, match=r"q_row must be \[heads, head_dim\] \(q\[b, j\]\), got \[1, 64, 128\]"):
        one_block_logits(q[0], kv[0], w[0])
    with pytest.raises(ValueError, match=r"weights_row must be \[heads\] = \[64\], got \[1, 64\]"):
        one_block_logits(q[0, 0], kv[0], w[:1])
    with pytest.raises(ValueError, match=r"block must be \[block_size, 1, 132\] .* got \[16, 132\]"):
        one_block_logits(q[0, 0], kv[0, :, 0], w[0])
    with pytest.raises(TypeError, match=r"^block must be uint8 and weights_row float32, got torch.int8 and "
                                        r"torch.float32$"):
        one_block_logits(q[0, 0], kv[0].view(torch.int8), w[0])
    with pytest.raises(TypeError, match=r"^block must be uint8 and weights_row float32, got torch.uint8 and "
                                        r"torch.float64$"):
        one_block_logits(q[0, 0], kv[0], w[0].double())


RUNGS = steps.RUNGS


@pytest.mark.parametrize("switches", RUNGS.values(), ids=RUNGS.keys())
@pytest.mark.parametrize("block_size, layout, next_n, ctx_2d", [(1, "normal", 3, False), (16, "shuffle", 1, False),
                                                                (64, "shuffle", 2, True), (48, "normal", 2, False)])
def test_chunked_logits_matches_the_reference(switches, block_size, layout, next_n, ctx_2d):
    problem = random_problem([150, 0, 77], next_n=next_n, heads=16, block_size=block_size, layout=layout,
                             ctx_2d=ctx_2d, seed=11, device=DEV)
    verdict = check_logits(problem.call(chunked_logits, **switches), problem)  # unwritten elements stay NaN
    assert verdict["same_inf_pattern"] and verdict["max_rel_error"] < RTOL, verdict


@pytest.mark.parametrize("switches", RUNGS.values(), ids=RUNGS.keys())
def test_chunked_logits_does_not_depend_on_the_split(switches):
    problem = random_problem([300, 17], next_n=2, heads=16, block_size=16, seed=12, device=DEV)
    whole = problem.call(chunked_logits, config=LaunchConfig(64, 320), **switches)
    assert_bitwise_equal(whole, problem.call(chunked_logits, config=LaunchConfig(64, 64), **switches))


def test_chunked_logits_rejects_what_it_cannot_run(problem):
    with pytest.raises(TypeError, match="q must be torch.float8_e4m3fn .* got torch.float8_e4m3fnuz"):
        problem.replace(q=problem.q.to(torch.float8_e4m3fnuz)).call(chunked_logits)
    with pytest.raises(ValueError, match="power-of-two number of heads >= 16 .* got 8 heads"):
        random_problem([5], heads=8, device=DEV).call(chunked_logits)
    with pytest.raises(ValueError, match="config.dot must be 'fp16' .* got 'fp8'"):
        problem.call(chunked_logits, config=LaunchConfig(dot="fp8"))


@pytest.mark.parametrize("block_size, layout, next_n", [(1, "normal", 1), (16, "shuffle", 3), (64, "normal", 2)])
def test_portable_logits_matches_the_reference_with_its_rule_or_a_split(block_size, layout, next_n):
    problem = random_problem([200, 70], next_n=next_n, heads=16, block_size=block_size, layout=layout, seed=13,
                             device=DEV)
    rule = problem.call(portable_logits)
    verdict = check_logits(rule, problem)
    assert verdict["same_inf_pattern"] and verdict["max_rel_error"] < RTOL, verdict
    assert_bitwise_equal(rule, problem.call(portable_logits, config=LaunchConfig(64, 64)))


def test_portable_logits_rejects_bad_input(problem):
    with pytest.raises(TypeError, match="q must be an fp8 tensor"):
        problem.replace(q=problem.q.float()).call(portable_logits)


def test_portable_logits_checks_the_values_once(problem, monkeypatch):
    """Reading the lengths and block ids is a device sync: once a call, and still done."""
    reads = []
    check_values = contract._check_values
    monkeypatch.setattr(contract, "_check_values", lambda *args: reads.append(1) or check_values(*args))
    problem.call(portable_logits)
    assert len(reads) == 1
    too_long = problem.context_lens.clone()
    too_long[0] = problem.max_model_len + 1
    with pytest.raises(ValueError, match=f"max_model_len {problem.max_model_len} is smaller than the longest context"):
        problem.replace(context_lens=too_long).call(portable_logits)


def test_one_block_logits_gives_nan_for_a_token_whose_scale_is_bad(problem):
    # The one-block kernel reads every token of its block: a bad scale, or a token never written (scale 0), gave a finite logit.
    bad = with_scale(problem, 0, 35, -1.0)
    q, kv, w, _, bt, _ = bad.args
    block = one_block_logits(q[0, 0], kv[bt[0, 2]], w[0])
    ref = problem.call(fp8_paged_mqa_logits_ref)
    nan = torch.isnan(block.cpu())
    assert nan.nonzero().flatten().tolist() == [3, *range(8, 16)]          # token 3, and the unwritten 8..15
    assert compare_logits(block[:8][~nan[:8]], ref[0, 32:40][~nan[:8]],
                          problem.call(logits_magnitude)[0, 32:40][~nan[:8]])["max_rel_error"] < 1e-5


STEPS = {"per block grid": per_block_grid_logits, "chunked": chunked_logits, "portable": portable_logits}


@pytest.mark.parametrize("step", STEPS)
def test_the_checked_steps_refuse_a_bad_scale(problem, step):
    bad = with_scale(problem, 1, 9, float("inf"))
    block, token = key_record(bad, 1, 9)
    with pytest.raises(ValueError, match=f"^kv_cache holds scale inf at block {block}, token {token} "):
        bad.call(STEPS[step])


@pytest.mark.parametrize("step", STEPS)
def test_the_steps_give_nan_wherever_a_nan_in_q_or_a_key_enters(problem, step):
    # The query row of sequence 0 sees its 40 positions; position 12 of sequence 1 is seen by its one row.
    for poisoned, nan in ((with_nan_query(problem, 0, 0, 7, 100), 40), (with_nan_key(problem, 1, 12, 64), 1)):
        out = poisoned.call(STEPS[step])
        verdict = check_unchecked_logits(out, poisoned, poisoned.context_lens, poisoned.block_tables)
        assert verdict["nan_exact"] and verdict["nan"] == nan and verdict["max_rel_error"] < 1e-5, verdict


@pytest.mark.parametrize("switch", ["keys_as_a", "scale_after_sum", "scales_ahead"])
def test_chunked_logits_refuses_a_switch_that_is_no_bool(problem, switch):
    with pytest.raises(TypeError, match=f"^{switch} must be a bool, got str 'no'$"):
        problem.call(chunked_logits, **{switch: "no"})


def test_checked_launch_checks_once_and_launches_the_same_logits_again():
    problem = random_problem([70, 5, 33], heads=16, block_size=16, seed=12)
    for step, options in ((steps.per_block_grid_logits, {}), (steps.chunked_logits, {"keys_as_a": True})):
        launch = steps.checked_launch(step, *problem.args, layout=problem.layout, **options)
        first = launch()
        assert_bitwise_equal(first, problem.call(step, **options))
        assert_bitwise_equal(launch(), first)
        assert launch() is not first  # a new output each launch


def test_checked_launch_refuses_another_function_and_bad_values_at_the_check():
    problem = random_problem([40], heads=16, block_size=16, seed=13)
    with pytest.raises(ValueError, match="step must be per_block_grid_logits or chunked_logits"):
        steps.checked_launch(steps.portable_logits, *problem.args)
    bad = problem.block_tables.clone()
    bad[0, 0] = problem.num_blocks  # outside the cache
    with pytest.raises(ValueError, match="block"):
        steps.checked_launch(steps.chunked_logits, *problem.replace(block_tables=bad).args)


def test_the_rungs_turn_on_one_switch_at_a_time():
    switches = list(RUNGS.values())
    assert switches[0] == {}
    for before, after in zip(switches, switches[1:]):
        assert set(after) - set(before) == {next(iter(set(after) - set(before)))} and before.items() <= after.items()
    assert set(switches[-1]) == set(steps._SWITCHES)


class _Specialized:
    """A kernel printed by chunked_source, launched where _chunked_launch launches the switched kernel."""

    def __init__(self, kernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, KEYS_AS_A, SCALE_AFTER_SUM, SCALES_AHEAD, **constexprs):
            return self.kernel[grid](*args, **constexprs)
        return launch


@pytest.mark.parametrize("switches", RUNGS.values(), ids=RUNGS.keys())
def test_chunked_source_is_the_kernel_the_switches_run(switches, tmp_path, monkeypatch):
    """The text a chapter prints for a rung, compiled on its own, gives the switched kernel's logits bit for bit."""
    text = steps.chunked_source(**switches)
    assert "KEYS_AS_A" not in text and "SCALES_AHEAD" not in text
    module = tmp_path / "printed_rung.py"
    module.write_text("import triton\nimport triton.language as tl\n"
                      "from preshuffle.teaching.steps import _KEEP_NAN, _chunk_scales\n\n\n" + text + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import importlib
    printed = importlib.import_module("printed_rung")
    problem = random_problem([150, 0, 77], next_n=2, heads=16, block_size=16, layout="shuffle", ctx_2d=True, seed=21,
                             device=DEV)
    switched = problem.call(chunked_logits, **switches)
    monkeypatch.setattr(steps, "_chunked_kernel", _Specialized(printed._chunked_kernel))
    assert_bitwise_equal(problem.call(chunked_logits, **switches), switched)
    del sys.modules["printed_rung"]


def test_chunked_source_refuses_a_switch_that_is_no_bool():
    with pytest.raises(TypeError, match="^KEYS_AS_A must be a bool, got str 'yes'$"):
        steps.chunked_source(keys_as_a="yes")
