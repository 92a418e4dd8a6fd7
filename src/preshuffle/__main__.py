"""Command line: ``python -m preshuffle negotiate ...`` and ``python -m preshuffle bench ...``."""

from __future__ import annotations

import argparse
import sys


def _negotiate(args) -> int:
    from . import negotiation

    if args.sweep:
        sizes = args.block_size or list(negotiation.DEFAULT_SWEEP)
        print(negotiation.format_sweep(negotiation.sweep(sizes, args.platform)))
        rejected = negotiation.rejected_after_pr(sizes, args.platform)
        if rejected:
            print(f"\nNegotiate after PR #51216 but AITER would reject: {rejected}")
        return 0
    for size in args.block_size or [16]:
        print(negotiation.format_negotiation(negotiation.negotiate(size, args.platform, before_pr=args.before_pr)))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m preshuffle", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    neg = commands.add_parser("negotiate", help="kernel block size, kernel and acceptance for a --block-size")
    neg.add_argument("--block-size", type=int, nargs="+", help="manager block size(s) (default 16)")
    neg.add_argument("--platform", choices=["rocm", "cuda"], default="rocm")
    neg.add_argument("--before-pr", action="store_true", help="the declarations before vLLM PR #51216")
    neg.add_argument("--sweep", action="store_true",
                     help="before and after, for every size given (default: 1, 8 and multiples of 16 to 1024)")
    neg.set_defaults(run=_negotiate)
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
