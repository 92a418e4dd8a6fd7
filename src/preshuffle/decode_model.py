"""A model of one decode step of a DeepSeek-sparse-attention MoE model, to see what share of it the indexer takes
(its logits kernel and its top-k) and what a faster kernel buys. ``docs/decode-model.md`` sources every figure.

**The floor** (:class:`DecodeModel`): bytes over bandwidth for what a step must read once, per GPU:

* weights: every weight but the routed experts' (attention, dense layers, shared experts, embeddings: the active
  parameters less the routed experts a token uses), plus, in each MoE layer, every expert some token of the batch
  routes to. With ``b`` tokens each routed to ``k`` of ``E`` experts, ``E * (1 - (1 - k/E)**b)`` experts are touched
  on average (routing taken as uniform and independent): ``k`` for one token, nearly all ``E`` for a large batch.
  Tensor parallelism splits the weights over ``tensor_parallel`` GPUs;
* the indexer, in each layer that runs it: every token of the context from its K cache (132 bytes) and its logit
  written (4 bytes), per query row; its top-k reads the logits again (4 bytes a token); the indexer's cache is
  replicated on every tensor-parallel GPU (it is one head), so neither term splits;
* the sparse attention, in every layer: the top-k tokens of the fp8 MLA cache (656 bytes a token).

A kernel that reaches a share ``e`` of the bandwidth takes ``1/e`` of its floor (``indexer_efficiency``,
``topk_efficiency``). At small batches a step is far above this floor (kernel launches, tensor-parallel
all-reduces): the floor says which bytes grow with batch and context, not how long a step takes.

**The step from a measured gain** (:class:`MeasuredStep`): a kernel that went from ``before`` to ``after`` per
call, called ``calls`` times a step, made the step ``g`` times faster; so the step took
``calls * (before - after) / (1 - 1/g)``. Its share of the step was Amdahl's ``(1 - 1/g) / (1 - 1/k)`` for the
kernel speed-up ``k = before / after``, whatever ``calls`` is; and a kernel that stays the same (the top-k) has the
share its per-call time has of the per-call saving, times ``1 - 1/g``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .arguments import positive_int

INDEXER_BYTES_PER_TOKEN = 132  # 128 fp8 values and an fp32 scale
LOGIT_BYTES = 4                # an fp32 logit, written by the logits kernel and read by the top-k
MLA_FP8_BYTES_PER_TOKEN = 656  # DeepSeek-V3.2's fp8 MLA cache: 512 fp8 values, 4 fp32 scales, 64 bf16 rope dims
MXFP4_BYTES_PER_PARAM = 4.25 / 8  # OCP microscaling: 4-bit elements, one 8-bit scale per 32


@dataclass(frozen=True)
class Geometry:
    """What a model's decode step reads, from its published configuration."""

    name: str
    layers: int
    moe_layers: int
    experts: int             # routed experts of a MoE layer
    experts_per_token: int   # routed experts a token goes to
    hidden: int
    moe_intermediate: int
    active_params: float     # parameters a token uses, as the model card gives them
    indexer_layers: int      # layers that run the indexer (every layer, unless layers share its selection)
    topk: int                # tokens the indexer keeps for sparse attention

    @property
    def expert_params(self) -> int:
        """One routed expert: gate, up and down projections."""
        return 3 * self.hidden * self.moe_intermediate

    @property
    def shared_params(self) -> float:
        """The parameters every token uses whatever its routing: the active ones less its routed experts."""
        return self.active_params - self.moe_layers * self.experts_per_token * self.expert_params

    @property
    def total_params(self) -> float:
        return self.shared_params + self.moe_layers * self.experts * self.expert_params


DEEPSEEK_V32 = Geometry("DeepSeek-V3.2", layers=61, moe_layers=58, experts=256, experts_per_token=8, hidden=7168,
                        moe_intermediate=2048, active_params=37e9, indexer_layers=61, topk=2048)
# GLM-5.2 runs the indexer in the first of every four layers and shares its selection with the next three.
GLM_52 = Geometry("GLM-5.2", layers=78, moe_layers=75, experts=256, experts_per_token=8, hidden=6144,
                  moe_intermediate=2048, active_params=40e9, indexer_layers=20, topk=2048)


