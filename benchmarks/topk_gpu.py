"""The indexer's whole decode step on a GPU: top-2048 selection beside vLLM's kernels, on the same logits, in one run.

For each shape of the top-k table (``SHAPES``), on DeepGEMM's cache (64-token natural pages, inputs built like the
performance spec's, ``preshuffle.testing.inputs.benchmark_problem``):

1. our fp8 logits kernel writes the logits (``fp8_paged_mqa_logits``, unchecked, as a server calls it);
2. every top-k is run on those logits and its selection checked against the float64 reference selection
   (``preshuffle.topk.is_top_k``: set equal up to ties, every row): ours in every launch of ``CONFIGS`` (its set
   must also equal the reference's exactly, ties going to the lowest position), vLLM's ``decode_topk`` (its own
   dispatch), ``persistent_topk``, ``cooperative_topk`` (32 rows or fewer), ``top_k_per_row_decode``, and
   ``torch.topk(sorted=False)``;
3. each is timed as CUDA-graph replays by ``triton.testing.do_bench`` with L2 flushed
   (``preshuffle.testing.timing.time_ms``), as are the logits kernel and the whole step (logits + top-k in one
   graph: ours with its default launch and with the run's fastest; DeepGEMM + ``decode_topk`` where ``deep_gemm``
   imports);
4. top-2048 agreement with the float64 reference's top-2048 (rows seeing more than 4096 positions, up to
   ``AGREEMENT_SEQUENCES`` sequences a shape): our fp8 and exact logits and DeepGEMM's, each through our top-k, and
   how far from the 2048th value (in float64, relative to each logit's sum of |terms|) the positions that change
   lie.

A variant that fails is recorded with its error and the run goes on. vLLM's kernels come from
``.anchor/vllm_topk`` (``build.load()`` compiles them on first use, about 80 s); the JSON names what was missing.

    python3 benchmarks/topk_gpu.py OUT.json               # every shape, about 4 minutes on an H200
    python3 benchmarks/topk_gpu.py OUT.json --shapes 0 7  # some of them
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
import traceback

import torch

from preshuffle import deepgemm
from preshuffle.benchmark import provenance
from preshuffle.contract import kv_lengths
from preshuffle.kernels import fp8_paged_mqa_logits
from preshuffle.kernels.topk import TopKConfig, default_config, path_for
from preshuffle.problem import PagedMQAProblem
from preshuffle.reference import reference_and_magnitude
from preshuffle.shapes import Shape
from preshuffle.testing import timing
from preshuffle.testing.inputs import benchmark_problem
from preshuffle.topk import TOPK, agreement, indexer_topk, is_top_k, topk_reference

SHAPES = (Shape(1, 1, 131072), Shape(8, 1, 65536), Shape(64, 1, 8192), Shape(64, 2, 8192), Shape(128, 1, 32768),
          Shape(256, 1, 8192), Shape(256, 2, 65536), Shape(4096, 1, 8192))
# Our launches, by name. "row-*" take the row path (logits up to 16K wide), "split-*" the split path (any width).
CONFIGS = {
    "row-16w": TopKConfig(),
    "row-32w": TopKConfig(row_warps=32),
    "row-8w": TopKConfig(row_warps=8),
    "row-bits10": TopKConfig(search_bits=10),
    "row-bits16": TopKConfig(search_bits=16),
    "split-4k": TopKConfig(row_tile=16),
    "split-2k": TopKConfig(row_tile=16, segment=2048, split_warps=4),
    "split-8k": TopKConfig(row_tile=16, segment=8192, split_warps=16),
    "split-16k": TopKConfig(row_tile=16, segment=16384, split_warps=16),
    "split-4k-bins11": TopKConfig(row_tile=16, hist_bits=11, split_candidates=1024),
}
AGREEMENT_SEQUENCES = 16
AGREEMENT_MIN_VISIBLE = 4096
GAPS_KEPT = 256  # changed positions a shape keeps for the chapter's picture
ANCHOR = ".anchor/vllm_topk"


def load_vllm():
    """vLLM's top-k module (``build``) and None, or None and why it is missing."""
    try:
        sys.path.insert(0, ANCHOR)
        import build

        build.load()
        return build, None
    except Exception as error:  # noqa: BLE001 (a failed build raises more than ImportError)
        return None, f"{type(error).__name__}: {error}"


