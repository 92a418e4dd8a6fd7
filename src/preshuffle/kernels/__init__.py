"""The FP8 paged-MQA-logits kernels: :func:`fp8_paged_mqa_logits` (the portable Triton kernel, :mod:`.portable`),
its launch configuration (:mod:`.launch`), and chapter 3's teaching steps (:mod:`.steps`)."""

from .launch import LaunchConfig
from .portable import fp8_paged_mqa_logits

__all__ = ["LaunchConfig", "fp8_paged_mqa_logits"]
