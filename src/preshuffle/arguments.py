"""Checks of plain integer arguments (sizes, counts, positions), shared by every module so that each error names
its argument and what was expected. Python ints and NumPy integers are accepted; bools are not (True is no block
size), nor floats (16.0 would index as 16 but 16.5 silently as 16)."""

from __future__ import annotations

import numpy as np


def _int(value, name: str, expected: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")
    return int(value)


def positive_int(value, name: str) -> int:
    value = _int(value, name, "a positive int")
    if value <= 0:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return value


def non_negative_int(value, name: str) -> int:
    value = _int(value, name, "a non-negative int")
    if value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value}")
    return value


def int_in_range(value, name: str, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high)``."""
    value = _int(value, name, f"an int in [{low}, {high})")
    if not low <= value < high:
        raise ValueError(f"{name} must be in [{low}, {high}), got {value}")
    return value
