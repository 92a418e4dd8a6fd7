import pytest
import torch
from hypothesis import given, strategies as st

from preshuffle.cache import allocate_k_cache, gather_k_cache, quantize_k, read_slots, write_k_cache


@pytest.mark.parametrize("amax, scale", [(1.0, 2.0**-8), (448.0, 1.0), (0.0, 2.0**-22)])
def test_quantize_k_ue8m0_spec_examples(amax, scale):
    k = torch.zeros(1, 128)
    k[0, 5] = amax
    _, scales = quantize_k(k, scale_fmt="ue8m0")
    assert scales.item() == scale


def test_quantize_k_plain_scale_and_floor():
    k = torch.zeros(2, 128)
    k[0, 0] = -3.0
    _, scales = quantize_k(k)
    assert scales[0].item() == pytest.approx(3.0 / 448) and scales[1].item() == pytest.approx(1e-4 / 448)


def test_quantize_k_fnuz_uses_vllms_224():
    k = torch.full((1, 128), 2.0)
    values, scales = quantize_k(k, fp8_dtype=torch.float8_e4m3fnuz)
    assert scales.item() == pytest.approx(2.0 / 224) and values.float().max().item() == 224.0


@given(st.integers(0, 2**16), st.sampled_from([None, "ue8m0"]), st.sampled_from([torch.float32, torch.bfloat16]))
def test_quantize_k_error_is_bounded(seed, fmt, dtype):
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(8, 128, generator=g) * torch.rand(8, 1, generator=g) * 10).to(dtype)
    values, scales = quantize_k(k, scale_fmt=fmt)
    assert (scales > 0).all()
    err = (values.float() * scales[:, None] - k.float()).abs()
    # e4m3 keeps 3 mantissa bits: relative half-ulp 2^-4, plus the subnormal step 2^-9 * scale near zero.
    assert (err <= k.float().abs() * 2.0**-4 + scales[:, None] * 2.0**-9 * 1.0001).all()


@given(st.sampled_from([1, 2, 8, 16, 32, 64]), st.sampled_from(["normal", "shuffle"]), st.integers(0, 2**16),
       st.data())
def test_write_k_cache_then_read_slots_returns_what_quantize_k_produced(block_size, layout, seed, data):
    if layout == "shuffle" and block_size % 16:
        return
    g = torch.Generator().manual_seed(seed)
    num_blocks = data.draw(st.integers(1, 6))
    n = data.draw(st.integers(0, num_blocks * block_size))
    cache = allocate_k_cache(num_blocks, block_size)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:n]
    k = torch.randn(n, 128, generator=g)
    write_k_cache(cache, k, slots, layout=layout)
    values, scales = read_slots(cache, slots, layout=layout)
    expected_values, expected_scales = quantize_k(k)
    assert torch.equal(values.view(torch.uint8), expected_values.view(torch.uint8))
    assert torch.equal(scales, expected_scales)


def test_write_k_cache_block_flat_bytes():
    cache = allocate_k_cache(2, 16)
    k = torch.randn(3, 128)
    write_k_cache(cache, k, torch.tensor([16, 17, 31]))
    values, scales = quantize_k(k)
    block = cache[1].reshape(-1)
    assert torch.equal(block[:128], values[0].view(torch.uint8))          # token 0 at byte 0
    assert torch.equal(block[128:256], values[1].view(torch.uint8))       # token 1 at byte 128
    assert torch.equal(block[16 * 128:16 * 128 + 4], scales[0:1].view(torch.uint8))  # scales after the values
    assert torch.equal(block[16 * 128 + 4 * 15:16 * 128 + 64], scales[2:3].view(torch.uint8))
    assert cache[0].eq(0).all()


def test_write_k_cache_slot_minus_one_skips_the_token():
    cache = allocate_k_cache(1, 16)
    write_k_cache(cache, torch.randn(2, 128), torch.tensor([-1, 3]))
    assert cache.view(-1)[:3 * 128].eq(0).all() and cache.view(-1)[3 * 128:4 * 128].ne(0).any()


def test_gather_k_cache_through_a_block_table():
    cache = allocate_k_cache(4, 16)
    table = torch.tensor([2, 0, 3], dtype=torch.int32)
    k = torch.randn(40, 128)
    positions = torch.arange(40)
    write_k_cache(cache, k, table.long()[positions // 16] * 16 + positions % 16, layout="shuffle")
    values, scales = gather_k_cache(cache, table, 40, layout="shuffle")
    expected_values, expected_scales = quantize_k(k)
    assert torch.equal(values.view(torch.uint8), expected_values.view(torch.uint8))
    assert torch.equal(scales, expected_scales)
    with pytest.raises(ValueError, match="num_tokens 49 is beyond the block table's 3 blocks of 16"):
        gather_k_cache(cache, table, 49)


def test_write_k_cache_bad_writes_change_nothing():
    cache = allocate_k_cache(2, 8)
    k = torch.randn(2, 128)
    cases = [
        (dict(layout="shuffle"), ValueError, "block_size must be a multiple of 16 for the shuffle layout, got 8"),
        (dict(slot_mapping=torch.tensor([0, 16])), ValueError, r"slot 16 outside \[-1, 16\)"),
        (dict(slot_mapping=torch.tensor([0, -2])), ValueError, "slot -2 outside"),
        (dict(slot_mapping=torch.tensor([3, 3])), ValueError, "writes one slot twice"),
        (dict(slot_mapping=torch.tensor([0.0, 1.0])), TypeError, "slot_mapping must be an int32/int64 tensor"),
        (dict(slot_mapping=torch.tensor([0])), ValueError, r"slot_mapping must be \[2\]"),
        (dict(k=torch.randn(2, 64)), ValueError, r"k must be \[num_tokens, 128\]"),
        (dict(k=torch.randn(2, 128).to(torch.float64)), TypeError, "k must be bfloat16, float16 or float32"),
        (dict(scale_fmt="e8m0"), ValueError, "scale_fmt must be one of"),
        (dict(kv_cache=cache.view(torch.int8)), TypeError, "kv_cache must be a uint8 tensor"),
        (dict(kv_cache=torch.zeros(2, 8, 2, 132, dtype=torch.uint8)), ValueError, "kv_cache must be"),
        (dict(kv_cache=torch.zeros(2, 8, 1, 130, dtype=torch.uint8)), ValueError, "head_dim a multiple of 16"),
        (dict(kv_cache=torch.zeros(4, 8, 1, 132, dtype=torch.uint8)[::2]), ValueError, "contiguous"),
        (dict(fp8_dtype=torch.float16), TypeError, "fp8_dtype must be one of"),
    ]
    for change, exc, message in cases:
        args = {"kv_cache": cache, "k": k, "slot_mapping": torch.tensor([0, 9]), **change}
        target = args["kv_cache"]
        before = target.clone()
        with pytest.raises(exc, match=message):
            write_k_cache(**args)
        assert torch.equal(target, before), change


def test_read_slots_gather_k_cache_allocate_k_cache_reject_bad_input():
    cache = allocate_k_cache(2, 16)
    with pytest.raises(ValueError, match=r"slots must be in \[0, 32\)"):
        read_slots(cache, torch.tensor([32]))
    with pytest.raises(TypeError, match="block_table must be int32/int64"):
        gather_k_cache(cache, torch.tensor([0.0]), 1)
    with pytest.raises(ValueError, match="num_blocks must be a positive int"):
        allocate_k_cache(0, 16)
