"""How a kernel's output is judged: against the float64 reference, each logit's error relative to its sum of
absolute terms plus an identical -inf pattern (a single bad logit cannot hide), and bitwise against itself."""

from __future__ import annotations

import torch

from .. import device
from ..contract import bad_scale_positions, cache_scales, kv_lengths, unreadable_positions, valid_scales
from ..problem import PagedMQAProblem
from ..reference import reference_and_magnitude

# The exact contract: the largest error of a finite logit, relative to its sum of absolute terms.
RTOL = 1e-5
# Both contracts (docs/accuracy.md), by precision: exact, and fp8 (DeepGEMM's numerics, whose fp8 MMAs round
# their sums: each logit within 1e-3 of its sum of |terms|, DeepGEMM's calc_diff within 1e-7).
CONTRACTS = {"exact": {"max_rel_error": RTOL}, "fp8": {"max_rel_error": 1e-3, "calc_diff": 1e-7}}
# calc_diff is a statistic of a whole output (the benchmark's have 10^5-10^7 logits). Over a few logits it is
# their own squared relative error, which a logit that nearly cancels makes large while it keeps its per-logit
# bound: on the H200 a call with one finite logit, 1.7e-5 of its sum of |terms| off, had calc_diff 8.2e-7. So the
# clause holds outputs of at least one chunk of finite logits; smaller ones are held to the per-logit clause.
CALC_DIFF_MIN_LOGITS = 64
# bf16 logits (``logits_dtype=torch.bfloat16``) are the fp32 logits rounded to nearest even: bf16 keeps 8 significant
# bits, so rounding moves a logit by at most 2**-8 of itself, and a logit is at most (1 + its fp32 error) times its
# sum of |terms|. Each clause is the fp32 one plus that rounding, rounded up: 1e-5 + 2**-8 * (1 + 1e-5) = 3.92e-3
# (exact) and 1e-3 + 2**-8 * 1.001 = 4.91e-3 (fp8); over a whole output calc_diff grows to at most
# (sqrt(1e-7) + 2**-8 / sqrt(2))**2 = 9.5e-6. DeepGEMM's own test allows calc_diff 3e-5 against its bf16 reference.
BF16_ROUNDING = 2.0 ** -8
BF16_CONTRACTS = {"exact": {"max_rel_error": 4e-3}, "fp8": {"max_rel_error": 5e-3, "calc_diff": 1e-5}}


def compare_logits(out: torch.Tensor, ref: torch.Tensor, magnitude: torch.Tensor) -> dict:
    """How far ``out`` is from ``ref``: whether the -inf patterns are identical, and the largest error of a
    finite logit relative to its magnitude (1.0 where ``out`` is NaN or the patterns differ)."""
    _check_tensors(out=out, ref=ref, magnitude=magnitude)
    # In float64 where the output lives (a GPU compares a 4096-sequence batch in milliseconds).
    out, ref, magnitude = (t.detach().to(out.device, torch.float64) for t in (out, ref, magnitude))
    for name, t in (("out", out), ("magnitude", magnitude)):
        if t.shape != ref.shape:
            raise ValueError(f"{name} has shape {list(t.shape)}, the reference {list(ref.shape)}")
    same_mask = bool(torch.equal(torch.isneginf(out), torch.isneginf(ref)))
    finite = torch.isfinite(ref)
    if not same_mask or torch.isnan(out).any() or (finite & ~torch.isfinite(out)).any():
        return {"same_inf_pattern": same_mask, "max_rel_error": 1.0, "finite": int(finite.sum())}
    err = (out[finite] - ref[finite]).abs() / magnitude[finite].clamp(min=torch.finfo(torch.float32).tiny)
    return {"same_inf_pattern": True, "max_rel_error": float(err.max()) if err.numel() else 0.0,
            "finite": int(finite.sum()), "calc_diff": calc_diff(out, ref)}


def contract(precision: str, logits_dtype: torch.dtype = torch.float32) -> dict:
    """The clauses logits of ``precision`` ("exact" or "fp8") written as ``logits_dtype`` (fp32 or bf16) hold."""
    if precision not in CONTRACTS:
        raise ValueError(f"precision must be one of {tuple(CONTRACTS)}, got {precision!r}")
    if logits_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"logits_dtype must be torch.float32 or torch.bfloat16, got {logits_dtype!r}")
    return (BF16_CONTRACTS if logits_dtype == torch.bfloat16 else CONTRACTS)[precision]


def meets_contract(verdict: dict, precision: str, logits_dtype: torch.dtype = torch.float32) -> bool:
    """Whether a :func:`compare_logits` verdict holds the contract of ``precision`` ("exact" or "fp8") for logits
    written as ``logits_dtype``."""
    clauses = {k: v for k, v in contract(precision, logits_dtype).items()
               if k != "calc_diff" or verdict.get("finite", 0) >= CALC_DIFF_MIN_LOGITS}
    return verdict["same_inf_pattern"] and all(verdict.get(k, 1.0) <= v for k, v in clauses.items())


def _check_tensors(**tensors) -> None:
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(t).__name__}")


