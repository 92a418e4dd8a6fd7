"""How a compiled launch is cut into programs on a GPU: a table measured on the H200.

benchmarks/tune.py compared chunks of 64/128 positions, 4/8 warps and 1-6 pipeline stages on the anchor shapes
(benchmarks/NOTES.md has the numbers): 64 positions, 4 warps, 5 stages was fastest on every shape (4 stages
lose 7-20%, chunks of 128 lose 15-45%). What depends on the shape is how finely each sequence's row is split
into programs: batches of 64 or fewer were fastest near 4 programs per SM, batches of 128-256 at 16, and 4096
is flat (one program per sequence is already 31 per SM).
"""

from __future__ import annotations

import torch
import triton

from .kernels import LaunchConfig

CHUNK, NUM_WARPS, NUM_STAGES = 64, 4, 5


def default_programs_per_sm(batch: int) -> int:
    return 4 if batch < 128 else 16


def config_for(batch: int, max_model_len: int, *, programs_per_sm: int | None = None, chunk: int = CHUNK,
               num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES, **fields) -> LaunchConfig:
    """Split each row so that ``batch * splits`` is about ``programs_per_sm`` programs per SM, never cutting
    below one chunk per program: small batches with long contexts get split along the context."""
    programs_per_sm = programs_per_sm or default_programs_per_sm(batch)
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    chunks = triton.cdiv(max_model_len, chunk)
    splits = max(1, min(chunks, triton.cdiv(programs_per_sm * sms, batch)))
    return LaunchConfig(chunk, triton.cdiv(chunks, splits) * chunk, num_warps, num_stages, **fields)
