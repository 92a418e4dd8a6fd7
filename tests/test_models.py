import pytest

from preshuffle import access, decode_model
from preshuffle.kernel_steps import one_block_logits, per_block_grid_logits
from preshuffle.problem import kernel_args, random_problem
from preshuffle.reference import check_logits, compare_logits, fp8_paged_mqa_logits_ref, logits_magnitude

from .test_kernels import DEV


def test_amdahl_round_trip_and_the_prs_numbers():
    share = decode_model.implied_share(1.025, 3.64)
    assert share == pytest.approx(0.0336, abs=1e-4)
    assert decode_model.end_to_end_speedup(share, 3.64) == pytest.approx(1.025)


def test_indexer_share_grows_with_context_and_batch():
    m = decode_model.DecodeModel()
    shares = [m.indexer_share(64, n) for n in (1024, 8192, 65536)]
    assert shares == sorted(shares) and 0 < shares[0] < shares[-1] < 1
    assert m.indexer_share(256, 8192) > m.indexer_share(16, 8192)
    t = m.step_seconds(1, 4096)
    assert t["indexer"] == pytest.approx(61 * 4096 * 132 / 4.25e12)


def test_chunk_accesses():
    one = access.chunk_accesses(1)
    assert (one["table_reads"], one["key_runs"], one["widest_aligned_load"]) == (64, 64, 4)
    sixteen = access.chunk_accesses(16, "shuffle")
    assert (sixteen["table_reads"], sixteen["key_run_bytes"], sixteen["widest_aligned_load"]) == (4, 2048, 16)
    assert sixteen["lines_per_16x16_tile"] == 2 and access.chunk_accesses(16)["lines_per_16x16_tile"] == 16
    assert "block64-shuffle" in access.format_accesses()


def test_kernel_steps_match_the_reference():
    problem = random_problem([40, 17, 0], block_size=16, seed=7, device=DEV)
    args = kernel_args(problem)
    verdict = check_logits(per_block_grid_logits(*args), *args)
    assert verdict["same_inf_pattern"] and verdict["max_rel_error"] < 1e-5
    q, kv, w, _, bt, _ = args
    block = one_block_logits(q[0, 0], kv[bt[0, 0]], w[0])
    ref, magnitude = fp8_paged_mqa_logits_ref(*args), logits_magnitude(*args)
    assert compare_logits(block, ref[0, :16], magnitude[0, :16])["max_rel_error"] < 1e-5
    with pytest.raises(ValueError, match="step 2 handles next_n = 1"):
        per_block_grid_logits(*kernel_args(random_problem([5], next_n=2, block_size=16, device=DEV)))
    with pytest.raises(TypeError, match="q_row must be float8_e4m3fn"):
        one_block_logits(q[0, 0].float(), kv[0], w[0])
