import pytest

from preshuffle.kernels import fp8_paged_mqa_logits
from preshuffle.testing.inputs import random_problem
from preshuffle.testing.numeric import RTOL, check_logits


def test_paged_mqa_problem_bytes_and_flops_follow_the_spec(small_benchmark_problem):
    p = small_benchmark_problem
    n = int(p.context_lens.sum())
    assert p.sum_ctx == n
    assert p.bytes == n * 132 + p.q.numel() + p.weights.numel() * 4 + p.block_tables.numel() * 4 + n * 2 * 4
    assert p.flops == 2 * n * 2 * 16 * 128


def test_paged_mqa_problem_counts_tokens_read_when_the_builder_did_not():
    built = random_problem([40, 0, 17], next_n=3, heads=16, ctx_2d=True, seed=1)
    counted = built.replace(sum_ctx=None)
    assert built.sum_ctx == 57 and (counted.bytes, counted.flops) == (built.bytes, built.flops)
    shorter = built.replace(context_lens=built.context_lens - 1)    # new lengths are counted afresh
    assert shorter.sum_ctx is None and shorter.flops == 2 * (39 + 0 + 16) * 3 * 16 * 128


def test_paged_mqa_problem_reads_its_dims_and_args():
    p = random_problem([20, 33], next_n=2, heads=32, head_dim=64, block_size=16, layout="shuffle", seed=3)
    assert (p.batch, p.next_n, p.heads, p.head_dim, p.block_size, p.num_blocks) == (2, 2, 32, 64, 16, 2 + 3 + 2)
    assert p.args == (p.q, p.kv_cache, p.weights, p.context_lens, p.block_tables, 36) and p.layout == "shuffle"


def test_paged_mqa_problem_call_passes_the_layout():
    shuffled = random_problem([90, 33], next_n=2, heads=16, block_size=32, layout="shuffle", seed=9)
    verdict = check_logits(shuffled.call(fp8_paged_mqa_logits, precision="exact"), shuffled)
    assert verdict["same_inf_pattern"] and verdict["max_rel_error"] <= RTOL
    dropped = fp8_paged_mqa_logits(*shuffled.args, precision="exact")  # the same tensors read as the normal layout
    assert check_logits(dropped, shuffled)["max_rel_error"] > RTOL
    with pytest.raises(TypeError, match="multiple values for keyword argument 'layout'"):
        shuffled.call(fp8_paged_mqa_logits, layout="normal")


def test_paged_mqa_problem_replace_and_to_keep_the_rest():
    p = random_problem([20], heads=16, seed=0, device="cpu")
    longer = p.replace(max_model_len=64)
    assert longer.max_model_len == 64 and longer.q is p.q and longer.layout == p.layout
    moved = p.to("meta")
    assert {t.device.type for t in moved.args[:5]} == {"meta"} and moved.sum_ctx == p.sum_ctx
    assert p.q.device.type == "cpu"                                  # frozen: the original is untouched
    with pytest.raises(AttributeError):
        p.layout = "shuffle"


def test_paged_mqa_problem_equals_only_itself():
    p = random_problem([5], heads=16, seed=0)
    assert p == p and p != p.replace(max_model_len=p.max_model_len) and len({p, p}) == 1


@pytest.mark.parametrize("changes, exc, message", [
    # sum_ctx=-100 made bytes negative; the other two gave an empty output row or a layout no kernel reads.
    (dict(sum_ctx=-100), ValueError, "sum_ctx must be a non-negative int, got -100"),
    (dict(sum_ctx=12.5), TypeError, "sum_ctx must be a non-negative int, got float 12.5"),
    (dict(max_model_len=0), ValueError, "max_model_len must be a positive int, got 0"),
    (dict(max_model_len=30.0), TypeError, "max_model_len must be a positive int, got float 30.0"),
    (dict(layout="shuffled"), ValueError, r"layout must be one of \('normal', 'shuffle'\), got 'shuffled'"),
])
def test_paged_mqa_problem_refuses_bad_scalars(changes, exc, message):
    p = random_problem([20], heads=16, seed=0)
    with pytest.raises(exc, match=f"^{message}$"):
        p.replace(**changes)
