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

# The five caches the workbook compares: name -> (kernel block size, layout).
VARIANTS = {
    "block1": (1, "normal"),
    "block16-normal": (16, "normal"),
    "block16-shuffle": (16, "shuffle"),
    "block64-normal": (64, "normal"),
    "block64-shuffle": (64, "shuffle"),
}
