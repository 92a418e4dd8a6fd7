"""preshuffle: the FP8 paged-MQA-logits kernel of the DeepSeek-V3.2 lightning indexer, its preshuffled
K-cache layout, and the kernel block-size negotiation that decides which variant runs."""

from . import device  # first: decides TRITON_INTERPRET before Triton sees a kernel

__version__ = "0.1.0"
__all__ = ["device", "__version__"]
