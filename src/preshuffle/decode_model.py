"""A memory-traffic model of one decode step, to see what share of it the indexer's logits kernel takes.

Every term is bytes over bandwidth, which is what a decode step of a large MoE model is: weights read once
per step, then per sequence and layer the indexer's K cache (132 bytes a token, every token of the context)
and the sparse MLA attention over the top-k tokens (656 bytes a token in DeepSeek-V3.2's fp8 MLA cache).
The defaults are DeepSeek-V3.2's geometry; they are assumptions of the model, stated, not measurements.

Amdahl's law links a kernel speed-up ``k`` to the step's: ``1 / (1 - s + s / k)`` for an indexer share ``s``;
so a measured end-to-end gain ``g`` and kernel gain ``k`` imply ``s = (1 - 1/g) / (1 - 1/k)``.
"""

from __future__ import annotations

from dataclasses import dataclass

INDEXER_BYTES_PER_TOKEN = 132
MLA_FP8_BYTES_PER_TOKEN = 656


@dataclass(frozen=True)
class DecodeModel:
    layers: int = 61
    active_weight_bytes: float = 37e9      # 37B active parameters, fp8
    topk: int = 2048                       # tokens the indexer selects for sparse attention
    bandwidth: float = 4.25e12             # bytes/s, the copy ceiling
    indexer_efficiency: float = 1.0        # share of the bandwidth the indexer kernel reaches

    def step_seconds(self, batch: int, context: int) -> dict:
        weights = self.active_weight_bytes / self.bandwidth
        indexer = self.layers * batch * context * INDEXER_BYTES_PER_TOKEN / (self.bandwidth * self.indexer_efficiency)
        attention = self.layers * batch * min(context, self.topk) * MLA_FP8_BYTES_PER_TOKEN / self.bandwidth
        return {"weights": weights, "indexer": indexer, "attention": attention,
                "total": weights + indexer + attention}

    def indexer_share(self, batch: int, context: int) -> float:
        t = self.step_seconds(batch, context)
        return t["indexer"] / t["total"]


def end_to_end_speedup(share: float, kernel_speedup: float) -> float:
    """Amdahl: the step's speed-up when a part taking ``share`` of it gets ``kernel_speedup`` faster."""
    return 1.0 / (1.0 - share + share / kernel_speedup)


def implied_share(end_to_end_gain: float, kernel_speedup: float) -> float:
    """The share a kernel must have had for ``kernel_speedup`` to give ``end_to_end_gain`` overall."""
    return (1.0 - 1.0 / end_to_end_gain) / (1.0 - 1.0 / kernel_speedup)
