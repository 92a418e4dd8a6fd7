import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from preshuffle.layout import normal_offset, offset_map, preshuffle, shuffle_offset, unshuffle

multiples_of_16 = st.integers(1, 16).map(lambda n: 16 * n)


@pytest.mark.parametrize("token, dim, block_size, expected", [
    (0, 0, 16, 0), (1, 0, 16, 16), (0, 16, 16, 256), (3, 37, 16, 565), (17, 17, 32, 2321), (17, 17, 256, 2321),
])
def test_shuffle_offset_spec_worked_examples(token, dim, block_size, expected):
    assert shuffle_offset(token, dim, block_size) == expected


def test_normal_offset_is_token_major():
    assert normal_offset(3, 37, 16) == 3 * 128 + 37


@given(multiples_of_16)
def test_offset_map_shuffle_is_a_bijection_of_the_value_region(block_size):
    offsets = offset_map(block_size, 128, "shuffle").reshape(-1)
    assert torch.equal(offsets.sort().values, torch.arange(block_size * 128))


def _shuffled_by_definition(values: torch.Tensor) -> torch.Tensor:
    """docs/layout.md's definition, built without the package's formula: the block is cut into 16-token x
    16-dim tiles; tiles go token-group by token-group, and within a group dim-tile after dim-tile; inside a tile each
    token's 16 dims are contiguous, token after token (for B=16, D=128: ``[8 dim-tiles][16 tokens][16 bytes]``)."""
    *lead, b, d = values.shape
    tiles = values.reshape(*lead, b // 16, 16, d // 16, 16)  # [token group][token in tile][dim tile][dim in tile]
    return tiles.transpose(-3, -2).reshape(*lead, b * d)     # [token group][dim tile][token in tile][dim in tile]


@given(multiples_of_16, multiples_of_16)
def test_offset_map_and_preshuffle_match_the_tiles_built_by_their_definition(block_size, head_dim):
    natural = torch.arange(block_size * head_dim).reshape(block_size, head_dim)  # each value is its NORMAL byte
    expected = _shuffled_by_definition(natural)
    # Byte offset_map[t, d] of the shuffled block holds value (t, d); and NORMAL is the natural order itself.
    assert torch.equal(expected[offset_map(block_size, head_dim, "shuffle")], natural)
    assert torch.equal(offset_map(block_size, head_dim, "normal"), natural)
    assert torch.equal(preshuffle(natural.expand(2, -1, -1)), expected.expand(2, -1))
    t, d = block_size - 1, head_dim - 1
    assert expected[shuffle_offset(t, d, block_size, head_dim)] == natural[t, d]


@given(multiples_of_16, st.integers(0, 2**16))
def test_unshuffle_inverts_preshuffle(block_size, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (2, block_size, 128), generator=g, dtype=torch.uint8)
    flat = preshuffle(x)
    assert flat.shape == (2, block_size * 128)
    assert torch.equal(unshuffle(flat, block_size), x)
    # A pure permutation: the same multiset of bytes.
    assert torch.equal(flat.sort(dim=-1).values, x.reshape(2, -1).sort(dim=-1).values)


def test_offset_map_one_lane_reads_16_contiguous_bytes_of_one_token():
    offsets = offset_map(32, 128, "shuffle")
    for t in (0, 5, 21):
        for tile in range(8):
            run = offsets[t, tile * 16:(tile + 1) * 16]
            assert torch.equal(run, run[0] + torch.arange(16))


def test_unshuffle_round_trips_fp8_values():
    x = torch.randn(16, 128).to(torch.float8_e4m3fn)
    assert torch.equal(unshuffle(preshuffle(x), 16).view(torch.uint8), x.view(torch.uint8))


@pytest.mark.parametrize("block_size", [1, 8, 24, 40])
def test_shuffle_offset_refuses_block_sizes_not_multiple_of_16(block_size):
    with pytest.raises(ValueError, match=f"block_size must be a multiple of 16 for the shuffle layout, got {block_size}"):
        offset_map(block_size, 128, "shuffle")
    with pytest.raises(ValueError, match="multiple of 16"):
        shuffle_offset(0, 0, block_size)


def test_shuffle_offset_formula_escapes_an_eight_token_block():
    # Why 8-token blocks cannot be shuffled: the formula does not read the block size, so tokens 0-7 would get the
    # bytes they get in a 16-token block, half of them past an 8-token block's 1024 value bytes, up to byte 1919.
    first_eight = offset_map(16, 128, "shuffle")[:8]
    assert first_eight[7, 127] == shuffle_offset(7, 127, 16) == 1919
    assert first_eight.unique().numel() == 8 * 128 and int((first_eight >= 8 * 128).sum()) == 512
    with pytest.raises(ValueError, match="block_size must be a multiple of 16 for the shuffle layout, got 8"):
        shuffle_offset(7, 127, 8)


def test_offsets_and_shuffles_reject_bad_input():
    with pytest.raises(ValueError, match=r"token must be in \[0, 16\)"):
        shuffle_offset(16, 0, 16)
    with pytest.raises(ValueError, match=r"dim must be in \[0, 128\)"):
        normal_offset(0, 128, 16)
    with pytest.raises(ValueError, match="head_dim must be a multiple of 16"):
        shuffle_offset(0, 0, 16, head_dim=24)
    with pytest.raises(ValueError, match="layout must be one of"):
        offset_map(16, 128, "tiled")
    with pytest.raises(ValueError, match="flat must end in"):
        unshuffle(torch.zeros(100, dtype=torch.uint8), 16)
    with pytest.raises(TypeError, match="values must be a tensor"):
        preshuffle(torch.zeros(16))


@pytest.mark.parametrize("call, exc, message", [
    (lambda: normal_offset(1.5, 0, 16), TypeError, "token must be an int in"),
    (lambda: normal_offset(True, 0, 16), TypeError, "token must be an int in"),
    (lambda: shuffle_offset(0, "3", 16), TypeError, "dim must be an int in"),
    (lambda: normal_offset(0, 0, 0), ValueError, "block_size must be a positive int, got 0"),
    (lambda: offset_map(0), ValueError, "block_size must be a positive int, got 0"),
    (lambda: offset_map(-1), ValueError, "block_size must be a positive int, got -1"),
    (lambda: offset_map(16.0), TypeError, "block_size must be a positive int, got float"),
    (lambda: offset_map(True), TypeError, "block_size must be a positive int, got bool"),
    (lambda: offset_map(16, 0), ValueError, "head_dim must be a positive int, got 0"),
    (lambda: unshuffle([0] * 2048, 16), TypeError, "flat must be a tensor"),
    (lambda: unshuffle(torch.zeros(2048), 16.0), TypeError, "block_size must be a positive int, got float"),
    (lambda: preshuffle(torch.zeros(0, 128)), ValueError, "block_size must be a positive int, got 0"),
])
def test_layout_functions_bad_arguments(call, exc, message):
    with pytest.raises(exc, match=message):
        call()


def test_layout_functions_take_numpy_ints():
    assert normal_offset(np.int64(1), np.int32(2), np.int64(16)) == 130
    assert shuffle_offset(np.int64(3), np.int64(37), np.int64(16)) == 565
    assert torch.equal(offset_map(np.int64(16), np.int64(128), "shuffle"), offset_map(16, 128, "shuffle"))