def vllm_commit() -> str | None:
    try:
        with open(os.path.join(ANCHOR, "PROVENANCE.txt")) as f:
            return f.readline().split()[0]
    except (OSError, IndexError):
        return None


def attempt(fn):
    """``(fn(), None)``, or ``(None, the error)``: one failing variant must not end the run."""
    try:
        return fn(), None
    except Exception as error:  # noqa: BLE001
        traceback.print_exc()
        return None, f"{type(error).__name__}: {error}"


def sub_problem(problem: PagedMQAProblem, sequences: list[int]) -> PagedMQAProblem:
    """The same cache with only ``sequences``' queries, lengths and block-table rows."""
    index = torch.tensor(sequences, device=problem.q.device)
    rows = (index.unsqueeze(1) * problem.next_n + torch.arange(problem.next_n, device=index.device)).reshape(-1)
    return PagedMQAProblem(problem.q[index].contiguous(), problem.kv_cache, problem.weights[rows].contiguous(),
                           problem.context_lens[index].contiguous(), problem.block_tables[index].contiguous(),
                           problem.max_model_len, problem.layout)


def topk_impls(vllm, logits, problem: PagedMQAProblem, visible: torch.Tensor, workspace) -> dict:
    """name -> call writing the top-2048 of ``logits`` into a new or kept output."""
    ctx = problem.context_lens
    rows, width = logits.shape
    impls = {name: (lambda config=config: indexer_topk(logits, ctx, TOPK, check_values=False, config=config))
             for name, config in CONFIGS.items() if name.startswith("split") or path_for(width, config) == "row"}
    impls["torch.topk"] = lambda: torch.topk(logits, TOPK, dim=-1, sorted=False).indices
    if vllm is not None:
        out = torch.empty(rows, TOPK, dtype=torch.int32, device=logits.device)

        def into(fn):
            def call():
                fn()
                return out
            return call

        impls["vllm decode_topk"] = into(lambda: vllm.decode_topk(logits, visible, out, workspace))
        impls["vllm persistent_topk"] = into(lambda: vllm.persistent_topk(logits, visible, out, workspace, TOPK,
                                                                          width))
        if rows <= 32:
            impls["vllm cooperative_topk"] = into(lambda: vllm.cooperative_topk(logits, visible, out, workspace,
                                                                                TOPK, width))
        impls["vllm top_k_per_row_decode"] = into(lambda: vllm.top_k_per_row_decode(
            logits, problem.next_n, ctx, out, rows, logits.stride(0), logits.stride(1), TOPK))
    return impls


def same_launch(a: TopKConfig, b: TopKConfig, width: int) -> bool:
    """Whether two configurations launch the same kernels on logits ``width`` wide (the other path's fields aside)."""
    if path_for(width, a) != path_for(width, b):
        return False
    row = ("row_tile", "row_warps", "search_bits", "candidates")
    fields = row if path_for(width, a) == "row" else tuple(f.name for f in dataclasses.fields(a) if f.name not in row)
    return all(getattr(a, f) == getattr(b, f) for f in fields)


def check_and_time(name, fn, logits, ctx, reference) -> dict:
    row = {"impl": name}
    out, error = attempt(lambda: fn().to(torch.int32, copy=True))  # vLLM's calls return the buffer they keep
    if error:
        return {**row, "error": error}
    row["valid_rows"] = float(is_top_k(out, logits, ctx, TOPK, reference=reference).double().mean())
    if name in CONFIGS:
        row["config"] = dataclasses.asdict(CONFIGS[name])
        row["path"] = path_for(logits.shape[1], CONFIGS[name])
        row["same_set_as_reference"] = bool(torch.equal(out.sort(1).values, reference.sort(1).values))
    if row["valid_rows"] < 1.0:
        return {**row, "error": "selection is not a top-2048 on every row"}
    ms, error = attempt(lambda: timing.time_ms(fn))
    return {**row, "us": ms * 1e3} if error is None else {**row, "error": error}


