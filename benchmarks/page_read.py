"""What the memory system charges for each cache layout, beside what the kernel pays: on each shape and cache, the
page-read floor (``preshuffle.measure.page_read``: every value and scale word a call reads, through its block
table, and nothing else; the fastest of four launches) and the Hopper kernel's fp8 call (launch rule, checked
against the float64 reference first), timed the same way in one process. ``block1-contiguous`` is block 1 with
each sequence's one-token pages consecutive in the cache (the same bytes, laid out by a writer that keeps a
sequence together) instead of the spec's random permutation.

    python3 benchmarks/page_read.py OUT.json
"""

import json
import sys

import torch

from preshuffle import provenance as run_provenance
from preshuffle.benchmark import kernel_fn, measure, provenance
from preshuffle.measure.page_read import page_read, xor_groups
from preshuffle.reference import reference_and_magnitude
from preshuffle.shapes import Shape
from preshuffle.testing import timing
from preshuffle.testing.inputs import benchmark_problem, contiguous_block_tables

SHAPES = (Shape(64, 1, 8192), Shape(256, 1, 8192), Shape(4096, 1, 8192), Shape(128, 1, 32768),
          Shape(8, 1, 65536), Shape(1, 1, 131072))
CACHES = {"block64-normal": 64, "block16-normal": 16, "block1": 1, "block1-contiguous": 1}
LAUNCHES = ((64, 4), (256, 4), (256, 8), (1024, 8))  # (tokens a program, warps)


def floor(problem) -> dict:
    """The fastest launch of the page-read kernel on ``problem``. Every launch's words must agree: XOR is
    associative, so a program of 1024 positions folds what 16 programs of 64 fold."""
    _, kv_cache, _, context_lens, block_tables, max_model_len = problem.args
    times, words = {}, {}
    for tokens, warps in LAUNCHES:
        fn = lambda: page_read(kv_cache, context_lens, block_tables, max_model_len,  # noqa: E731
                               tokens=tokens, num_warps=warps)
        words[tokens] = fn()
        times[(tokens, warps)] = 1e3 * timing.time_ms(fn)
    for tokens, w in words.items():
        assert torch.equal(xor_groups(w, 1024 // tokens), words[1024]), f"{tokens} positions a program disagree"
    (tokens, warps), us = min(times.items(), key=lambda kv: kv[1])
    return {"floor_us": us, "floor_tokens": tokens, "floor_warps": warps,
            "floor_all_us": {f"{t}x{w}": v for (t, w), v in times.items()}}


def main(path: str) -> dict:
    ceiling = timing.copy_bandwidth()
    record = {"provenance": provenance("page_read", "logits"), "copy_bytes_per_s": ceiling, "rows": []}
    for shape in SHAPES:
        for cache, block_size in CACHES.items():
            problem = benchmark_problem(shape, block_size, "normal")
            if cache == "block1-contiguous":
                lens = problem.context_lens.cpu().tolist()
                problem = problem.replace(block_tables=contiguous_block_tables(
                    lens, problem.block_tables.shape[1]).to(problem.kv_cache.device))
            page_bytes = problem.sum_ctx * 132
            row = {"shape": shape.label, "cache": cache, "page_bytes": page_bytes, **floor(problem)}
            row["floor_pct_copy"] = 100 * page_bytes / (row["floor_us"] * 1e-6) / ceiling
            kernel = measure(kernel_fn(problem, "fp8"), problem, problem.call(reference_and_magnitude),
                             precision="fp8", copy_bytes_per_s=ceiling)
            row.update(kernel_meets_contract=kernel["meets_contract"], kernel_us=kernel.get("us"))
            record["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "floor_all_us"}), flush=True)
            del problem
            torch.cuda.empty_cache()
            with open(path, "w") as f:
                json.dump(run_provenance.seal_record(record), f, indent=1)
    return record


if __name__ == "__main__":
    main(sys.argv[1])
