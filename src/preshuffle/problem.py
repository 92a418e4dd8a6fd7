"""One paged-MQA-logits problem: the six arguments of the kernel and the reference, and the layout of its cache.

The kernels keep vLLM's and DeepGEMM's tensor signature; a problem hands them its arguments together with its
layout (:meth:`PagedMQAProblem.call`), so a caller cannot drop the layout on the way.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .arguments import non_negative_int, positive_int
from .cache import SCALE_BYTES
from .contract import kv_lengths
from .layout import LAYOUTS


@dataclass(frozen=True, eq=False)  # tensors do not compare to one bool: a problem equals only itself
class PagedMQAProblem:
    q: torch.Tensor
    kv_cache: torch.Tensor
    weights: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    max_model_len: int
    layout: str = "normal"
    # Tokens read (sum over sequences of the longest row's visible prefix), as the builder knew it without a
    # device sync; None: counted from context_lens when needed.
    sum_ctx: int | None = None

    def __post_init__(self):
        # The scalars that are the problem's own (the tensors are checked by the calls that read them): a negative
        # sum_ctx made ``bytes`` negative, a max_model_len of 0 an empty output row.
        positive_int(self.max_model_len, "max_model_len")
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.sum_ctx is not None:
            non_negative_int(self.sum_ctx, "sum_ctx")

    @property
    def args(self) -> tuple:
        """The positional arguments of the reference and the kernels, in order."""
        return self.q, self.kv_cache, self.weights, self.context_lens, self.block_tables, self.max_model_len

    def call(self, fn, **kwargs):
        """``fn(*self.args, layout=self.layout, **kwargs)``."""
        return fn(*self.args, layout=self.layout, **kwargs)

    # Dimensions, read off the tensors.
    batch = property(lambda self: self.q.shape[0])
    next_n = property(lambda self: self.q.shape[1])
    heads = property(lambda self: self.q.shape[2])
    head_dim = property(lambda self: self.q.shape[3])
    num_blocks = property(lambda self: self.kv_cache.shape[0])
    block_size = property(lambda self: self.kv_cache.shape[1])

    def _tokens_read(self) -> int:
        if self.sum_ctx is not None:
            return self.sum_ctx
        return int(kv_lengths(self.context_lens, self.next_n).amax(dim=1).clamp(min=0).sum())

    @property
    def bytes(self) -> int:
        """Bytes one call moves, as docs/performance.md counts them: every token read once (values and scale),
        the queries, weights and block table, and the logits written inside each row's context."""
        tokens = self._tokens_read()
        return (tokens * (self.head_dim + SCALE_BYTES) + self.q.numel() * self.q.element_size()
                + self.weights.numel() * self.weights.element_size()
                + self.block_tables.numel() * self.block_tables.element_size() + tokens * self.next_n * 4)

    @property
    def flops(self) -> int:
        """``2 * sum(ctx) * next_n * heads * head_dim``, as docs/performance.md counts them."""
        return 2 * self._tokens_read() * self.next_n * self.heads * self.head_dim

    def replace(self, **changes) -> PagedMQAProblem:
        """A copy with some fields changed; new context lengths are counted afresh unless ``sum_ctx`` is given."""
        if "context_lens" in changes:
            changes.setdefault("sum_ctx", None)
        return dataclasses.replace(self, **changes)

    def to(self, device) -> PagedMQAProblem:
        tensors = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return dataclasses.replace(self, **{name: t.to(device) for name, t in tensors.items()
                                            if isinstance(t, torch.Tensor)})
