import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from preshuffle.cache import (
    allocate_k_cache, gather_k_cache, quantize_k, read_slots, sequence_slots, token_scales, write_k_cache,
)


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
    g = torch.Generator().manual_seed(4)
    k = torch.randn(6, 128, generator=g) * torch.rand(6, 1, generator=g) * 10
    amax = k.abs().amax(dim=1)
    values, scales = quantize_k(k, fp8_dtype=torch.float8_e4m3fnuz)
    assert values.dtype == torch.float8_e4m3fnuz and (amax > 1e-4).all()
    assert torch.equal(scales, amax / 224)
    assert (values.float().abs().amax(dim=1) == 224.0).all()  # each token's largest value maps to 224, not 240
    # e4m3fnuz keeps 3 mantissa bits (relative half-ulp 2^-4); its subnormal step is 2^-10.
    err = (values.float() * scales[:, None] - k).abs()
    assert (err <= k.abs() * 2.0**-4 + scales[:, None] * 2.0**-10).all()


@pytest.mark.parametrize("fmt", [None, "ue8m0"])
def test_token_scales_are_quantize_ks_scales_in_amaxs_dtype(fmt):
    k = torch.randn(5, 128) * torch.tensor([[0.0], [1e-5], [1.0], [3.0], [900.0]])
    assert torch.equal(token_scales(k.abs().amax(dim=1), scale_fmt=fmt), quantize_k(k, scale_fmt=fmt)[1])
    amax = torch.tensor([3.0], dtype=torch.float64)
    assert token_scales(amax, fp8_dtype=torch.float8_e4m3fnuz).dtype == torch.float64


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(amax=[1.0]), TypeError, "amax must be a floating-point tensor, got list"),
    (dict(amax=torch.tensor([1])), TypeError, "amax must be a floating-point tensor, got torch.int64"),
    (dict(scale_fmt="e8m0"), ValueError, r"scale_fmt must be one of \(None, 'ue8m0'\), got 'e8m0'"),
    (dict(fp8_dtype=torch.float16), TypeError, "fp8_dtype must be one of"),
])
def test_token_scales_bad_arguments(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        token_scales(**{"amax": torch.tensor([1.0]), **kwargs})


@pytest.mark.parametrize("amax, shown", [([1.0, -3.0], "-3.0 at index 1"), ([float("nan")], "nan at index 0"),
                                          ([float("inf"), 2.0], "inf at index 0")])
def test_token_scales_refuses_an_amax_that_is_no_largest_magnitude(amax, shown):
    # Unchecked, clamp(min=1e-4) turned -3 and NaN into the floor's scale, inf into an infinite one.
    with pytest.raises(ValueError, match=f"amax must be finite and >= 0 .*, got {shown}"):
        token_scales(torch.tensor(amax))


@given(st.integers(0, 2**16), st.sampled_from([None, "ue8m0"]), st.sampled_from([torch.float32, torch.bfloat16]))
def test_quantize_k_error_is_bounded(seed, fmt, dtype):
    g = torch.Generator().manual_seed(seed)
    # Magnitudes spread over 2^-24..1 of each token's largest, so that many values fall in e4m3's subnormal range.
    spread = torch.exp2(-24 * torch.rand(8, 128, generator=g))
    k = (torch.randn(8, 128, generator=g) * spread * torch.rand(8, 1, generator=g) * 10).to(dtype)
    values, scales = quantize_k(k, scale_fmt=fmt)
    assert (scales > 0).all()
    k, scale = k.double(), scales.double()[:, None]
    err = (values.double() * scale - k).abs()  # exact in float64: a 4-bit by a 24-bit significand
    # Round to nearest in e4m3 (3 mantissa bits): a normal value (|k| >= 2^-6 scale) is off by at most half an ulp,
    # 2^-4 of itself; a subnormal one by half the subnormal step 2^-9, so 2^-10 scale. On top, k / scale is
    # rounded once in fp32 before the conversion: 2^-24 of |k|, allowed as 2^-23.
    assert (err <= torch.maximum(k.abs() * 2.0**-4, scale * 2.0**-10) + k.abs() * 2.0**-23).all()
    subnormal = k.abs() < scale * 2.0**-6
    assert subnormal.any() and (~subnormal).any()


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


@pytest.mark.parametrize("layout", ["normal", "shuffle"])
@pytest.mark.parametrize("options", [dict(scale_fmt="ue8m0"), dict(fp8_dtype=torch.float8_e4m3fnuz),
                                     dict(scale_fmt="ue8m0", fp8_dtype=torch.float8_e4m3fnuz)])
def test_write_k_cache_writes_what_quantize_k_gives_with_its_options(options, layout):
    g = torch.Generator().manual_seed(8)
    k = torch.randn(20, 128, generator=g) * torch.rand(20, 1, generator=g) * 5
    slots = torch.randperm(48, generator=g)[:20]
    cache, plain = allocate_k_cache(3, 16), allocate_k_cache(3, 16)
    write_k_cache(cache, k, slots, layout=layout, **options)
    write_k_cache(plain, k, slots, layout=layout)
    fp8_dtype = options.get("fp8_dtype", torch.float8_e4m3fn)
    values, scales = read_slots(cache, slots, layout=layout, fp8_dtype=fp8_dtype)
    expected_values, expected_scales = quantize_k(k, **options)
    assert values.dtype == fp8_dtype
    assert torch.equal(values.view(torch.uint8), expected_values.view(torch.uint8))
    assert torch.equal(scales, expected_scales)
    # The options change what is stored: every token's scale bytes differ from the default write's.
    _, plain_scales = read_slots(plain, slots, layout=layout)
    assert (scales != plain_scales).all() and not torch.equal(cache, plain)


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
        (dict(k=torch.randn(2, 128).tolist()), TypeError, r"k must be a tensor \[num_tokens, 128\], got list"),
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
    with pytest.raises(TypeError, match="block_table must be an int32/int64 tensor, got torch.float32"):
        gather_k_cache(cache, torch.tensor([0.0]), 1)
    with pytest.raises(ValueError, match="num_blocks must be a positive int"):
        allocate_k_cache(0, 16)


def test_write_k_cache_refuses_an_inference_cache_outside_inference_mode():
    with torch.inference_mode():
        cache = allocate_k_cache(2, 16)
    with pytest.raises(ValueError, match=r"kv_cache was made under torch.inference_mode\(\)"):
        write_k_cache(cache, torch.randn(3, 128), torch.tensor([0, 1, 2]))
    assert cache.eq(0).all()
    with torch.inference_mode():  # inside inference mode the same write is fine
        write_k_cache(cache, torch.randn(3, 128), torch.tensor([0, 1, 2]))
    assert cache.ne(0).any()


def test_write_k_cache_refuses_k_on_another_device():
    cache = allocate_k_cache(2, 16)
    with pytest.raises(ValueError, match="k is on meta but kv_cache is on cpu"):
        write_k_cache(cache, torch.randn(3, 128, device="meta"), torch.tensor([0, 1, 2]))
    assert cache.eq(0).all()


def test_write_k_cache_refuses_tensors_on_meta():
    with pytest.raises(ValueError, match="kv_cache is on meta"):
        write_k_cache(allocate_k_cache(2, 16, device="meta"), torch.randn(3, 128, device="meta"),
                      torch.tensor([0, 1, 2]))
    cache = allocate_k_cache(2, 16)
    with pytest.raises(ValueError, match="slot_mapping is on meta"):
        write_k_cache(cache, torch.randn(3, 128), torch.tensor([0, 1, 2], device="meta"))
    assert cache.eq(0).all()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_write_k_cache_refuses_non_finite_keys(bad):
    cache = allocate_k_cache(2, 16)
    k = torch.randn(4, 128)
    k[2, 77] = bad
    with pytest.raises(ValueError, match=f"k must be finite, but token 2 holds {bad}"):
        write_k_cache(cache, k, torch.tensor([0, 1, 2, 3]))
    assert cache.eq(0).all()


def test_write_k_cache_skips_non_finite_keys_it_does_not_write():
    cache = allocate_k_cache(2, 16)
    k = torch.randn(3, 128)
    k[1] = float("nan")
    write_k_cache(cache, k, torch.tensor([4, -1, 9]))
    values, scales = read_slots(cache, torch.tensor([4, 9]))
    expected_values, expected_scales = quantize_k(k[[0, 2]])
    assert torch.equal(values.view(torch.uint8), expected_values.view(torch.uint8))
    assert torch.equal(scales, expected_scales)


@pytest.mark.parametrize("k, exc, message", [
    (torch.randn(2, 128).tolist(), TypeError, r"k must be a tensor \[num_tokens, head_dim\], got list"),
    (torch.randn(2, 1, 128), ValueError, r"k must be 2-D \[num_tokens, head_dim\], got \[2, 1, 128\]"),
    (torch.randn(2, 128, device="meta"), ValueError, "k is on meta: it holds no values to quantise"),
])
def test_quantize_k_bad_keys(k, exc, message):
    with pytest.raises(exc, match=message):
        quantize_k(k)


def test_quantize_k_refuses_non_finite_keys():
    k = torch.randn(3, 128, dtype=torch.bfloat16)
    k[1, 0] = float("inf")
    with pytest.raises(ValueError, match="k must be finite, but token 1 holds inf"):
        quantize_k(k)


def test_write_k_cache_takes_keys_that_require_grad():
    leaf = torch.randn(3, 256, requires_grad=True)
    cache = allocate_k_cache(2, 16)
    write_k_cache(cache, leaf[:, 64:192], torch.tensor([5, 0, 31]))
    values, scales = read_slots(cache, torch.tensor([5, 0, 31]))
    expected_values, expected_scales = quantize_k(leaf.detach()[:, 64:192])
    assert torch.equal(values.view(torch.uint8), expected_values.view(torch.uint8))
    assert torch.equal(scales, expected_scales) and not scales.requires_grad


def test_allocate_k_cache_takes_numpy_ints():
    assert allocate_k_cache(np.int64(3), np.int32(16), np.int64(64)).shape == (3, 16, 1, 68)


@pytest.mark.parametrize("kwargs, exc, message", [
    (dict(num_blocks=2.0), TypeError, "num_blocks must be a positive int, got float 2.0"),
    (dict(block_size=True), TypeError, "block_size must be a positive int, got bool True"),
    (dict(head_dim=100), ValueError, "head_dim must be a multiple of 16, got 100"),
    (dict(device="nonsense"), ValueError, "device must name a torch device, got 'nonsense'"),
    (dict(device="cuda:64"), ValueError, "device must be a device this torch can allocate on, got 'cuda:64'"),
    (dict(num_blocks=2**40), ValueError, f"a cache of {2**40} blocks of 16 tokens .* cannot be allocated on cpu"),
    (dict(num_blocks=2**62), ValueError, "cannot be allocated on cpu"),
])
def test_allocate_k_cache_bad_arguments(kwargs, exc, message):
    with pytest.raises(exc, match=message):
        allocate_k_cache(**{"num_blocks": 2, "block_size": 16, **kwargs})


@pytest.mark.parametrize("slots, exc, message", [
    ([1], TypeError, "slots must be an int32/int64 tensor, got list"),
    (torch.tensor([1.7]), TypeError, "slots must be an int32/int64 tensor, got torch.float32"),
    (torch.tensor([True]), TypeError, "slots must be an int32/int64 tensor, got torch.bool"),
    (torch.tensor([1], device="meta"), ValueError, "slots is on meta"),
])
def test_read_slots_bad_slots(slots, exc, message):
    with pytest.raises(exc, match=message):
        read_slots(allocate_k_cache(2, 16), slots)


def test_read_slots_refuses_a_meta_cache():
    with pytest.raises(ValueError, match="kv_cache is on meta"):
        read_slots(allocate_k_cache(2, 16, device="meta"), torch.tensor([1]))


@pytest.mark.parametrize("block_id", [2**62, 2**59 + 1])
def test_sequence_slots_and_gather_k_cache_refuse_block_ids_whose_slots_overflow(block_id):
    # Unchecked, 2**62 * 16 wrapped to slot 0: gather_k_cache returned block 0's bytes.
    table = torch.tensor([1, block_id])
    with pytest.raises(ValueError, match=f"block_table holds block id {block_id}: times block_size 16 it would "
                                         "overflow int64"):
        sequence_slots(table, 20, 16)
    with pytest.raises(ValueError, match=f"block_table holds block id {block_id}: times block_size 16"):
        gather_k_cache(allocate_k_cache(2, 16), table, 20)


def test_gather_k_cache_names_the_block_id_outside_the_cache():
    with pytest.raises(ValueError, match=r"^block_table holds block id 7 at index 1, outside the cache's 2 blocks, in "
                                         r"the first 20 positions$"):
        gather_k_cache(allocate_k_cache(2, 16), torch.tensor([1, 7, 9]), 20)
    assert gather_k_cache(allocate_k_cache(2, 16), torch.tensor([1, 7]), 16)[1].shape == (16,)  # 7 is not read


@pytest.mark.parametrize("num_tokens, exc, message", [
    (2.5, TypeError, "num_tokens must be a non-negative int, got float 2.5"),
    (True, TypeError, "num_tokens must be a non-negative int, got bool"),
    ("3", TypeError, "num_tokens must be a non-negative int, got str"),
    (-1, ValueError, "num_tokens must be a non-negative int, got -1"),
])
def test_gather_k_cache_bad_num_tokens(num_tokens, exc, message):
    with pytest.raises(exc, match=message):
        gather_k_cache(allocate_k_cache(2, 16), torch.tensor([0, 1]), num_tokens)


def test_gather_k_cache_takes_a_numpy_num_tokens():
    assert gather_k_cache(allocate_k_cache(2, 16), torch.tensor([1, 0]), np.int64(20))[1].shape == (20,)


def test_sequence_slots_bad_arguments():
    table = torch.tensor([3, 1])
    with pytest.raises(ValueError, match="block_size must be a positive int, got 0"):
        sequence_slots(table, 3, 0)
    with pytest.raises(ValueError, match="num_tokens 40 is beyond the block table's 2 blocks of 16"):
        sequence_slots(table, 40, 16)
    with pytest.raises(TypeError, match="block_table must be an int32/int64 tensor, got torch.float32"):
        sequence_slots(table.float(), 3, 16)
    with pytest.raises(TypeError, match="block_table must be an int32/int64 tensor, got list"):
        sequence_slots([3, 1], 3, 16)
    with pytest.raises(ValueError, match=r"block_table must be a 1-D tensor of kernel block ids, got shape \[1, 2\]"):
        sequence_slots(table.unsqueeze(0), 3, 16)
    # A negative id would turn into slot -1, which the writer reads as "skip this token".
    with pytest.raises(ValueError, match="block_table holds block id -1 at index 1"):
        sequence_slots(torch.tensor([0, -1]), 2, 1)
    assert sequence_slots(torch.tensor([3, -1]), 16, 16).tolist() == list(range(48, 64))  # the unread tail is free


def _one_written(args, draw):
    written = (args["slot_mapping"] >= 0).nonzero()[:, 0]
    return int(written[draw(st.integers(0, written.numel() - 1))])


def _with_key(args, draw, value):
    k = args["k"].clone()
    k[_one_written(args, draw), draw(st.integers(0, k.shape[1] - 1))] = value
    return {"k": k}


def _with_slot(args, value):
    slots = args["slot_mapping"].clone()
    slots[-1] = value
    return {"slot_mapping": slots}


def _written_twice(args, draw):
    """A second token, with the same key, for the slot of a written one."""
    i = _one_written(args, draw)
    return {"k": torch.cat([args["k"], args["k"][i:i + 1]]),
            "slot_mapping": torch.cat([args["slot_mapping"], args["slot_mapping"][i:i + 1]])}


def _inference_copy(cache):
    with torch.inference_mode():
        return cache.clone()


# Each change makes a valid call invalid, whatever else is changed with it. They apply in this order: first
# those that pick a written token or slot, last those that turn a tensor into a list; the inference copy of the
# cache after its other changes, so that it is the tensor a write would change.
BAD_WRITES = {
    "k NaN": lambda a, draw: _with_key(a, draw, float("nan")),
    "k Inf": lambda a, draw: _with_key(a, draw, draw(st.sampled_from([float("inf"), -float("inf")]))),
    "slot twice": _written_twice,
    "slot past the cache": lambda a, draw: _with_slot(a, a["kv_cache"].shape[0] * a["kv_cache"].shape[1]
                                                      + draw(st.integers(0, 2**40))),
    "slot below -1": lambda a, draw: _with_slot(a, -2 - draw(st.integers(0, 2**40))),
    "k float64": lambda a, draw: {"k": a["k"].double()},
    "k int32": lambda a, draw: {"k": a["k"].to(torch.int32)},
    "k head_dim": lambda a, draw: {"k": a["k"][:, :64]},
    "k 3-D": lambda a, draw: {"k": a["k"][None]},
    "k on meta": lambda a, draw: {"k": a["k"].to("meta")},
    "slots float": lambda a, draw: {"slot_mapping": a["slot_mapping"].float()},
    "slots bool": lambda a, draw: {"slot_mapping": a["slot_mapping"] >= 0},
    "slots on meta": lambda a, draw: {"slot_mapping": a["slot_mapping"].to("meta")},
    "slots 2-D": lambda a, draw: {"slot_mapping": a["slot_mapping"][None]},
    "layout": lambda a, draw: {"layout": draw(st.sampled_from(["tiled", None, "NORMAL"]))},
    "scale_fmt": lambda a, draw: {"scale_fmt": draw(st.sampled_from(["e8m0", "ue8m0 ", 1]))},
    "fp8_dtype": lambda a, draw: {"fp8_dtype": draw(st.sampled_from([torch.float16, torch.float8_e5m2, "fp8"]))},
    "cache int8": lambda a, draw: {"kv_cache": a["kv_cache"].view(torch.int8)},
    "cache 5-D": lambda a, draw: {"kv_cache": a["kv_cache"][None]},
    "cache strided": lambda a, draw: {"kv_cache": a["kv_cache"].view(-1, 1, 1, 132)[::2]},
    "cache inference": lambda a, draw: {"kv_cache": _inference_copy(a["kv_cache"])},
    "k list": lambda a, draw: {"k": [[1.0] * 128] * len(a["k"])},
    "slots list": lambda a, draw: {"slot_mapping": list(range(len(a["slot_mapping"])))},
}


@settings(max_examples=150)
@given(st.sampled_from([8, 16, 32]), st.integers(1, 4), st.integers(0, 2**16), st.data())
def test_write_k_cache_bad_arguments_leave_every_cache_byte_identical(block_size, num_blocks, seed, data):
    g = torch.Generator().manual_seed(seed)
    cache = torch.randint(0, 256, (num_blocks, block_size, 1, 132), generator=g, dtype=torch.uint8)
    n = data.draw(st.integers(1, num_blocks * block_size))
    slots = torch.randperm(num_blocks * block_size, generator=g)[:n]
    skipped = torch.rand(n, generator=g) < 0.3
    skipped[int(torch.randint(n, (1,), generator=g))] = False  # at least one token is written
    args = {"kv_cache": cache, "k": torch.randn(n, 128, generator=g) * 3,
            "slot_mapping": slots.masked_fill(skipped, -1),
            "layout": "shuffle" if block_size % 16 == 0 and seed % 2 else "normal"}
    names = sorted(BAD_WRITES) + (["shuffle of 8-token blocks"] if block_size % 16 else [])
    changes = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3, unique=True))
    for name in [name for name in [*BAD_WRITES, "shuffle of 8-token blocks"] if name in changes]:
        args.update({"layout": "shuffle"} if name == "shuffle of 8-token blocks" else BAD_WRITES[name](args, data.draw))
    targets = [cache] + ([args["kv_cache"]] if args["kv_cache"].is_inference() else [])
    before = [t.clone() for t in targets]
    with pytest.raises((ValueError, TypeError)):
        write_k_cache(**args)
    assert all(torch.equal(t, b) for t, b in zip(targets, before)), changes


@pytest.mark.parametrize("shape", [(0, 16, 1, 132), (2, 0, 1, 132), (0, 16, 132)])
def test_cache_functions_refuse_a_cache_without_blocks_or_tokens(shape):
    cache = torch.zeros(shape, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"kv_cache must hold at least one block of at least one token"):
        write_k_cache(cache, torch.randn(0, 128), torch.tensor([], dtype=torch.int64))
    with pytest.raises(ValueError, match=r"kv_cache must hold at least one block of at least one token"):
        read_slots(cache, torch.tensor([], dtype=torch.int64))
