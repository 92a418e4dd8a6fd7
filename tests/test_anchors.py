from preshuffle.anchors import DEEPGEMM_H200
from preshuffle.shapes import ANCHOR_SHAPES


def test_deepgemm_h200_records_every_anchor_shape():
    assert list(DEEPGEMM_H200) == list(ANCHOR_SHAPES)


def test_deepgemm_h200_shares_follow_from_its_bandwidths():
    for recorded in DEEPGEMM_H200.values():
        assert round(100 * recorded.gb_per_s / 4250) == recorded.pct_copy   # the run's 4.25 TB/s ceiling
        assert recorded.naive_triton_us > recorded.us
