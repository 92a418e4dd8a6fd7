"""How a compiled launch is cut into programs on a GPU."""

from __future__ import annotations

import torch
import triton

from .kernels import LaunchConfig

# Programs per SM to aim for: enough to hide the tail of uneven context lengths.
PROGRAMS_PER_SM = 4


def choose_config(batch: int, max_model_len: int) -> LaunchConfig:
    chunk = 64
    sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    chunks = triton.cdiv(max_model_len, chunk)
    splits = max(1, min(chunks, triton.cdiv(PROGRAMS_PER_SM * sms, batch)))
    return LaunchConfig(chunk, triton.cdiv(chunks, splits) * chunk)