@dataclass(frozen=True)
class DecodeModel:
    """The memory-traffic floor of a decode step (module docstring). Defaults: DeepSeek-V3.2 in fp8 on eight GPUs
    with the H200's copy bandwidth."""

    geometry: Geometry = DEEPSEEK_V32
    expert_bytes_per_param: float = 1.0   # fp8
    shared_bytes_per_param: float = 1.0   # fp8
    tensor_parallel: int = 8
    bandwidth: float = 4.25e12            # bytes/s a GPU, the copy ceiling
    indexer_efficiency: float = 1.0       # share of the bandwidth the logits kernel reaches
    topk_efficiency: float = 1.0          # share of the bandwidth the top-k reaches

    def experts_touched(self, batch: int) -> float:
        """Routed experts of one MoE layer that some of ``batch`` tokens go to, on average."""
        g = self.geometry
        return g.experts * (1.0 - (1.0 - g.experts_per_token / g.experts) ** positive_int(batch, "batch"))

    def weight_bytes(self, batch: int) -> float:
        """Weight bytes one GPU reads in a step of ``batch`` tokens."""
        g = self.geometry
        experts = g.moe_layers * self.experts_touched(batch) * g.expert_params * self.expert_bytes_per_param
        return (g.shared_params * self.shared_bytes_per_param + experts) / self.tensor_parallel

    def step_seconds(self, batch: int, context: int) -> dict:
        """Each term of the floor for ``batch`` query rows that see ``context`` tokens each, and their total."""
        g = self.geometry
        tokens = positive_int(batch, "batch") * positive_int(context, "context")
        weights = self.weight_bytes(batch) / self.bandwidth
        indexer = (g.indexer_layers * tokens * (INDEXER_BYTES_PER_TOKEN + LOGIT_BYTES)
                   / (self.bandwidth * self.indexer_efficiency))
        topk = g.indexer_layers * tokens * LOGIT_BYTES / (self.bandwidth * self.topk_efficiency)
        attention = g.layers * batch * min(context, g.topk) * MLA_FP8_BYTES_PER_TOKEN / self.bandwidth
        return {"weights": weights, "indexer": indexer, "topk": topk, "attention": attention,
                "total": weights + indexer + topk + attention}

    def indexer_share(self, batch: int, context: int) -> float:
        """The logits kernel's share of the floor."""
        t = self.step_seconds(batch, context)
        return t["indexer"] / t["total"]

    def indexer_step_share(self, batch: int, context: int) -> float:
        """The share of the logits kernel and the top-k together."""
        t = self.step_seconds(batch, context)
        return (t["indexer"] + t["topk"]) / t["total"]


# The setup of vLLM PR #51216's measurement: GLM-5.2 with MXFP4 experts (fp8 elsewhere: an assumption) on four
# MI355X, tensor parallel, at their 8 TB/s.
GLM52_MI355X_TP4 = DecodeModel(GLM_52, expert_bytes_per_param=MXFP4_BYTES_PER_PARAM, tensor_parallel=4,
                               bandwidth=8e12)


@dataclass(frozen=True)
class MeasuredStep:
    """A step reconstructed from one measured gain (module docstring). Defaults: vLLM PR #51216 (AITER's paged-MQA
    kernel 28.53 -> 7.84 us, about 2.5% end-to-end throughput), one call a step in each of GLM-5.2's indexer
    layers, and the decode steps taken as the whole run (prefill not modelled). ``topk_us``: the top-k's time a
    call, which the PR left unchanged (an assumption: none is measured on that machine)."""

    before_us: float = 28.53
    after_us: float = 7.84
    end_to_end_gain: float = 1.025
    calls: int = GLM_52.indexer_layers
    topk_us: float = 0.0

    @property
    def kernel_speedup(self) -> float:
        return self.before_us / self.after_us

    @property
    def step_us(self) -> float:
        """The step's time before the change."""
        return self.calls * (self.before_us - self.after_us) / (1.0 - 1.0 / self.end_to_end_gain)

    def shares(self) -> dict:
        """Shares of the step before the change: the logits kernel's, the top-k's and both together, before and
        after."""
        step = self.step_us
        after_step = step / self.end_to_end_gain
        return {"logits": self.calls * self.before_us / step, "topk": self.calls * self.topk_us / step,
                "indexer_step": self.calls * (self.before_us + self.topk_us) / step,
                "indexer_step_after": self.calls * (self.after_us + self.topk_us) / after_step}

    @property
    def indexer_step_speedup(self) -> float:
        """What the change made of the logits kernel and the top-k together."""
        return (self.before_us + self.topk_us) / (self.after_us + self.topk_us)

    def gain_of(self, *, logits_us: float | None = None, topk_us: float | None = None) -> float:
        """The step's speed-up, against the step after the measured change, if a call of the logits kernel took
        ``logits_us`` and one of the top-k ``topk_us`` instead (None: as after the change)."""
        now = self.step_us / self.end_to_end_gain
        saved = self.calls * ((self.after_us - (self.after_us if logits_us is None else logits_us))
                              + (self.topk_us - (self.topk_us if topk_us is None else topk_us)))
        return now / (now - saved)

    def with_topk(self, topk_us: float) -> MeasuredStep:
        return replace(self, topk_us=topk_us)


def end_to_end_speedup(share: float, kernel_speedup: float) -> float:
    """Amdahl: the step's speed-up when a part taking ``share`` of it gets ``kernel_speedup`` faster."""
    return 1.0 / (1.0 - share + share / kernel_speedup)


def implied_share(end_to_end_gain: float, kernel_speedup: float) -> float:
    """The share a kernel must have had for ``kernel_speedup`` to give ``end_to_end_gain`` overall."""
    return (1.0 - 1.0 / end_to_end_gain) / (1.0 - 1.0 / kernel_speedup)
