import pytest

from preshuffle import decode_model


def test_implied_share_round_trips_the_prs_numbers():
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
