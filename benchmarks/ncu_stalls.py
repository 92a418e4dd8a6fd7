"""Where the warps of one profiled kernel wait: the stall reasons of `ncu`'s source page (SASS, CSV), summed over
the kernel, and the instructions with the most samples. Which warps run an instruction shows in how often it ran:
in the Hopper kernel each math instruction runs on 4 warps a chunk, each loader instruction on one.

    ncu --set full -o prof python benchmarks/ncu_hopper.py 256 2 65536
    ncu --import prof.ncu-rep --page source --print-source sass --csv > prof.csv
    python benchmarks/ncu_stalls.py prof.csv

The share of a stall reason is of all samples, the idle warps included: Triton pads the one-warp TMA loader to a
warpgroup, and its three idle warps sample as "barrier" at their register release for the whole kernel.
"""

import argparse
import collections
import csv

SAMPLES = "Warp Stall Sampling (All Samples)"


def read(path: str) -> list[dict]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    header = next((i for i, r in enumerate(rows) if r[:2] == ["Address", "Source"]), None)
    if header is None:
        raise ValueError(f"{path} has no Address,Source header: expected the output of "
                         "ncu --page source --print-source sass --csv")
    keys = rows[header]
    return [dict(zip(keys, r)) for r in rows[header + 1:] if len(r) == len(keys)]


def count(value: str) -> int:
    return int(value) if value not in ("", "-") else 0


def summary(rows: list[dict], top: int = 12) -> str:
    reasons = [k for k in rows[0] if k.startswith("stall_") and "Not Issued" not in k]
    total = sum(count(r[SAMPLES]) for r in rows)
    if not total:
        raise ValueError("the profile has no warp stall samples: take it with --set full")
    by_reason = collections.Counter({k: sum(count(r[k]) for r in rows) for k in reasons})
    lines = [f"{total} samples"]
    lines += [f"  {k[6:]:20s} {v:7d} {100 * v / total:5.1f}%" for k, v in by_reason.most_common(8)]
    lines.append("instructions with the most samples (address's last 4 hex digits, samples, times executed, "
                 "main reason, SASS):")
    for r in sorted(rows, key=lambda r: -count(r[SAMPLES]))[:top]:
        main = max(reasons, key=lambda k: count(r[k]))
        lines.append(f"  {r['Address'][-4:]} {count(r[SAMPLES]):7d} {100 * count(r[SAMPLES]) / total:5.1f}% "
                     f"{r['Instructions Executed']:>9s} {main[6:]:18s} {r['Source'].strip()[:64]}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv", nargs="+", help="ncu --page source --print-source sass --csv output")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args(argv)
    for path in args.csv:
        print(f"== {path}\n{summary(read(path), args.top)}")


if __name__ == "__main__":
    main()
