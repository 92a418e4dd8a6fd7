"""Compare compiled launch configurations of either kernel on chosen shapes (H200), to set the rules in
preshuffle/kernels/launch.py. Every configuration is checked against the float64 reference (by the contract of its
precision) before it is timed.

    python benchmarks/tune.py --out tune.json --shapes 0 2 4 --variants block64-normal \\
        --configs '{"chunk": 64, "num_warps": 4, "num_stages": 5}' '{"chunk": 128, "num_warps": 8, "num_stages": 4}'

``--configs`` takes the fields of the kernel's configuration as JSON, except ``tokens_per_program``: each
configuration is timed at every ``--programs-per-sm`` split (:func:`preshuffle.kernels.launch.splits_for`). For
``--kernel portable`` they are :class:`preshuffle.kernels.LaunchConfig` fields (``dot`` fp16 is the exact path);
for ``--kernel hopper``, :class:`preshuffle.kernels.HopperConfig` fields and ``precision`` (fp8, the default, or
exact), e.g. ``'{"precision": "exact", "row_warpgroups": true, "stages": 6}'``.
"""

import argparse
import dataclasses
import json

import torch
from tqdm import tqdm

from preshuffle import benchmark, deepgemm, report
from preshuffle import provenance as run_provenance
from preshuffle.kernels import HopperConfig, LaunchConfig
from preshuffle.kernels.launch import config_for, dot_precision, hopper_maxnreg, splits_for
from preshuffle.precision import PRECISIONS
from preshuffle.reference import reference_and_magnitude
from preshuffle.shapes import ANCHOR_SHAPES, VARIANTS, Shape
from preshuffle.testing import timing
from preshuffle.testing.inputs import benchmark_problem

SPLIT_FIELDS = ("tokens_per_program", "splits")  # set by each --programs-per-sm, not by --configs
CONFIG_FIELDS = {"portable": [f.name for f in dataclasses.fields(LaunchConfig) if f.name not in SPLIT_FIELDS],
                 "hopper": ["precision"] + [f.name for f in dataclasses.fields(HopperConfig)
                                            if f.name not in SPLIT_FIELDS]}


def parse_config(text: str, kernel: str = "portable") -> dict:
    """The configuration fields of one --configs value, checked before any GPU time is spent."""
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--configs {text!r} is not JSON: {exc}") from None
    if not isinstance(fields, dict) or set(fields) - set(CONFIG_FIELDS[kernel]):
        raise ValueError(f"--configs {text!r}: expected a JSON object with keys among {CONFIG_FIELDS[kernel]}")
    if kernel == "portable":  # raises ValueError on a bad value
        LaunchConfig(**fields)
    else:
        _hopper_fields(fields, 1)
    return fields


def _hopper_fields(fields: dict, next_n: int) -> tuple[str, dict]:
    fields = dict(fields)
    precision = fields.pop("precision", "fp8")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be fp8 or exact, got {precision!r}")
    fields.setdefault("maxnreg", hopper_maxnreg(next_n, precision == "exact", fields.get("row_warpgroups", False)))
    HopperConfig(1, **fields)
    return precision, fields


def make_config(kernel: str, fields: dict, batch: int, programs_per_sm: int, next_n: int = 1):
    """(precision, configuration) of one --configs value at a split."""
    if kernel == "portable":
        precision = dot_precision(fields.get("dot", LaunchConfig.dot))
        return precision, config_for(batch, programs_per_sm=programs_per_sm, **fields)
    precision, fields = _hopper_fields(fields, next_n)
    return precision, HopperConfig(splits_for(batch, programs_per_sm), **fields)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file the results are written to after every shape")
    ap.add_argument("--shapes", type=int, nargs="+", default=[], choices=range(len(ANCHOR_SHAPES)),
                    help="indices of the spec's anchor shapes: " + "; ".join(
                        f"{i}: {s.label}" for i, s in enumerate(ANCHOR_SHAPES)))
    ap.add_argument("--shape", type=int, nargs=3, action="append", default=[], metavar=("BATCH", "NEXT_N", "AVG_CTX"),
                    help="a shape of your own (repeatable)")
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=["block64-normal"])
    ap.add_argument("--kernel", choices=list(CONFIG_FIELDS), default="portable")
    ap.add_argument("--configs", nargs="+", required=True,
                    help="configuration fields as JSON, one object each (see above)")
    ap.add_argument("--programs-per-sm", type=int, nargs="+", default=[1, 4, 8, 16])
    ap.add_argument("--against", choices=["deepgemm"],
                    help="also time DeepGEMM on each shape it takes, in the same process on the same inputs")
    return ap


def main(argv: list[str] | None = None) -> dict:
    ap = build_parser()
    args = ap.parse_args(argv)
    shapes = [ANCHOR_SHAPES[i] for i in args.shapes] + [Shape(*s) for s in args.shape]
    if not shapes:
        ap.error("give --shapes or --shape")
    try:
        configs = [parse_config(text, args.kernel) for text in args.configs]
    except (ValueError, TypeError) as exc:
        ap.error(str(exc))
    dg = deepgemm.load() if args.against else None
    if args.against and dg is None:
        ap.error("--against deepgemm: deep_gemm does not import here")
    record = {"provenance": benchmark.provenance("logits"), "copy_bytes_per_s": timing.copy_bandwidth(), "rows": []}
    for shape, variant in tqdm([(shape, v) for shape in shapes for v in args.variants]):
        problem = benchmark_problem(shape, *VARIANTS[variant])
        reference = problem.call(reference_and_magnitude)
        if dg is not None and deepgemm.refusal(problem) is None:
            row = benchmark.measure(deepgemm.logits_fn(dg, problem), problem, reference, precision="fp8",
                                    copy_bytes_per_s=record["copy_bytes_per_s"], masked=True)
            record["rows"].append({"shape": shape.label, "variant": variant, "pps": 0, "config": {"kernel": "deepgemm"},
                                   **row})
            print(f"{shape.label:28s} {variant:15s} {'deepgemm':70s}        {row.get('us', float('nan')):9.1f} us",
                  flush=True)
        for fields in configs:
            checked = None  # the first split is compared with the reference, the others with it, bit for bit
            for pps in args.programs_per_sm:
                precision, config = make_config(args.kernel, fields, shape.batch, pps, shape.next_n)
                fn = benchmark.kernel_fn(problem, precision, config)
                row = benchmark.measure(fn, problem, reference, precision=precision,
                                        copy_bytes_per_s=record["copy_bytes_per_s"], checked=checked)
                checked = fn() if checked is None else checked
                record["rows"].append({"shape": shape.label, "variant": variant, "pps": pps, "config": fields, **row})
                print(f"{shape.label:28s} {variant:15s} {json.dumps(fields):70s} pps {pps:2d} "
                      f"{row.get('us', float('nan')):9.1f} us {row.get('pct_copy', 0):5.1f}%", flush=True)
        del problem
        torch.cuda.empty_cache()
        with open(args.out, "w") as f:
            json.dump(run_provenance.seal_record(record), f, indent=1)
    print(summary(record["rows"]))
    return record


def summary(rows: list[dict]) -> str:
    """The best split of every configuration on every shape and cache, one line each."""
    return "\n".join(f"{s:28s} {v:15s} {c:60s} pps {r['pps']:2d} {r['us']:9.1f} us {r['pct_copy']:5.1f}%"
                     for (s, v, c), r in report.best_splits(rows).items())


if __name__ == "__main__":
    main()