def agreement_rows(problem, logits_by_precision: dict, vis_rows: torch.Tensor) -> list[dict]:
    """Top-2048 agreement of each precision's logits (through our top-k) with the float64 reference's, on up to
    AGREEMENT_SEQUENCES sequences, rows seeing more than AGREEMENT_MIN_VISIBLE positions."""
    batch = problem.batch
    sequences = sorted({round(i * (batch - 1) / max(AGREEMENT_SEQUENCES - 1, 1)) for i in range(AGREEMENT_SEQUENCES)})
    sequences = [b for b in sequences if b < batch]
    sub = sub_problem(problem, sequences)
    ref64, magnitude = sub.call(reference_and_magnitude)
    rows = (torch.tensor(sequences, device=ref64.device).unsqueeze(1) * problem.next_n
            + torch.arange(problem.next_n, device=ref64.device)).reshape(-1)
    keep = vis_rows[rows] > AGREEMENT_MIN_VISIBLE
    ctx = sub.context_lens
    reference = topk_reference(ref64, ctx, TOPK)
    out = []
    for precision, logits in logits_by_precision.items():
        if logits is None:
            continue
        mine = indexer_topk(logits[rows].contiguous(), ctx, TOPK, check_values=False)
        share = agreement(mine, reference, ref64.shape[1])[keep]
        gaps = {"dropped": [], "added": []}
        for r in torch.nonzero(keep).flatten().tolist():
            n = min(TOPK, int(vis_rows[rows[r]]))
            kth = ref64[r, reference[r, n - 1].long()]
            ref_set, mine_set = set(reference[r].tolist()) - {-1}, set(mine[r].tolist()) - {-1}
            for key, positions in (("dropped", ref_set - mine_set), ("added", mine_set - ref_set)):
                for p in sorted(positions):
                    if magnitude[r, p] > 0:
                        gaps[key].append(float((ref64[r, p] - kth) / magnitude[r, p]))
        out.append({"precision": precision, "rows": int(keep.sum()), "min": float(share.min()) if share.numel()
                    else None, "mean": float(share.mean()) if share.numel() else None,
                    "changed_per_row": float((1 - share).mean() * TOPK) if share.numel() else None,
                    "gaps_dropped": gaps["dropped"][:GAPS_KEPT], "gaps_added": gaps["added"][:GAPS_KEPT]})
    return out


def measure_shape(shape: Shape, vllm, dg, workspace) -> dict:
    problem = benchmark_problem(shape, 64, "normal")
    q, kv_cache, weights, ctx, tables, max_model_len = problem.args
    visible = kv_lengths(ctx, shape.next_n).to(torch.int32).contiguous()  # [B, next_n], as vLLM passes them
    vis_rows = visible.reshape(-1)
    logits = torch.empty(shape.batch * shape.next_n, max_model_len, dtype=torch.float32, device="cuda")

    def our_logits(precision="fp8", out=logits):
        return fp8_paged_mqa_logits(q, kv_cache, weights, ctx, tables, max_model_len, precision=precision,
                                    check_values=False, out=out)

    our_logits()
    torch.cuda.synchronize()
    reference = topk_reference(logits, ctx, TOPK)
    record = {"shape": dataclasses.asdict(shape), "max_model_len": max_model_len,
              "visible_positions": int(vis_rows.long().sum()), "rows": []}
    logits_us, error = attempt(lambda: 1e3 * timing.time_ms(our_logits))
    record["logits_us"], record["logits_error"] = logits_us, error
    for name, fn in topk_impls(vllm, logits, problem, visible, workspace).items():
        row = check_and_time(name, fn, logits, ctx, reference)
        record["rows"].append(row)
        print(json.dumps({"shape": shape.label, **{k: v for k, v in row.items() if k != "config"}}), flush=True)

    ours = [r for r in record["rows"] if r["impl"] in CONFIGS and "us" in r]
    steps = {}
    default_name = next((r["impl"] for r in ours if same_launch(CONFIGS[r["impl"]], default_config(max_model_len),
                                                                 max_model_len)), None)
    best = min(ours, key=lambda r: r["us"])["impl"] if ours else None
    for label, config in (("ours (default launch)", default_config(max_model_len)),
                          ("ours (fastest launch)", CONFIGS.get(best))):
        if config is not None:
            steps[label], error = attempt(lambda config=config: 1e3 * timing.time_ms(
                lambda: indexer_topk(our_logits(), ctx, TOPK, check_values=False, config=config)))
            if error:
                steps[label + " error"] = error
    if dg is not None and deepgemm.refusal(problem) is None and vllm is not None:
        dg_logits = deepgemm.logits_fn(dg, problem)
        record["deepgemm_logits_us"], _ = attempt(lambda: 1e3 * timing.time_ms(dg_logits))

        def dg_step():
            out = dg_logits()
            vllm.decode_topk(out, visible, torch.empty(out.shape[0], TOPK, dtype=torch.int32, device="cuda"),
                             workspace)
            return out

        steps["deepgemm + vllm decode_topk"], error = attempt(lambda: 1e3 * timing.time_ms(dg_step))
        if error:
            steps["deepgemm + vllm decode_topk error"] = error
    record["steps_us"] = steps
    record["default_config"], record["fastest_config"] = default_name, best

    exact = torch.empty_like(logits)
    our_logits("exact", exact)
    precisions = {"fp8": logits, "exact": exact}
    if dg is not None and deepgemm.refusal(problem) is None:
        precisions["deepgemm"], _ = attempt(lambda: deepgemm.logits_fn(dg, problem)().clone())
    record["agreement"], error = attempt(lambda: agreement_rows(problem, precisions, vis_rows))
    if error:
        record["agreement_error"] = error
    del problem, logits, exact, precisions, reference
    torch.cuda.empty_cache()
    return record


