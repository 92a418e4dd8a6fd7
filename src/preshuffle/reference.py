"""Reference implementations of FP8 paged MQA logits: float64 reference, scalar loops, the vectorised PyTorch
baseline, and each logit's magnitude (the scale :mod:`preshuffle.testing.numeric` measures errors against).

For row ``r = b*next_n + j`` and key position ``p``::

    logits[r, p] = sum_h weights[r, h] * relu(s_p * (q[b, j, h] . k_p))   if row r may see p
                 = -inf                                                   otherwise

fp8 x fp8 products are exact in fp32 and every fp8 value is exact in float64, so a float64 reference on the
dequantised inputs is exact up to its own (negligible) rounding.

The reference and the loops are checked calls: they refuse a scale that is not finite and positive at a position a
row reads, as the kernels' checked calls do (their identity ``relu(s x) = s relu(x)`` holds for ``s > 0`` only). A
NaN in q, the keys or the weights gives NaN at every logit it enters (torch's relu and the loops' ``max`` keep it).
"""

from __future__ import annotations

import math

import torch

from .cache import gather_k_cache, read_slots, sequence_slots
from .layout import offset_map
from .contract import check_inputs, kv_lengths, unreadable_positions, valid_scales


def _reference(q, kv_cache, weight_sets, context_lens, block_tables, max_model_len, layout, dtype):
    """One pass of the reference over the keys, one output per weight tensor in ``weight_sets``."""
    p = check_inputs(q, kv_cache, weight_sets[0], context_lens, block_tables, max_model_len, layout, out_dtype=dtype,
                     outputs=len(weight_sets))
    lens = kv_lengths(context_lens, p.next_n).cpu()  # [B, next_n]
    outs = [torch.full((p.batch * p.next_n, max_model_len), -math.inf, dtype=dtype, device=q.device)
            for _ in weight_sets]
    for b in range(p.batch):
        n = int(lens[b].max())
        if n == 0:
            continue
        values, scales = gather_k_cache(kv_cache, block_tables[b], n, layout=layout, fp8_dtype=q.dtype)
        k = values.to(dtype) * scales.to(dtype).unsqueeze(1)                       # [n, D]
        scores = torch.relu(torch.einsum("jhd,pd->jhp", q[b].to(dtype), k))         # [next_n, H, n]
        visible = torch.arange(n, device=q.device) < lens[b].to(q.device).unsqueeze(1)
        rows = slice(b * p.next_n, (b + 1) * p.next_n)
        for out, weights in zip(outs, weight_sets):
            row = torch.einsum("jh,jhp->jp", weights[rows].to(dtype), scores)     # [next_n, n]
            out[rows, :n] = torch.where(visible, row, -math.inf)
    return outs


def fp8_paged_mqa_logits_ref(q, kv_cache, weights, context_lens, block_tables, max_model_len, *,
                             layout="normal", dtype=torch.float64):
    """The contract's semantics in plain PyTorch, one sequence at a time, computed in ``dtype``.

    Returns fp32 ``[B * next_n, max_model_len]`` when ``dtype`` is float32, else ``dtype``."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    return _reference(q, kv_cache, [weights], context_lens, block_tables, max_model_len, layout, dtype)[0]


def fp8_paged_mqa_logits_loops(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout="normal"):
    """The same function as scalar Python loops: one query row, one key, one head at a time. Tiny inputs only."""
    p = check_inputs(q, kv_cache, weights, context_lens, block_tables, max_model_len, layout)
    lens = kv_lengths(context_lens, p.next_n).tolist()
    qf, wf = q.double().tolist(), weights.double().tolist()
    out = [[-math.inf] * max_model_len for _ in range(p.batch * p.next_n)]
    for b in range(p.batch):
        # The sequence's keys, read once for all its query rows.
        values, scales = read_slots(kv_cache, sequence_slots(block_tables[b], max(lens[b]), p.block_size),
                                    layout=layout, fp8_dtype=q.dtype)
        keys, key_scales = values.double().tolist(), scales.double().tolist()
        for j in range(p.next_n):
            r = b * p.next_n + j
            for pos in range(lens[b][j]):
                k, s = keys[pos], key_scales[pos]
                total = 0.0
                for h in range(p.heads):
                    dot = sum(qd * kd for qd, kd in zip(qf[b][j][h], k))
                    total += wf[r][h] * max(s * dot, 0.0)  # max(nan, 0.0) is nan: a NaN stays
                out[r][pos] = total
    return torch.tensor(out, dtype=torch.float64)


def fp8_paged_mqa_logits_torch(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout="normal"):
    """The vectorised PyTorch baseline, in fp32 on the inputs' device: gather every
    sequence's whole pages, dequantise, batched matmul, relu, weighted sum. Memory grows as
    ``B * max_len * (D + H)``. Like the kernel with ``check_values=False`` it reads no lengths or block ids on the
    host, and gives NaN where a row may see a position whose key cannot be read
    (:func:`preshuffle.contract.unreadable_positions`) or whose scale is not finite and positive
    (:func:`preshuffle.contract.bad_scale_positions`)."""
    p = check_inputs(q, kv_cache, weights, context_lens, block_tables, max_model_len, layout, check_values=False)
    lens = kv_lengths(context_lens, p.next_n)                                          # [B, next_n]
    n = min(p.max_blocks * p.block_size, max_model_len)
    value_bytes = p.block_size * p.head_dim
    pages = kv_cache.view(p.num_blocks, -1)[block_tables.long().clamp(0, p.num_blocks - 1)]  # [B, blocks, bytes]
    values = pages[..., :value_bytes]
    if layout == "shuffle":  # back to natural order inside each block
        values = values[..., offset_map(p.block_size, p.head_dim, "shuffle").to(q.device).reshape(-1)]
    values = values.reshape(p.batch, -1, p.head_dim)[:, :n].view(q.dtype)
    scales = pages[..., value_bytes:].contiguous().view(torch.float32).reshape(p.batch, -1)[:, :n]
    scales = torch.where(valid_scales(scales), scales, math.nan)
    k = values.float() * scales.unsqueeze(-1)                                           # [B, n, D]
    scores = torch.relu(torch.bmm(q.float().reshape(p.batch, -1, p.head_dim), k.transpose(1, 2)))  # [B, j*H, n]
    scores = scores.view(p.batch, p.next_n, p.heads, n)
    row = (scores * weights.view(p.batch, p.next_n, p.heads, 1)).sum(dim=2)             # [B, next_n, n]
    positions = torch.arange(n, device=q.device)
    row = torch.where(positions < lens.unsqueeze(-1), row, -math.inf)
    out = torch.full((p.batch * p.next_n, max_model_len), -math.inf, dtype=torch.float32, device=q.device)
    out[:, :n] = row.reshape(p.batch * p.next_n, n)
    return out.masked_fill_(unreadable_positions(context_lens, block_tables, p.num_blocks, p.block_size, p.next_n,
                                                 max_model_len), math.nan)


def logits_magnitude(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout="normal"):
    """Each logit's sum of absolute terms, ``sum_h |w| relu(...)``: the natural scale of its rounding error."""
    return fp8_paged_mqa_logits_ref(q, kv_cache, weights.abs(), context_lens, block_tables, max_model_len,
                                    layout=layout)


def reference_and_magnitude(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout="normal"):
    """The float64 reference and :func:`logits_magnitude`, computed in one pass over the keys."""
    ref, magnitude = _reference(q, kv_cache, [weights, weights.abs()], context_lens, block_tables, max_model_len,
                                layout, torch.float64)
    return ref, magnitude