def check_logits(out: torch.Tensor, problem: PagedMQAProblem) -> dict:
    """:func:`compare_logits` of ``out`` against the float64 reference of ``problem``, the reference and the
    magnitudes computed in one pass over the keys."""
    return compare_logits(out, *problem.call(reference_and_magnitude))


def with_valid_scales(problem: PagedMQAProblem) -> PagedMQAProblem:
    """``problem`` on a copy of its cache whose scales that are not finite and positive are 1: what the reference
    (which refuses such scales where it reads them) can compute the other logits of an unchecked call from."""
    kv_cache = problem.kv_cache.clone()
    scales = cache_scales(kv_cache)
    scales.masked_fill_(~valid_scales(scales), 1.0)
    return problem.replace(kv_cache=kv_cache)


def check_unchecked_logits(out: torch.Tensor, problem: PagedMQAProblem, context_lens: torch.Tensor,
                           block_tables: torch.Tensor) -> dict:
    """How an unchecked call (``check_values=False``) on ``problem`` with bad ``context_lens`` or
    ``block_tables`` in place of its own did (pass ``problem``'s own to judge a call on its cache's scales and its
    NaNs alone): ``nan_exact`` when ``out`` is NaN exactly where the contract puts NaN (``nan`` of them), at
    :func:`~preshuffle.contract.unreadable_positions`, at :func:`~preshuffle.contract.bad_scale_positions` and
    wherever the reference is NaN (a NaN in q, the keys or the weights), and elsewhere :func:`compare_logits`
    against the float64 reference over the keys that call can read: ``problem``'s valid tables, each row's
    length cut to what its bad table row holds."""
    nan = unreadable_positions(context_lens, block_tables, problem.num_blocks, problem.block_size, problem.next_n,
                               problem.max_model_len)
    nan |= bad_scale_positions(problem.kv_cache, context_lens, block_tables, problem.next_n, problem.max_model_len)
    readable = kv_lengths(context_lens, problem.next_n).clamp(max=block_tables.shape[1] * problem.block_size)
    ref, magnitude = with_valid_scales(problem.replace(context_lens=readable.to(torch.int32))).call(
        reference_and_magnitude)
    nan = nan.to(out.device) | torch.isnan(ref).to(out.device)
    verdict = compare_logits(*(torch.where(nan, 0.0, t.to(out.device)) for t in (out, ref, magnitude)))
    return {**verdict, "nan_exact": bool(torch.equal(torch.isnan(out), nan)), "nan": int(nan.sum())}


def calc_diff(x: torch.Tensor, y: torch.Tensor) -> float:
    """DeepGEMM's similarity metric ``1 - 2 sum(xy) / sum(x^2 + y^2)``, masked (-inf) positions zeroed; a NaN or +inf
    makes it NaN, which fails every bound (as in DeepGEMM's own)."""
    _check_tensors(x=x, y=y)
    if x.shape != y.shape:  # broadcasting would compare the wrong elements
        raise ValueError(f"x has shape {list(x.shape)} but y {list(y.shape)}")
    x, y = (t.double().masked_fill(torch.isneginf(t), 0.0) for t in (x, y))
    denominator = (x * x + y * y).sum()
    return 0.0 if denominator == 0 else float(1 - 2 * (x * y).sum() / denominator)  # both all zero: equal


def assert_bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> None:
    """Raise AssertionError unless ``a`` and ``b`` hold the same bits (NaN equals itself, -0.0 differs from 0.0),
    naming the first differing coordinate and both values."""
    if a.dtype != b.dtype or a.shape != b.shape:
        raise AssertionError(f"dtype or shape differ: {a.dtype} {list(a.shape)} against {b.dtype} {list(b.shape)}")
    b = b.to(a.device)
    # Each element's bytes along a new last dimension: compares any dtype bit for bit.
    a_bytes, b_bytes = (t.contiguous().unsqueeze(-1).view(torch.uint8) for t in (a, b))
    differ = (a_bytes != b_bytes).any(dim=-1)
    if differ.any():
        first = tuple(int(i) for i in differ.nonzero()[0])
        raise AssertionError(f"{int(differ.sum())} of {differ.numel()} elements differ; the first at {list(first)}: "
                             f"{a[first].item()!r} against {b[first].item()!r}")


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` hold the same bits (:func:`assert_bitwise_equal`'s test, as a value)."""
    try:
        assert_bitwise_equal(a, b)
    except AssertionError:
        return False
    return True


def check_repeatable(fn, runs: int | None = None) -> torch.Tensor:
    """Run ``fn`` ``runs`` times (default: 20 on a GPU, 2 under the interpreter, where a run is slow) and assert
    that every output is bitwise equal to the first; return the first."""
    runs = runs if runs is not None else (2 if device.INTERPRETED else 20)
    if runs < 2:
        raise ValueError(f"runs must be at least 2, got {runs}")
    first = fn()
    for run in range(2, runs + 1):
        try:
            assert_bitwise_equal(first, fn())
        except AssertionError as error:
            raise AssertionError(f"run {run} of {runs} differs from run 1: {error}") from None
    return first
