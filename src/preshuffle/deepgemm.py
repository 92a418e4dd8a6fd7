"""DeepGEMM, the performance anchor, called on a :class:`~preshuffle.problem.PagedMQAProblem` in the same process
as our kernels, so its time and error come from the same run and the same inputs.

Two lines of DeepGEMM are timed, each build in its own process (both are the module ``deep_gemm``): main (2.6.1 at
54e2261), whose SM90 ``fp8_fp4_paged_mqa_logits`` takes 64-token natural blocks, 32 or 64 heads and next_n 1 or
2; and nv_dev (a6b593d), the line vLLM pins, which also takes 32-token blocks, 16 heads and next_n 4 (two CTAs a
cluster, each with two query rows, so its schedule has one slot per two SMs). :func:`build_info` says which build a
process imported. Either takes a ``[B, next_n]`` visible length per row and schedule metadata built beforehand (as
vLLM builds it once per step, so it is not timed), and leaves positions outside each row's visible prefix unwritten:
compare its output through the reference's -inf pattern (:func:`masked_like`). What a build does not take natively
is timed on the same rows flattened to next_n = 1 (:func:`flattened`), as vLLM runs it. The workbook does not ship
DeepGEMM: docs/sources.md says where to get it and how to build it.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from .contract import kv_lengths
from .problem import PagedMQAProblem

# What each line's SM90 paged kernel takes: next_n values, block sizes, heads (csrc/apis/attention.hpp and
# csrc/jit_kernels/impls/smxx_fp8_fp4_paged_mqa_logits.hpp of DeepGEMM 54e2261 and nv_dev a6b593d).
_TAKES = {"main": ((1, 2), (64,), (32, 64)), "nv_dev": ((1, 2, 4), (32, 64), (16, 32, 64))}
# A build folder named after its source: deepgemm-<commit> (main) or deepgemm-nvdev-<commit>.
_FOLDER = re.compile(r"^deepgemm-(?:(?P<branch>nvdev)-)?(?P<commit>[0-9a-f]{7,40})$")


@dataclass(frozen=True)
class Build:
    """Which DeepGEMM a process imported: its version, branch and commit, and where branch and commit were read
    (``source``: "environment", "build folder", "package version", "unknown", or "default" for :data:`MAIN`). A
    build of unknown branch is taken for main, whose kernel takes the least."""

    version: str | None
    branch: str | None
    commit: str | None
    source: str = "unknown"

    @property
    def _takes(self) -> tuple:
        return _TAKES.get(self.branch, _TAKES["main"])

    next_n = property(lambda self: self._takes[0])
    block_sizes = property(lambda self: self._takes[1])
    heads = property(lambda self: self._takes[2])

    def schedule_slots(self, num_sms: int, next_n: int) -> int:
        """The scheduler slots its metadata must hold: one a cluster of two SMs for nv_dev's next_n = 4 (as vLLM
        passes it), else one an SM."""
        return num_sms // 2 if self.branch == "nv_dev" and next_n == 4 else num_sms

    @property
    def label(self) -> str:
        named = " ".join(x for x in (self.branch, self.commit) if x) or "of unknown branch"
        return named + (f" ({self.version})" if self.version else "")

    def as_dict(self) -> dict:
        return asdict(self)


MAIN = Build("2.6.1", "main", "54e2261", "default")


def build_info(deep_gemm) -> Build:
    """Which build ``deep_gemm`` is: its ``__version__``; branch and commit from ``PRESHUFFLE_DEEPGEMM_BRANCH`` and
    ``PRESHUFFLE_DEEPGEMM_COMMIT`` where set, else from the name of the folder it was built in (deepgemm-<commit>
    for main, deepgemm-nvdev-<commit>), else the commit from the installed package's version (DeepGEMM's own
    ``install.sh`` names it ``2.6.1+<commit>``; its branch stays unknown), else unknown."""
    version = getattr(deep_gemm, "__version__", None)
    branch, commit = os.environ.get("PRESHUFFLE_DEEPGEMM_BRANCH"), os.environ.get("PRESHUFFLE_DEEPGEMM_COMMIT")
    if branch or commit:
        return Build(version, branch, commit, "environment")
    for folder in Path(getattr(deep_gemm, "__file__", None) or "").resolve().parents:
        named = _FOLDER.match(folder.name)
        if named:
            return Build(version, "nv_dev" if named["branch"] else "main", named["commit"], "build folder")
    try:
        local = importlib.metadata.version("deep_gemm").partition("+")[2]
    except importlib.metadata.PackageNotFoundError:
        local = ""
    if re.fullmatch(r"[0-9a-f]{7,40}", local):
        return Build(version, None, local, "package version")
    return Build(version, None, None)


def load():
    """The ``deep_gemm`` module, or None where it does not import (no build, no sm90 GPU)."""
    try:
        import deep_gemm
    except Exception:  # noqa: BLE001 (a failed build raises more than ImportError)
        return None
    return deep_gemm


def _either(values) -> str:
    *head, last = [str(v) for v in values]
    return f"{', '.join(head)} or {last}" if head else last


def refusal(problem: PagedMQAProblem, build: Build = MAIN) -> str | None:
    """Why ``build``'s SM90 kernel cannot take ``problem``, or None when it can."""
    reason = kernel_refusal(build, problem.block_size, problem.layout, problem.next_n, problem.heads,
                            problem.head_dim)
    if reason is None and problem.context_lens.dim() != 1:
        return "2-D context lengths (this adapter takes 1-D)"
    return reason


