"""The benchmark's axes: the eight anchor shapes of docs/performance.md and the five caches it compares (torch-free, so
a results file can be read without the harness)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shape:
    """A batch of ``batch`` sequences of ``avg_ctx`` tokens on average, ``next_n`` query rows each."""

    batch: int
    next_n: int
    avg_ctx: int

    @property
    def label(self) -> str:
        return f"B={self.batch} next_n={self.next_n} ctx={self.avg_ctx}"


ANCHOR_SHAPES = (
    Shape(64, 1, 8192),
    Shape(64, 2, 8192),
    Shape(128, 1, 32768),
    Shape(256, 1, 8192),
    Shape(4096, 1, 8192),
    Shape(8, 1, 65536),
    Shape(1, 1, 131072),
    Shape(256, 2, 65536),
)

# Multi-token prediction with 3 and 4 query rows: DeepGEMM's SM90 kernels take neither (main) or only 4 (nv_dev, on
# clusters of two CTAs); what a build does not take is timed on the same rows flattened to next_n = 1, as vLLM runs
# it. The first is the shape of the next_n = 3 target (docs/performance.md).
MTP_SHAPES = (Shape(64, 3, 8192), Shape(256, 3, 8192), Shape(64, 4, 8192), Shape(256, 4, 8192))
# Every shape the benchmark measures, in order.
MEASURED_SHAPES = ANCHOR_SHAPES + MTP_SHAPES
# The next_n values a run measures: the workload explorer's choices.
MEASURED_NEXT_NS = tuple(sorted({s.next_n for s in MEASURED_SHAPES}))

# The five caches the workbook compares: name -> (kernel block size, layout).
VARIANTS = {
    "block1": (1, "normal"),
    "block16-normal": (16, "normal"),
    "block16-shuffle": (16, "shuffle"),
    "block64-normal": (64, "normal"),
    "block64-shuffle": (64, "shuffle"),
}
# The caches multi-token prediction is measured on: DeepGEMM's, and 16-token natural and preshuffled pages.
MTP_VARIANTS = ("block64-normal", "block16-normal", "block16-shuffle")
