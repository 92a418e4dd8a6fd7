"""DeepGEMM's own test of paged MQA logits (``tests/test_attention.py::test_paged_mqa_logits``, DeepGEMM 54e2261) in
our words, pointed at any module with DeepGEMM's API: :mod:`preshuffle.deepgemm_compat`, or DeepGEMM itself.

Its inputs (:func:`paged_inputs`): bf16 queries ``[B, next_n, H, 128]`` and bf16 keys from a standard normal, fp32
weights; context lengths uniform in ``[0.7, 1.3)`` x the average; each sequence's pages dealt from one random
permutation of all pages; ``max_context_len`` the longest sequence's pages. The queries are cast to e4m3, each key to
e4m3 with its own scale (its largest |value|, at least 1e-4, over 448). Row j of a sequence of context c sees the
first ``floor((c + 1) * u)`` positions, u uniform in [0, 1), the last row all c.

Its references: each sequence scored in bf16 (``q @ k`` rounded to bf16, then relu, weights and the head sum in fp32),
once on the bf16 inputs and once on what the fp8 casts give back ("simulated").

Its checks (:func:`check`): 20 reruns bitwise equal where a row may see (every other position zeroed first); the
output's dtype; DeepGEMM's calc_diff against the bf16 reference below 1e-3, and against the simulated one below
5e-6 (fp32 logits) or 3e-5 (bf16); with ``clean_logits``, -inf exactly where a row may not see.

The cases: every one DeepGEMM enumerates on SM90 (:data:`SM90_CASES`), ours beyond them (:data:`OUR_CASES`: next_n 3
and 4 on natural and preshuffled 16-token pages), and small ones Triton's interpreter runs in seconds
(:data:`CPU_CASES`).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from ..layout import preshuffle
from .numeric import assert_bitwise_equal, calc_diff

HEAD_DIM = 128
FP8_E4M3_MAX = 448.0
# DeepGEMM's bounds (tests/test_attention.py): calc_diff against the bf16 reference, and against the simulated one.
DIFF_BOUND = 1e-3
SIMULATED_DIFF_BOUND = {torch.float32: 5e-6, torch.bfloat16: 3e-5}
RERUNS = 20
MAX_POOL_TOKENS = 32 * 1024 * 1024  # DeepGEMM skips cases whose pages hold more tokens


@dataclass(frozen=True)
class PagedCase:
    """One case of the test: ``batch`` sequences of ``avg_kv`` tokens on average, ``next_n`` query rows each,
    ``heads`` heads, pages of ``block_kv`` tokens in ``layout``, logits of ``logits_dtype``."""

    batch: int
    next_n: int
    heads: int
    avg_kv: int
    logits_dtype: torch.dtype = torch.float32
    block_kv: int = 64
    layout: str = "normal"
    clean_logits: bool = False

    @property
    def label(self) -> str:
        dtype = "bf16" if self.logits_dtype == torch.bfloat16 else "fp32"
        pages = f"{self.block_kv}-token {'preshuffled' if self.layout == 'shuffle' else 'natural'} pages"
        return (f"B={self.batch} next_n={self.next_n} H={self.heads} L={self.avg_kv} {dtype} logits, {pages}"
                + (", clean" if self.clean_logits else ""))

    def as_dict(self) -> dict:
        return {"batch": self.batch, "next_n": self.next_n, "heads": self.heads, "avg_kv": self.avg_kv,
                "logits_dtype": str(self.logits_dtype).removeprefix("torch."), "block_kv": self.block_kv,
                "layout": self.layout, "clean_logits": self.clean_logits}


def _sm90_cases() -> tuple[PagedCase, ...]:
    """DeepGEMM's enumeration on SM90: fp8 queries, fp32 weights, 64-token pages, 2-D lengths without the clean."""
    return tuple(PagedCase(batch, next_n, heads, avg_kv, logits_dtype)
                 for logits_dtype, batch, next_n, heads, avg_kv in itertools.product(
                     (torch.bfloat16, torch.float32), (256, 4096), (1, 2), (32, 64), (8192, 65536))
                 if batch * avg_kv <= MAX_POOL_TOKENS)


SM90_CASES = _sm90_cases()
OUR_CASES = tuple(PagedCase(256, next_n, 64, 8192, logits_dtype, 16, layout)
                  for next_n, layout, logits_dtype in itertools.product(
                      (3, 4), ("normal", "shuffle"), (torch.float32, torch.bfloat16)))
