"""Block tables read as slots: slot_mapping and its int64 checks."""

import numpy as np
import pytest

from preshuffle.paging import INT64_MAX, slot_mapping


def test_slot_mapping_beyond_table():
    with pytest.raises(ValueError, match="beyond the block table"):
        slot_mapping([3, 4], [32], 16)


@pytest.mark.parametrize("table, positions, block_size", [([2**60], [3], 16), ([0, 2**62], [20], 16),
                                                         ([2**63 // 16], [0], 16)])
def test_slot_mapping_refuses_block_ids_whose_slots_overflow(table, positions, block_size):
    # Unchecked, 2**60 * 16 wraps to 0: position 3 read slot 3 of block 0.
    with pytest.raises(ValueError, match=r"block_table holds block id \d+: times block_size 16 it would overflow "
                                         r"int64"):
        slot_mapping(table, positions, block_size)


def test_slot_mapping_takes_the_largest_id_that_fits():
    top = (INT64_MAX - 15) // 16
    assert slot_mapping([top], [15], 16).tolist() == [INT64_MAX]


def test_slot_mapping_refuses_unsigned_ids_past_int64():
    with pytest.raises(ValueError, match="block_table holds 9223372036854775808, which does not fit int64"):
        slot_mapping(np.array([2**63], dtype=np.uint64), [0], 16)


def test_slot_mapping_bad_arguments():
    with pytest.raises(TypeError, match="block_table must be integers"):
        slot_mapping([1.5, 2.0], [0], 16)
    with pytest.raises(TypeError, match="positions must be integers"):
        slot_mapping([1, 2], [0.5], 16)
    with pytest.raises(ValueError, match="block_table holds block id -1 at index 1, which position 17 reads"):
        slot_mapping([1, -1], [3, 17], 16)
    assert slot_mapping([1, -1], [3], 16).tolist() == [19]  # an unread entry may hold padding


def test_slot_mapping_refuses_a_negative_position():
    # Unchecked, -1 would read table[-1] and give slot 4 * 16 + 15 = 79 of another position.
    with pytest.raises(ValueError, match="^positions must be non-negative$"):
        slot_mapping([3, 4], [5, -1], 16)


@pytest.mark.parametrize("table", [[[0, 1], [2, 3]], 5])
def test_slot_mapping_refuses_a_table_that_is_not_one_sequences(table):
    with pytest.raises(ValueError, match=r"block_table must be one sequence's 1-D table \[max_blocks\], got shape"):
        slot_mapping(table, [2, 3], 1)
