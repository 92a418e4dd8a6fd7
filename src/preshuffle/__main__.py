"""Command line: ``python -m preshuffle negotiate ...``, ``python -m preshuffle bench ...``,
``python -m preshuffle results`` (the README's table: the runs at vLLM's call) and
``python -m preshuffle --version`` (versions, device, and the kernel paths it runs)."""

from __future__ import annotations

import argparse
import sys


def _negotiate(args) -> int:
    from . import negotiation

    if args.sweep:
        sizes = args.block_size or list(negotiation.DEFAULT_SWEEP)
        rows = negotiation.sweep(sizes, args.platform)
        print(negotiation.format_sweep(rows))
        rejected = negotiation.rejected_rows(rows)
        if rejected:
            print(f"\nNegotiate after PR #51216 but AITER would reject: {rejected}")
        failed = [r for r in rows if r["after_kernel_block_size"] is None]
        return 1 if rejected or failed else 0
    results = [negotiation.negotiate(size, args.platform, before_pr=args.before_pr) for size in args.block_size or [16]]
    for result in results:
        print(negotiation.format_negotiation(result))
    return 1 if any(r.error or not r.kernel.accepted for r in results) else 0


def _positive_int(text: str) -> int:
    """argparse ``type=`` for sizes: argparse names the flag in front of this message."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}")
    return value


def _bench(args) -> int:
    import json

    from . import benchmark

    shapes = [benchmark.SHAPES[i] for i in args.shapes] if args.shapes else list(benchmark.SHAPES)

    def save(record, _row):
        if args.out:
            with open(args.out, "w") as f:
                json.dump(record, f, indent=1)

    try:
        record = benchmark.run(shapes, args.variants, against_deepgemm="deepgemm" in (args.against or []),
                               steps=not args.no_steps, torch_baseline=not args.no_torch, on_row=save)
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    save(record, None)  # sealed whole, now that every row is in
    from . import report

    print(report.provenance_line(record))
    print(report.format_summary(report.summary(record)))
    return 0


def _results(args) -> int:
    from . import report

    records = {path: report.load(path) for path in args.file or []}
    if len(records) > 1:
        print(report.builds_table(list(records.values())))
    elif records:
        print(report.results_table(*records.values()))
    else:
        from . import vllm_call_report

        print(vllm_call_report.results_table(*committed_results()))
    for note in filter(None, (report.stale_note(record, path) for path, record in records.items())):
        print(note, file=sys.stderr)
    return 0


def committed_results() -> tuple:
    """The README's table's inputs: the runs at vLLM's call beside DeepGEMM nv_dev and main, and the top-k run
    (``results/``), its top-k figures (the default launch, on the H200 the sm90 kernel) only while that kernel is
    the package's."""
    from . import provenance, vllm_call_report
    from .topk import report as topk_report

    run = topk_report.load()
    fresh = run is not None and provenance.staleness(run, "topk_sm90") is None
    topk = {r["shape"]: (r["ours_default_us"], r["vllm_best_us"])
            for r in (topk_report.summary(run) if fresh else []) if r["ours_default_us"] and r["vllm_best_us"]}
    return (vllm_call_report.load(vllm_call_report.RUNS["nv_dev"]), vllm_call_report.load(vllm_call_report.RUNS["main"]),
            topk)


class _VersionAction(argparse.Action):
    """``--version``: print :func:`preshuffle.device.version_report` and exit, before any subcommand is needed."""

    def __init__(self, option_strings, dest, help=None):
        super().__init__(option_strings, dest, nargs=0, help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        from . import __version__
        from .device import version_report

        print(version_report(__version__))
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m preshuffle", description=__doc__)
    parser.add_argument("--version", action=_VersionAction,
                        help="print the versions, the device, and which kernel paths run on it")
    commands = parser.add_subparsers(dest="command", required=True)

    neg = commands.add_parser(
        "negotiate",
        help="kernel block size, kernel and acceptance for a --block-size (exits 1 when it fails or is rejected)",
        epilog="Exit status 0 when every size negotiates and the indexer kernel accepts it; exit status 1 when a "
               "negotiation fails or the indexer kernel would reject the negotiated size (with --sweep: after the "
               "PR, for any size swept); 2 for bad arguments.")
    neg.add_argument("--block-size", type=_positive_int, nargs="+", help="manager block size(s) (default 16)")
    neg.add_argument("--platform", choices=["rocm", "cuda"], default="rocm")
    neg.add_argument("--before-pr", action="store_true", help="the declarations before vLLM PR #51216")
    neg.add_argument("--sweep", action="store_true",
                     help="before and after, for every size given (default: 1, 8 and multiples of 16 to 1024)")
    neg.set_defaults(run=_negotiate)

    from .benchmark import SHAPES
    from .shapes import VARIANTS

    ben = commands.add_parser("bench", help="check and time every kernel variant on a GPU (refuses the interpreter)")
    ben.add_argument("--shapes", type=int, nargs="+", choices=range(len(SHAPES)),
                     help="indices of the shapes (the anchor shapes, then next_n = 3): " + "; ".join(
                         f"{i}: {s.label}" for i, s in enumerate(SHAPES)))
    ben.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    ben.add_argument("--against", nargs="+", choices=["deepgemm"],
                     help="also time DeepGEMM on the same inputs in the same run (when deep_gemm imports)")
    ben.add_argument("--no-steps", action="store_true", help="skip the ladder of kernel steps to the Hopper kernel")
    ben.add_argument("--no-torch", action="store_true", help="skip the vectorised PyTorch baseline")
    ben.add_argument("--out", help="write the results (with provenance) to this JSON file as they come")
    ben.set_defaults(run=_bench)

    res = commands.add_parser("results", help="the committed H200 runs at vLLM's call as the README's Markdown table")
    res.add_argument("--file", nargs="+",
                     help="instead, a results file of `bench`; several (one a DeepGEMM build, each timed in its own "
                          "process): ours beside each build, each ratio from its own run")
    res.set_defaults(run=_results)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
