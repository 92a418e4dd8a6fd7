"""How a compiled launch is cut into programs on a GPU.

Measured on the H200 (benchmarks/tune.py, results/): chunks of 64 positions, 4 warps and 5 pipeline stages
were the fastest compiled configuration for every variant on the large anchor shapes; the split of each
sequence's row into programs is what changes with the shape: aim for PROGRAMS_PER_SM programs per SM.
"""

from __future__ import annotations

import torch
import triton

from .kernels import LaunchConfig

PROGRAMS_PER_SM = 8
CHUNK, NUM_WARPS, NUM_STAGES = 64, 4, 5


def config_for(batch: int, max_model_len: int, *, programs_per_sm: int = PROGRAMS_PER_SM, chunk: int = CHUNK,
               num_warps: int = NUM_WARPS, num_stages: int = NUM_STAGES, **fields) -> LaunchConfig:
    """Split each row so that ``batch * splits`` is about ``programs_per_sm`` programs per SM, never cutting
    below one chunk per program: small batches with long contexts get split along the context."""
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    chunks = triton.cdiv(max_model_len, chunk)
    splits = max(1, min(chunks, triton.cdiv(programs_per_sm * sms, batch)))
    return LaunchConfig(chunk, triton.cdiv(chunks, splits) * chunk, num_warps, num_stages, **fields)
