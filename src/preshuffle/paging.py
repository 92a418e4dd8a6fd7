"""A sequence's block table read as slots: which slot of the cache each token position lives in, with the int64
checks every table of block ids needs (numpy would truncate floats, wrap unsigned ids and overflow products
silently)."""

from __future__ import annotations

import numpy as np

from .arguments import positive_int

INT64_MAX = np.iinfo(np.int64).max


def integers(values, name: str) -> np.ndarray:
    """``values`` as an int64 array, refusing floats and bools (which numpy would truncate or count as 0/1) and
    unsigned values past int64 (which it would wrap to negative ones)."""
    values = np.asarray(values)
    if values.size and not np.issubdtype(values.dtype, np.integer):
        raise TypeError(f"{name} must be integers, got dtype {values.dtype}")
    if values.size and values.dtype.kind == "u" and int(values.max()) > INT64_MAX:
        raise ValueError(f"{name} holds {int(values.max())}, which does not fit int64")
    return values.astype(np.int64)


def block_slots(ids: np.ndarray, per_block: int, offsets, name: str, per_block_name: str = "block_size"):
    """``ids * per_block + offsets`` with ``offsets`` in ``[0, per_block)``: the slots (or the kernel block ids) that
    non-negative block ids ``ids`` stand for. Refuses an id whose last one does not fit int64, where numpy would
    wrap it silently to another block's, naming ``name``, the argument that holds it."""
    limit = (INT64_MAX - (per_block - 1)) // per_block
    if ids.size and int(ids.max()) > limit:
        raise ValueError(f"{name} holds block id {int(ids.max())}: times {per_block_name} {per_block} it would "
                         f"overflow int64 (ids up to {limit} fit)")
    return ids * per_block + offsets


def slot_mapping(block_table, positions, block_size: int) -> np.ndarray:
    """Physical slot of each token position of one sequence, whose block table is 1-D ``[max_blocks]``:
    ``table[p // block_size] * block_size + p % block_size``."""
    block_size = positive_int(block_size, "block_size")
    table = integers(block_table, "block_table")
    if table.ndim != 1:
        raise ValueError(f"block_table must be one sequence's 1-D table [max_blocks], got shape {list(table.shape)}")
    positions = integers(positions, "positions")
    if (positions < 0).any():
        raise ValueError("positions must be non-negative")
    if positions.size and positions.max() >= table.size * block_size:
        raise ValueError(
            f"position {int(positions.max())} is beyond the block table "
            f"({table.size} blocks of {block_size} tokens)"
        )
    index = positions // block_size
    ids = table[index]
    if (ids < 0).any():
        first = np.flatnonzero(ids < 0)[0]
        raise ValueError(f"block_table holds block id {int(ids.flat[first])} at index {int(index.flat[first])}, "
                         f"which position {int(positions.flat[first])} reads: block ids are >= 0")
    return block_slots(ids, block_size, positions % block_size, "block_table")
