"""Figures recorded by the performance spec's anchor run, cited, not measured here: NVIDIA H200, 2026-11-29,
DeepGEMM 2.6.1's ``fp8_paged_mqa_logits`` at kernel block size 64, beside the spec's naive Triton kernel and its
PyTorch baseline. The workbook sets them beside our measured rows until a run measures them too.
"""

from __future__ import annotations

from typing import NamedTuple

from .shapes import Shape


class Recorded(NamedTuple):
    us: float
    gb_per_s: float
    pct_copy: float          # of the 4.25 TB/s copy ceiling of that run
    naive_triton_us: float
    torch_us: float | None   # None: the spec did not record the PyTorch baseline at this shape


DEEPGEMM_H200 = {
    Shape(64, 1, 8192): Recorded(30.0, 2462, 58, 48.4, 1107),
    Shape(64, 2, 8192): Recorded(30.7, 2425, 57, 82.5, 1612),
    Shape(128, 1, 32768): Recorded(146.1, 3844, 90, 299.0, None),
    Shape(256, 1, 8192): Recorded(81.7, 3540, 83, 159.9, 4118),
    Shape(4096, 1, 8192): Recorded(1104.7, 4173, 98, 2628.0, None),
    Shape(8, 1, 65536): Recorded(30.3, 2579, 61, 50.8, 1124),
    Shape(1, 1, 131072): Recorded(14.6, 1555, 37, 20.5, 353),
    Shape(256, 2, 65536): Recorded(641.1, 3649, 86, 2233.3, None),
}
