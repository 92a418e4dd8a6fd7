import pytest

from preshuffle import decode_model
from preshuffle.cache import allocate_k_cache

# docs/performance.md, "What vLLM runs": vLLM PR #51216 took AITER's paged-MQA kernel from 28.53 us to 7.84 us
# (3.64x) and end-to-end throughput up ~2.5%.
PR_KERNEL_SPEEDUP, PR_END_TO_END = 3.64, 1.025


def test_the_prs_kernel_speedup_is_its_two_times():
    assert 28.53 / 7.84 == pytest.approx(PR_KERNEL_SPEEDUP, abs=0.005)


def test_implied_share_is_amdahls_share_for_the_prs_numbers():
    share = decode_model.implied_share(PR_END_TO_END, PR_KERNEL_SPEEDUP)
    # Amdahl's law solved for the share: s = (1 - 1/g) / (1 - 1/k).
    assert share == pytest.approx((1 - 1 / 1.025) / (1 - 1 / 3.64), rel=1e-12)
    # And by the law's own statement: the step's time after, (1 - s) + s/k of before, is 1/g of it.
    assert (1 - share) + share / PR_KERNEL_SPEEDUP == pytest.approx(1 / PR_END_TO_END, rel=1e-12)
    assert decode_model.end_to_end_speedup(share, PR_KERNEL_SPEEDUP) == pytest.approx(PR_END_TO_END, rel=1e-12)


@pytest.mark.parametrize("share, kernel, step", [
    (0.0, 3.64, 1.0),        # a part taking no time: no gain
    (1.0, 3.64, 3.64),       # the whole step: the kernel's gain
    (0.3, 1.0, 1.0),         # a kernel no faster: no gain
    (0.5, 2.0, 4 / 3),       # half the step at half the time: 0.75 of it
    (0.25, float("inf"), 4 / 3),  # a quarter of the step removed
])
def test_end_to_end_speedup_at_amdahls_limits(share, kernel, step):
    assert decode_model.end_to_end_speedup(share, kernel) == pytest.approx(step, rel=1e-12)


def test_the_models_bytes_a_token_are_the_caches():
    # docs/layout.md: 132 bytes a token (128 fp8 values and a 4-byte scale); the package's cache holds that many.
    assert allocate_k_cache(3, 64).numel() == 3 * 64 * 132
    # Read at one token's record a second, one layer's cache of 1000 tokens takes 1000 s.
    m = decode_model.DecodeModel(layers=1, bandwidth=132.0)
    assert m.step_seconds(1, 1000)["indexer"] == pytest.approx(1000.0, rel=1e-12)


def test_step_terms_scale_as_the_docstring_states():
    """Weights read once a step; the indexer's cache read whole, per sequence and layer, at the kernel's share of the
    bandwidth; the sparse attention over min(context, topk) tokens."""
    m = decode_model.DecodeModel()
    base = m.step_seconds(16, 8192)
    assert base["total"] == pytest.approx(base["weights"] + base["indexer"] + base["attention"], rel=1e-12)
    assert m.topk < 8192
    # (batch, context) against (16, 8192): the indexer's time grows with both; the attention's with the batch, and
    # with the context only below topk.
    half_topk = m.topk // 2
    for batch, context, indexer, attention in [(32, 8192, 2, 2), (16, 16384, 2, 1),
                                               (16, half_topk, half_topk / 8192, 0.5)]:
        t = m.step_seconds(batch, context)
        assert t["weights"] == base["weights"]
        assert t["indexer"] == pytest.approx(indexer * base["indexer"], rel=1e-12), (batch, context)
        assert t["attention"] == pytest.approx(attention * base["attention"], rel=1e-12), (batch, context)
    doubled = decode_model.DecodeModel(layers=2 * m.layers, bandwidth=2 * m.bandwidth).step_seconds(16, 8192)
    assert doubled["indexer"] == pytest.approx(base["indexer"], rel=1e-12)
    assert doubled["weights"] == pytest.approx(base["weights"] / 2, rel=1e-12)


@pytest.mark.parametrize("batch, context", [(1, 4096), (64, 8192), (256, 65536)])
def test_a_faster_indexer_speeds_the_step_by_amdahls_law(batch, context):
    """A kernel k times faster (indexer_efficiency k) speeds the model's step as Amdahl's law says for its share."""
    m = decode_model.DecodeModel()
    fast = decode_model.DecodeModel(indexer_efficiency=PR_KERNEL_SPEEDUP)
    gain = m.step_seconds(batch, context)["total"] / fast.step_seconds(batch, context)["total"]
    assert gain == pytest.approx(decode_model.end_to_end_speedup(m.indexer_share(batch, context), PR_KERNEL_SPEEDUP),
                                 rel=1e-12)


def test_indexer_share_grows_with_context_and_batch():
    m = decode_model.DecodeModel()
    shares = [m.indexer_share(64, n) for n in (1024, 8192, 65536)]
    assert shares == sorted(shares) and 0 < shares[0] < shares[-1] < 1
    assert m.indexer_share(256, 8192) > m.indexer_share(16, 8192)
