import pytest

from preshuffle import access


def test_chunk_accesses():
    one = access.chunk_accesses(1)
    assert (one["table_reads"], one["key_runs"], one["widest_aligned_load"]) == (64, 64, 4)
    sixteen = access.chunk_accesses(16, "shuffle")
    assert (sixteen["table_reads"], sixteen["key_run_bytes"], sixteen["widest_aligned_load"]) == (4, 2048, 16)
    assert sixteen["lines_per_16x16_tile"] == 2 and access.chunk_accesses(16)["lines_per_16x16_tile"] == 16
    assert "block64-shuffle" in access.format_accesses()


@pytest.mark.parametrize("args, exc, message", [
    ((0,), ValueError, "block_size must be a positive int, got 0"),
    ((16.0,), TypeError, "block_size must be a positive int, got float 16.0"),
    ((16, "normal", 0), ValueError, "chunk must be a positive int, got 0"),
    ((16, "normal", 64, -128), ValueError, "head_dim must be a positive int, got -128"),
    ((8, "shuffle"), ValueError, "block_size must be a multiple of 16 for the shuffle layout, got 8"),
    ((16, "shuffle", 64, 72), ValueError, "head_dim must be a multiple of 16 for the shuffle layout, got 72"),
    ((16, "bogus"), ValueError, "layout must be one of"),
])
def test_chunk_accesses_bad_arguments(args, exc, message):
    with pytest.raises(exc, match=message):
        access.chunk_accesses(*args)
