import dataclasses

import pytest
import torch

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


def one_layer(**changes):
    """A geometry of one layer that runs the indexer, no MoE layer, for counting bytes."""
    fields = dict(name="one layer", layers=1, moe_layers=0, experts=8, experts_per_token=2, hidden=16,
                  moe_intermediate=8, active_params=0.0, indexer_layers=1, topk=2048)
    return decode_model.Geometry(**{**fields, **changes})


def test_the_models_bytes_a_token_are_the_caches():
    # docs/layout.md: 132 bytes a token (128 fp8 values and a 4-byte scale); the package's cache holds that many.
    assert allocate_k_cache(3, 64).numel() == 3 * 64 * 132
    # Read at one byte a second, one layer's 1000 tokens take 132 s from the cache and 4 s to write their logits;
    # the top-k reads the logits again.
    m = decode_model.DecodeModel(one_layer(), bandwidth=1.0, tensor_parallel=1)
    t = m.step_seconds(1, 1000)
    assert t["indexer"] == pytest.approx(1000 * (132 + 4), rel=1e-12)
    assert t["topk"] == pytest.approx(1000 * 4, rel=1e-12)
    assert t["attention"] == pytest.approx(1000 * 656, rel=1e-12)  # below topk, every token of the MLA cache


@pytest.mark.parametrize("geometry, total", [(decode_model.DEEPSEEK_V32, 671e9), (decode_model.GLM_52, 744e9)])
def test_the_geometries_add_up_to_the_published_totals(geometry, total):
    """The published active parameters plus every routed expert (3 x hidden x moe_intermediate each) give the
    published total (DeepSeek-V3: 671B; GLM-5: 744B) within 1%."""
    assert geometry.total_params == pytest.approx(total, rel=0.01)
    assert 0 < geometry.shared_params < geometry.active_params


def test_experts_touched_is_what_uniform_routing_touches():
    m = decode_model.DecodeModel()
    g = m.geometry
    assert m.experts_touched(1) == pytest.approx(g.experts_per_token, rel=1e-12)
    gen = torch.Generator().manual_seed(0)
    for batch in (2, 4, 16, 64):
        trials = [len(set().union(*[torch.randperm(g.experts, generator=gen)[:g.experts_per_token].tolist()
                                    for _ in range(batch)])) for _ in range(400)]
        assert m.experts_touched(batch) == pytest.approx(sum(trials) / len(trials), rel=0.02), batch
    assert g.experts * 0.999 < m.experts_touched(4096) <= g.experts


def test_step_terms_scale_as_the_docstring_states():
    """Weights: the shared ones once, plus the experts the batch touches, split over the tensor-parallel GPUs; the
    indexer and its top-k per query row, token and indexer layer; the sparse attention over min(context, topk)."""
    m = decode_model.DecodeModel()
    g = m.geometry
    base = m.step_seconds(16, 8192)
    assert base["total"] == pytest.approx(sum(base[k] for k in ("weights", "indexer", "topk", "attention")), rel=1e-12)
    expected = ((g.shared_params + g.moe_layers * m.experts_touched(16) * g.expert_params) / m.tensor_parallel
                / m.bandwidth)
    assert base["weights"] == pytest.approx(expected, rel=1e-12)
    assert m.step_seconds(64, 8192)["weights"] > base["weights"]  # more tokens touch more experts ...
    assert m.step_seconds(64, 8192)["weights"] < 4 * base["weights"]  # ... but fewer than 4x as many
    half_topk = g.topk // 2
    for batch, context, linear, attention in [(32, 8192, 2, 2), (16, 16384, 2, 1),
                                              (16, half_topk, half_topk / 8192, 0.5)]:
        t = m.step_seconds(batch, context)
        for key in ("indexer", "topk"):
            assert t[key] == pytest.approx(linear * base[key], rel=1e-12), (key, batch, context)
        assert t["attention"] == pytest.approx(attention * base["attention"], rel=1e-12), (batch, context)
    split = dataclasses.replace(m, tensor_parallel=2 * m.tensor_parallel).step_seconds(16, 8192)
    assert split["weights"] == pytest.approx(base["weights"] / 2, rel=1e-12)
    assert split["indexer"] == base["indexer"] and split["attention"] == base["attention"]


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


def test_a_measured_step_gives_amdahls_share_whatever_the_calls():
    for calls in (1, 20, 78):
        step = decode_model.MeasuredStep(calls=calls)
        # By the construction's statement: the step after the change is 1/g of it, and it saved the kernel's time.
        assert step.step_us - step.step_us / PR_END_TO_END == pytest.approx(calls * (28.53 - 7.84), rel=1e-12)
        assert step.shares()["logits"] == pytest.approx(decode_model.implied_share(PR_END_TO_END, 28.53 / 7.84),
                                                        rel=1e-12)
    a = decode_model.MeasuredStep(calls=20, topk_us=17.0)
    b = decode_model.MeasuredStep(calls=78, topk_us=17.0)
    assert a.shares() == pytest.approx(b.shares(), rel=1e-12)
    assert a.shares()["topk"] == pytest.approx(17.0 / (28.53 - 7.84) * (1 - 1 / PR_END_TO_END), rel=1e-12)


def test_a_measured_steps_gains():
    step = decode_model.MeasuredStep(topk_us=17.0)
    assert step.gain_of() == pytest.approx(1.0, rel=1e-12)
    assert step.gain_of(logits_us=28.53) == pytest.approx(1 / PR_END_TO_END, rel=1e-12)  # the old kernel back
    assert step.indexer_step_speedup == pytest.approx((28.53 + 17.0) / (7.84 + 17.0), rel=1e-12)
    halved = step.gain_of(topk_us=8.5)
    assert halved == pytest.approx(1 / (1 - step.shares()["topk"] * PR_END_TO_END / 2), rel=1e-12)
    assert step.gain_of(logits_us=7.84 / 2, topk_us=8.5) > halved > 1.0


def test_the_glm_setup_is_the_prs():
    m = decode_model.GLM52_MI355X_TP4
    assert m.geometry is decode_model.GLM_52 and m.tensor_parallel == 4 and m.bandwidth == 8e12
    assert m.expert_bytes_per_param == 4.25 / 8
    assert decode_model.MeasuredStep().calls == decode_model.GLM_52.indexer_layers == 20  # one a 4 of 78 layers