def table(record: dict) -> str:
    lines = [f"{'B, next_n, ctx':22s} {'logits':>7s} {'ours':>7s} {'launch':>16s} {'decode':>7s} {'vLLM best':>9s} "
             f"{'torch':>7s} {'step ours':>9s} {'step DG+vLLM':>12s}"]
    for s in record["shapes"]:
        us = {r["impl"]: r.get("us") for r in s["rows"]}
        ours = [(r["us"], r["impl"]) for r in s["rows"] if r["impl"] in CONFIGS and "us" in r]
        vllm = [us[n] for n in ("vllm persistent_topk", "vllm cooperative_topk", "vllm top_k_per_row_decode")
                if us.get(n)]
        fmt = lambda v: f"{v:7.1f}" if isinstance(v, float) else f"{'-':>7s}"  # noqa: E731
        shape = s["shape"]
        lines.append(f"{shape['batch']:5d}, {shape['next_n']}, {shape['avg_ctx']:7d}   {fmt(s.get('logits_us'))} "
                     f"{fmt(min(ours)[0] if ours else None)} {min(ours)[1] if ours else '-':>16s} "
                     f"{fmt(us.get('vllm decode_topk'))} {fmt(min(vllm) if vllm else None):>9s} "
                     f"{fmt(us.get('torch.topk'))} {fmt(s['steps_us'].get('ours (fastest launch)')):>9s} "
                     f"{fmt(s['steps_us'].get('deepgemm + vllm decode_topk')):>12s}")
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="where to write the JSON")
    ap.add_argument("--shapes", type=int, nargs="*", help="indices into SHAPES (default: all)")
    args = ap.parse_args(argv)
    timing.refuse_interpreter()
    start = time.time()
    vllm, vllm_error = load_vllm()
    dg = deepgemm.load()
    record = {"provenance": provenance(), "vllm_topk": {"commit": vllm_commit(), "error": vllm_error},
              "deepgemm": getattr(dg, "__version__", "imported") if dg else None, "topk": TOPK,
              "configs": {n: dataclasses.asdict(c) for n, c in CONFIGS.items()},
              "copy_bytes_per_s": timing.copy_bandwidth(), "timer_floor_us": 1e3 * timing.floor_ms(), "shapes": []}
    workspace = vllm.make_workspace() if vllm is not None else None
    for i in args.shapes if args.shapes is not None else range(len(SHAPES)):
        shape_record, error = attempt(lambda: measure_shape(SHAPES[i], vllm, dg, workspace))
        record["shapes"].append(shape_record or {"shape": dataclasses.asdict(SHAPES[i]), "error": error, "rows": [],
                                                 "steps_us": {}})
        record["seconds"] = time.time() - start
        with open(args.out, "w") as f:
            json.dump(record, f, indent=1)
    print(table(record))
    print(f"{record['seconds']:.0f} s; vLLM: {vllm_error or 'loaded'}; DeepGEMM: {record['deepgemm']}")


if __name__ == "__main__":
    main()
