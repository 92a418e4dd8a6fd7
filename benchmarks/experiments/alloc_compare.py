"""Host time of three ways to allocate the kernel's output (notes, part 9): torch.empty with the sizes as separate
ints, with the sizes as a tuple, and torch.empty_like of one fp32 zero broadcast to the output's shape.

    python3 benchmarks/experiments/alloc_compare.py OUT.json"""

import json
import sys

import torch

from preshuffle.testing.timing import host_us

dev = torch.device("cuda")
res = {}
for rows, cols in ((64, 10650), (1, 170394)):
    like = torch.zeros((), device=dev).expand(rows, cols)
    for rep in range(2):
        res[f"{rows}x{cols}/{rep}"] = {
            "empty_sizes": host_us(lambda: torch.empty(rows, cols, dtype=torch.float32, device=dev)),
            "empty_tuple": host_us(lambda: torch.empty((rows, cols), dtype=torch.float32, device=dev)),
            "empty_like_broadcast": host_us(lambda: torch.empty_like(like))}
print(json.dumps(res, indent=0))
json.dump(res, open(sys.argv[1], "w"), indent=1)