CPU_CASES = (
    PagedCase(3, 1, 32, 300),
    PagedCase(2, 2, 64, 150, torch.bfloat16),
    PagedCase(2, 3, 32, 150, torch.float32, 16, "shuffle"),
    PagedCase(2, 4, 32, 150, torch.bfloat16, 1, clean_logits=True),
    PagedCase(2, 2, 32, 200, torch.bfloat16, 32),
)


@dataclass
class PagedInputs:
    """A case's inputs as the kernel takes them, its two references, and where each row may not see."""

    case: PagedCase
    q: torch.Tensor             # e4m3 [B, next_n, H, D]
    kv_cache: torch.Tensor      # uint8 [num_blocks, block_kv, 1, D + 4], in the case's layout
    weights: torch.Tensor       # fp32 [B * next_n, H]
    context_lens: torch.Tensor  # int32 [B, next_n]
    block_table: torch.Tensor   # int32 [B, max_blocks]
    max_context_len: int
    reference: torch.Tensor     # fp32 [B * next_n, max_context_len], from the bf16 inputs
    simulated: torch.Tensor     # the same from what the fp8 casts give back
    hidden: torch.Tensor        # bool [B * next_n, max_context_len]: where a row may not see


def _keys_to_fp8(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """bf16 pages ``[num_blocks, block, 1, D]`` -> (the block-flat uint8 cache, e4m3 values then fp32 scales; the
    keys the cache gives back, in bf16). Each token's scale is its largest |value| (at least 1e-4) over 448."""
    num_blocks, block, _, dim = keys.shape
    scale = keys.abs().float().amax(dim=3, keepdim=True).clamp(min=1e-4) / FP8_E4M3_MAX
    values = (keys * (1.0 / scale)).to(torch.float8_e4m3fn)
    cache = torch.empty(num_blocks, block * (dim + 4), dtype=torch.uint8, device=keys.device)
    cache[:, :block * dim] = values.view(num_blocks, block * dim).view(torch.uint8)
    cache[:, block * dim:] = scale.view(num_blocks, block).view(torch.uint8)
    return cache.view(num_blocks, block, 1, dim + 4), (values.float() * scale).to(keys.dtype)


def _bf16_reference(q, keys, weights, context_lens, block_table, max_context_len) -> torch.Tensor:
    """Each sequence's logits over its whole context, scores in bf16: fp32 ``[B * next_n, max_context_len]``, -inf
    past the context."""
    batch, next_n, heads, dim = q.shape
    block = keys.shape[1]
    out = torch.full((batch * next_n, max_context_len), float("-inf"), dtype=torch.float32, device=q.device)
    for b, n in enumerate(context_lens.tolist()):
        pages = keys[block_table[b, :-(-n // block)].long()]                          # [pages, block, 1, D]
        k = pages.permute(2, 3, 0, 1).reshape(1, dim, -1)[..., :n]                    # [1, D, n]
        scores = torch.matmul(q[b].transpose(0, 1), k).float()                       # [H, next_n, n], bf16 sums
        w = weights[b * next_n:(b + 1) * next_n].transpose(0, 1)[..., None]           # [H, next_n, 1]
        out[b * next_n:(b + 1) * next_n, :n] = (scores.relu() * w).sum(dim=0)
    return out


def paged_inputs(case: PagedCase, *, seed: int = 0, device: str | torch.device = "cuda") -> PagedInputs:
    """The inputs of ``case``, built as DeepGEMM's test builds them (module docstring), from ``seed``."""
    g = torch.Generator(device=device).manual_seed(seed)
    batch, next_n, heads, block = case.batch, case.next_n, case.heads, case.block_kv
    q = torch.randn(batch, next_n, heads, HEAD_DIM, generator=g, device=device, dtype=torch.bfloat16)
    weights = torch.randn(batch * next_n, heads, generator=g, device=device, dtype=torch.float32)
    context_lens = torch.randint(int(0.7 * case.avg_kv), int(1.3 * case.avg_kv), (batch,), generator=g,
                                 device=device, dtype=torch.int32)
    blocks = (context_lens + block - 1) // block
    max_blocks, num_blocks = int(blocks.max()), int(blocks.sum())
    max_context_len = max_blocks * block
    keys = torch.randn(num_blocks, block, 1, HEAD_DIM, generator=g, device=device, dtype=torch.bfloat16)
    pool = torch.randperm(num_blocks, generator=g, device=device, dtype=torch.int32)
    first = torch.cumsum(blocks, 0) - blocks                                          # each sequence's first page
    column = torch.arange(max_blocks, device=device)
    dealt = pool[(first[:, None] + column).clamp(max=num_blocks - 1)]
    block_table = torch.where(column < blocks[:, None], dealt, 0).to(torch.int32)
    reference = _bf16_reference(q, keys, weights, context_lens, block_table, max_context_len)

    q_fp8 = q.to(torch.float8_e4m3fn)
    kv_cache, keys_back = _keys_to_fp8(keys)
    del keys
    simulated = _bf16_reference(q_fp8.to(torch.bfloat16), keys_back, weights, context_lens, block_table,
                                max_context_len)
    del keys_back
    if case.layout == "shuffle":
        flat = kv_cache.view(num_blocks, -1)
        flat[:, :block * HEAD_DIM] = preshuffle(flat[:, :block * HEAD_DIM].view(num_blocks, block, HEAD_DIM))

    rows = ((context_lens[:, None] + 1) * torch.rand(batch, next_n, generator=g, device=device)).int()
    rows[:, -1] = context_lens
    hidden = ~(torch.arange(max_context_len, device=device) < rows.view(-1, 1))
    return PagedInputs(case, q_fp8, kv_cache, weights, rows.contiguous(), block_table, max_context_len, reference,
                       simulated, hidden)


def call_of(module, inputs: PagedInputs, num_sms: int | None = None):
    """``fn() -> logits``: ``module``'s ``fp8_fp4_paged_mqa_logits`` on ``inputs``, with the schedule built once from
    ``num_sms`` slots (default: ``module.get_num_sms()``); preshuffled pages go by ``layout="shuffle"``, a keyword
    only :mod:`preshuffle.deepgemm_compat` takes."""
    case = inputs.case
    slots = module.get_num_sms() if num_sms is None else num_sms
    schedule = module.get_paged_mqa_logits_metadata(inputs.context_lens, case.block_kv, slots)
    layout = {"layout": "shuffle"} if case.layout == "shuffle" else {}
    return lambda: module.fp8_fp4_paged_mqa_logits(
        (inputs.q, None), inputs.kv_cache, inputs.weights, inputs.context_lens, inputs.block_table, schedule,
        inputs.max_context_len, case.clean_logits, logits_dtype=case.logits_dtype, **layout)


def check(fn, inputs: PagedInputs, reruns: int = RERUNS) -> dict:
    """DeepGEMM's checks of ``fn()`` on ``inputs`` (module docstring): each check's result, the two calc_diffs, and
    ``passed`` when every one holds."""
    case, hidden = inputs.case, inputs.hidden
    logits = fn()
    first = logits.masked_fill(hidden, 0)
    repeat_error = None
    for run in range(2, reruns + 2):
        try:
            assert_bitwise_equal(fn().masked_fill(hidden, 0), first)
        except AssertionError as error:
            repeat_error = f"rerun {run - 1} of {reruns}: {error}"
            break
    verdict = {"case": case.as_dict(), "label": case.label, "dtype": str(logits.dtype).removeprefix("torch."),
               "shape": list(logits.shape), "bitwise_repeatable": repeat_error is None}
    if repeat_error:
        verdict["repeat_error"] = repeat_error
    logits = logits.float()
    verdict["mask_exact"] = bool(torch.equal(logits == float("-inf"), hidden)) if case.clean_logits else None
    shown = logits.masked_fill(hidden, 0)
    verdict["diff"] = calc_diff(shown, inputs.reference.masked_fill(hidden, 0))
    verdict["simulated_diff"] = calc_diff(shown, inputs.simulated.masked_fill(hidden, 0))
    verdict["passed"] = (verdict["bitwise_repeatable"] and verdict["dtype"] == str(case.logits_dtype).split(".")[-1]
                         and verdict["mask_exact"] is not False and verdict["diff"] < DIFF_BOUND
                         and verdict["simulated_diff"] < SIMULATED_DIFF_BOUND[case.logits_dtype])
    return verdict