def kernel_refusal(build: Build, block_size: int, layout: str, next_n: int, heads: int,
                   head_dim: int = 128) -> str | None:
    """Why ``build``'s SM90 kernel cannot take a call of these dimensions, or None when it can."""
    if block_size not in build.block_sizes or layout != "normal":
        return f"block size {block_size} {layout}: DeepGEMM takes {_either(build.block_sizes)}-token natural blocks"
    if next_n not in build.next_n or heads not in build.heads or head_dim != 128:
        rows = "1-2" if build.next_n == (1, 2) else _either(build.next_n)
        return f"next_n {next_n}, {heads} heads: its SM90 kernel takes next_n {rows}, {_either(build.heads)} heads"
    return None


def api_call(module, problem: PagedMQAProblem, slots: int, logits_dtype: torch.dtype = torch.float32,
             clean_logits: bool = False, **keywords):
    """``fn() -> [B * next_n, max_model_len]``: ``module``'s ``fp8_fp4_paged_mqa_logits`` (DeepGEMM's, or
    :mod:`preshuffle.deepgemm_compat`'s, which takes ``keywords`` too) on ``problem``, called as vLLM calls it: each
    row's visible length as ``[B, next_n]`` int32, the schedule built once (not timed) on ``slots`` slots."""
    q, kv_cache, weights, context_lens, block_tables, max_model_len = problem.args
    visible = kv_lengths(context_lens, problem.next_n).to(torch.int32)
    schedule = module.get_paged_mqa_logits_metadata(visible, problem.block_size, slots)
    return lambda: module.fp8_fp4_paged_mqa_logits((q, None), kv_cache, weights, visible, block_tables, schedule,
                                                   max_model_len, clean_logits, logits_dtype=logits_dtype, **keywords)


def logits_fn(deep_gemm, problem: PagedMQAProblem, build: Build | None = None,
              logits_dtype: torch.dtype = torch.float32):
    """A call of DeepGEMM (``build``: which one, by default :func:`build_info`'s) on ``problem`` with its schedule
    built once, leaving unwritten what a row may not see (``clean_logits=False``, what vLLM passes):
    ``fn() -> [B * next_n, max_model_len]`` of ``logits_dtype``."""
    build = build or build_info(deep_gemm)
    reason = refusal(problem, build)
    if reason:
        raise ValueError(f"DeepGEMM cannot take this problem: {reason}")
    return api_call(deep_gemm, problem, build.schedule_slots(deep_gemm.get_num_sms(), problem.next_n), logits_dtype)


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
