"""The two precisions the kernels offer, named by what their MMAs multiply: "exact" widens the fp8 values to fp16
(exact) and adds exact products in fp32; "fp8" feeds the fp8 values to fp8 MMAs, whose narrow accumulator rounds.
Each is held to its own contract (:data:`preshuffle.testing.numeric.CONTRACTS`). Torch-free, so that the report and
the widgets, which read committed results, share the names with the kernels."""

PRECISIONS = ("exact", "fp8")
