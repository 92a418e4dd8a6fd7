"""DeepGEMM, the performance anchor, called on a :class:`~preshuffle.problem.PagedMQAProblem` in the same process
as our kernels, so its time and error come from the same run and the same inputs.

DeepGEMM 2.6.1's SM90 ``fp8_fp4_paged_mqa_logits`` takes kernel block size 64, the natural layout, 32 or 64 heads
and next_n 1 or 2, with a ``[B, next_n]`` visible length per row, and schedule metadata built beforehand (as vLLM
builds it once per step, so it is not timed). It leaves positions outside each row's visible prefix unwritten:
compare its output through the reference's -inf pattern (:func:`masked_like`). The workbook does not ship it:
docs/sources.md says where to get it and how to build it.
"""

from __future__ import annotations

import torch

from .contract import kv_lengths
from .problem import PagedMQAProblem


def load():
    """The ``deep_gemm`` module, or None where it does not import (no build, no sm90 GPU)."""
    try:
        import deep_gemm
    except Exception:  # noqa: BLE001 (a failed build raises more than ImportError)
        return None
    return deep_gemm


def refusal(problem: PagedMQAProblem) -> str | None:
    """Why DeepGEMM's SM90 kernel cannot take ``problem``, or None when it can."""
    if problem.block_size != 64 or problem.layout != "normal":
        return f"block size {problem.block_size} {problem.layout}: DeepGEMM takes 64-token natural blocks"
    if problem.next_n not in (1, 2) or problem.heads not in (32, 64) or problem.head_dim != 128:
        return f"next_n {problem.next_n}, {problem.heads} heads: its SM90 kernel takes next_n 1-2, 32 or 64 heads"
    if problem.context_lens.dim() != 1:
        return "2-D context lengths (this adapter takes 1-D)"
    return None


def logits_fn(deep_gemm, problem: PagedMQAProblem):
    """A call of DeepGEMM on ``problem`` with its schedule built once: ``fn() -> [B * next_n, max_model_len]``."""
    reason = refusal(problem)
    if reason:
        raise ValueError(f"DeepGEMM cannot take this problem: {reason}")
    q, kv_cache, weights, context_lens, block_tables, max_model_len = problem.args
    visible = kv_lengths(context_lens, problem.next_n).to(torch.int32)
    schedule = deep_gemm.get_paged_mqa_logits_metadata(visible, problem.block_size, deep_gemm.get_num_sms())
    return lambda: deep_gemm.fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, visible, block_tables, schedule,
                                                      max_model_len, False)


def flattened(problem: PagedMQAProblem) -> PagedMQAProblem:
    """The same query rows as ``next_n = 1`` sequences (row b*next_n + j becomes a sequence of its own that sees
    ``ctx_b - next_n + j + 1`` positions through b's block table): how a kernel without multi-token prediction
    serves it. Its logits are the original's, row for row."""
    n = problem.next_n
    q = problem.q.reshape(problem.batch * n, 1, problem.heads, problem.head_dim).contiguous()
    lens = kv_lengths(problem.context_lens, n).reshape(-1).to(torch.int32)
    tables = problem.block_tables.repeat_interleave(n, dim=0).contiguous()
    return PagedMQAProblem(q, problem.kv_cache, problem.weights.contiguous(), lens, tables, problem.max_model_len,
                           problem.layout)


def masked_like(out: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``out`` with -inf wherever ``reference`` is -inf: DeepGEMM's unwritten positions set to the contract."""
    return torch.where(torch.isneginf(reference.to(out.device)), float("-inf"), out.to(torch.float64)).float()
