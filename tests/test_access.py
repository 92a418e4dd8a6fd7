from preshuffle import access


def test_chunk_accesses():
    one = access.chunk_accesses(1)
    assert (one["table_reads"], one["key_runs"], one["widest_aligned_load"]) == (64, 64, 4)
    sixteen = access.chunk_accesses(16, "shuffle")
    assert (sixteen["table_reads"], sixteen["key_run_bytes"], sixteen["widest_aligned_load"]) == (4, 2048, 16)
    assert sixteen["lines_per_16x16_tile"] == 2 and access.chunk_accesses(16)["lines_per_16x16_tile"] == 16
    assert "block64-shuffle" in access.format_accesses()
