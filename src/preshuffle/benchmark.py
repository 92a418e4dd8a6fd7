"""The benchmark: every implementation checked against the float64 reference of the same inputs (each against the
contract of its precision) before it is timed, on inputs built the way docs/performance.md says
(:func:`preshuffle.testing.inputs.benchmark_problem`), DeepGEMM timed beside our kernels in the same process, times
and the copy ceiling of the same run from :mod:`preshuffle.testing.timing`, bytes and flops counted by
:class:`preshuffle.problem.PagedMQAProblem`, and the run's provenance.

A row is one implementation on one problem: ``kernel`` (hopper, portable, tl-tma, deepgemm, deepgemm-flattened, torch),
``precision``, ``variant`` (cache block size and layout), ``shape``, ``timing`` (graph replay, eager call, or graph
replay with a clean L2 flush), ``rule`` (the launch a caller gets), ``step`` (a rung of a ladder), the verdict and the
time; ladder rows carry ``chapter``, which ladder they measure: 3 for the Triton steps, 5 for the steps from the
portable kernel to the Hopper kernel (the results files' field), and the second ladder's ``programs_per_sequence``,
the split the step ran with. """

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import time
from dataclasses import asdict

import torch

from . import deepgemm
from . import provenance as run_provenance
from .kernels import HopperConfig, LaunchConfig, _kept_for, fp8_paged_mqa_logits, kernel_for
from .kernels.launch import CHUNK, NUM_STAGES, NUM_WARPS, fixed_run, hopper_config
from .teaching.steps import RUNGS, checked_launch, chunked_logits, per_block_grid_logits
from .teaching.tl_tma import tl_tma_logits
from .precision import PRECISIONS
from .problem import PagedMQAProblem
from .reference import (fp8_paged_mqa_logits_loops, fp8_paged_mqa_logits_ref, fp8_paged_mqa_logits_torch,
                        reference_and_magnitude)
from .shapes import ANCHOR_SHAPES, MEASURED_SHAPES, MTP_SHAPES, MTP_VARIANTS, VARIANTS, Shape
from .testing import timing
from .testing.inputs import HEAD_DIM, HEADS, benchmark_problem, input_digest
from .testing.numeric import CONTRACTS, bitwise_equal, check_repeatable, compare_logits, meets_contract

RUN_ORDER = tuple(reversed(PRECISIONS))  # fp8 first: the rows a reader compares with DeepGEMM's lead
LADDER_SHAPES = (Shape(64, 1, 8192), Shape(4096, 1, 8192))
HOST_SHAPES = (Shape(1, 1, 131072), Shape(64, 1, 8192))
# The scalar loops run on one sequence's first positions: the whole shape would take hours of Python.
LOOPS_POSITIONS = 128
SPLITS = (1, 2, 4, 8)  # programs per SM tried beside the launch rule (block64-normal, fp8)
SHAPES = MEASURED_SHAPES
REPEATS = 20  # runs of every implementation compared bit for bit before it is timed


def measure(fn, problem: PagedMQAProblem, reference: tuple, *, precision: str, copy_bytes_per_s: float,
            graph: bool = True, clean_l2: bool = False, masked: bool = False,
            checked: torch.Tensor | None = None, logits_dtype: torch.dtype = torch.float32) -> dict:
    """Check ``fn`` against ``reference`` (the float64 logits and magnitudes of ``problem``) by the contract of
    ``precision`` for logits of ``logits_dtype`` and for bitwise repeatability, then time it if it meets the
    contract.

    ``masked``: ``fn`` leaves masked positions unwritten (DeepGEMM): set them to -inf before comparing.
    ``checked``: the output of an already verified launch of the same kernel (another split), which ``fn`` must
    reproduce bit for bit; the verdict is then that launch's, cheaper than comparing again."""
    if masked:  # compare what is written: positions DeepGEMM leaves unwritten hold whatever the buffer held
        fn_written = lambda: deepgemm.masked_like(fn(), reference[0])  # noqa: E731
    else:
        fn_written = fn
    try:  # bit for bit (NaN equals itself), as the tests check repeatability
        out, repeatable = check_repeatable(fn_written, REPEATS), True
    except AssertionError:
        out, repeatable = fn_written(), False
    verdict = compare_logits(out, *reference)
    verdict["meets_contract"] = meets_contract(verdict, precision, logits_dtype)
    if checked is not None:
        verdict["bitwise_equal_to_rule"] = bitwise_equal(out, checked)
        verdict["meets_contract"] = verdict["meets_contract"] and verdict["bitwise_equal_to_rule"]
    verdict["bitwise_repeatable"] = repeatable
    if not verdict["meets_contract"]:
        return verdict
    ms = timing.time_ms(fn, graph=graph, clean_l2=clean_l2)
    nbytes, flops = problem.bytes, problem.flops
    return {**verdict, "us": ms * 1e3, "bytes": nbytes, "gb_per_s": nbytes / (ms * 1e-3) / 1e9,
            "pct_copy": 100 * nbytes / (ms * 1e-3) / copy_bytes_per_s, "tflop_per_s": flops / (ms * 1e-3) / 1e12}


def kernel_fn(problem: PagedMQAProblem, precision: str, config=None):
    """The unchecked call a server makes (no host sync), through the package's entry point."""
    return lambda: problem.call(fp8_paged_mqa_logits, precision=precision, check_values=False, config=config)


def unchecked_call(problem: PagedMQAProblem, out: torch.Tensor | None = None):
    """The unchecked fp8 call as a caller makes it, tensors in hand (no problem object in between)."""
    q, kv_cache, weights, context_lens, block_tables, max_model_len = problem.args
    layout = problem.layout
    return lambda: fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len,
                                        layout=layout, precision="fp8", check_values=False, out=out)


def host_parts(problem: PagedMQAProblem) -> tuple[dict, dict]:
    """Microseconds of host time of an unchecked fp8 call as a caller makes it (``call``, :func:`unchecked_call`),
    of the same call through :meth:`PagedMQAProblem.call` (``call_through_problem``, what :func:`kernel_fn` times:
    the problem's argument tuple and keywords cost 0.5-0.8 us on the H200's host), of the call writing into a given
    ``out`` (``call_with_out``), and, where a launch is kept for it (the Hopper kernel; the portable one launches
    through Triton's JIT every call), of its parts alone: finding the kept launch (``lookup``: its key and its guard
    over the tensors), allocating the output as the call does (``alloc``) and the launch itself (``launch``: the
    tensors' addresses, the preset launch and the driver); and the profile of the ``call`` measurement
    (:func:`~preshuffle.testing.timing.host_profile`: what the host did meanwhile)."""
    q, kv_cache, weights, context_lens, block_tables, max_model_len = problem.args
    out = kernel_fn(problem, "fp8")()
    profile = timing.host_profile(unchecked_call(problem))
    parts = {"call": profile["us"],
             "call_through_problem": timing.host_us(kernel_fn(problem, "fp8")),
             "call_with_out": timing.host_us(unchecked_call(problem, out))}
    def lookup():
        return _kept_for(q, kv_cache, weights, context_lens, block_tables, max_model_len, layout=problem.layout,
                         precision="fp8")

    kept = lookup()
    if kept is not None:
        parts["lookup"] = timing.host_us(lookup)
        parts["alloc"] = timing.host_us(kept.new_output)
        parts["launch"] = timing.host_us(lambda: kept.launch(*kept.addresses(q, weights, context_lens, block_tables,
                                                                             out)))
    return parts, profile


def torch_fn(problem: PagedMQAProblem):
    return lambda: problem.call(fp8_paged_mqa_logits_torch)


def torch_baseline_fits(shape: Shape, limit_bytes: int = 24 << 30) -> bool:
    """The vectorised baseline materialises fp32 keys and scores for the longest context of every sequence."""
    n = int(1.3 * shape.avg_ctx)
    return shape.batch * n * (HEAD_DIM + 2 * shape.next_n * HEADS) * 4 < limit_bytes


def triton_ladder(problem: PagedMQAProblem) -> list[tuple[str, str, object, bool]]:
    """The Triton steps, from the spec's naive kernel to the ideas the portable kernel starts from, each one idea:
    (step, kernel, call, whether a CUDA graph can capture it). All add exact products in fp32. Below them on the
    ladder are the scalar loops (:func:`loops_step`) and vectorised PyTorch in float64 and fp32; :func:`ladder`
    starts where this one ends."""
    def chunked(**switches):
        return checked_launch(chunked_logits, *problem.args, layout=problem.layout, **switches)

    return [("Triton: a program per (sequence, block)", "steps",
             checked_launch(per_block_grid_logits, *problem.args, layout=problem.layout), True),
            *((step, "steps", chunked(**switches), True) for step, switches in RUNGS.items())]


def loops_step(problem: PagedMQAProblem, copy_bytes_per_s: float) -> dict:
    """The scalar-loop version (the Triton ladder's first step) on the first :data:`LOOPS_POSITIONS` positions of the
    first sequence: checked against the float64 reference there, then timed once on the host (seconds of Python); its
    bytes and share of the copy ceiling are those of that sub-problem."""
    sub = problem.replace(q=problem.q[:1], weights=problem.weights[:problem.next_n],
                          context_lens=problem.context_lens[:1].clamp(max=LOOPS_POSITIONS),
                          block_tables=problem.block_tables[:1], max_model_len=LOOPS_POSITIONS)
    reference = sub.call(reference_and_magnitude)
    start = time.perf_counter()
    out = sub.call(fp8_paged_mqa_logits_loops)
    seconds = time.perf_counter() - start
    verdict = compare_logits(out.to(reference[0].device), *reference)
    verdict["meets_contract"] = meets_contract(verdict, "exact")
    if not verdict["meets_contract"]:
        return verdict
    return {**verdict, "us": seconds * 1e6, "positions": LOOPS_POSITIONS, "bytes": sub.bytes,
            "pct_copy": 100 * sub.bytes / seconds / copy_bytes_per_s}


def ladder(problem: PagedMQAProblem) -> list[tuple[str, str, str, object, int]]:
    """The steps from the portable kernel to the Hopper kernel, one change each: (step, kernel, precision, call,
    programs a sequence). Every step before the last runs a program a sequence, so that no step's time mixes its
    idea with a split; the last adds the launch rule's split (and is what a caller gets). Where the Hopper kernel
    does not run (another GPU), or the cache is not the plain TMA step's (natural 64-token pages), only the portable
    steps."""
    whole = LaunchConfig(CHUNK, None, NUM_WARPS, NUM_STAGES, splits=1)  # config_for's, a program a sequence
    steps = [("chapter 3's kernel (exact)", "portable", "exact", kernel_fn(problem, "exact", whole), 1),
             ("fp8 MMA", "portable", "fp8", kernel_fn(problem, "fp8", whole), 1)]
    if kernel_for(problem.block_size, problem.heads, problem.head_dim, problem.next_n,
                  layout=problem.layout) != "hopper" or (problem.block_size, problem.layout) != (64, "normal"):
        return steps
    rule = hopper_config(problem.batch, problem.next_n)
    row = fixed_run(problem.max_model_len, 1)
    return steps + [
        ("TMA in plain Triton", "tl-tma", "fp8", lambda: problem.call(tl_tma_logits, tokens_per_program=row), 1),
        ("Gluon: loader warp, 2-stage ring, a program per sequence", "hopper", "fp8",
         kernel_fn(problem, "fp8", HopperConfig(1, stages=2, maxnreg=rule.maxnreg)), 1),
        ("4-stage ring", "hopper", "fp8",
         kernel_fn(problem, "fp8", HopperConfig(1, stages=rule.stages, maxnreg=rule.maxnreg)), 1),
        ("split across the SMs (launch rule)", "hopper", "fp8", kernel_fn(problem, "fp8"), rule.splits),
    ]


SEED = 0  # every problem's inputs: benchmark_problem(shape, ..., seed=SEED), rebuilt on a CPU to check a row


def provenance(*parts: str) -> dict:
    """Where, when and on what a run measures; with ``parts`` (of :data:`preshuffle.provenance.PARTS`), the digest of
    the source of the kernels it launches (``kernels``)."""
    import triton

    def git(*args):
        try:
            return subprocess.run(["git", *args], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    # A copy of the tree run on another machine names its commit through the environment (the copy's own git
    # metadata, where it has any, may name another).
    named = os.environ.get("PRESHUFFLE_GIT_COMMIT")
    commit = named or git("rev-parse", "HEAD")
    info = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": commit,
        "git_dirty": None if named else bool(git("status", "--porcelain")) if commit else None,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, sms=props.multi_processor_count, cuda=torch.version.cuda,
                    driver=_driver_version())
    if parts:
        info["kernels"] = run_provenance.kernels_record(*parts)
    return info


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True).stdout
        return out.strip().splitlines()[0]
    except (OSError, subprocess.CalledProcessError, IndexError):
        return None


def _jobs(shapes, variants):
    """Every anchor shape on every cache; multi-token prediction (next_n 3 and 4) on :data:`MTP_VARIANTS`."""
    return [(shape, name) for shape in shapes for name in variants
            if shape not in MTP_SHAPES or name in MTP_VARIANTS]


def run(shapes=SHAPES, variants=tuple(VARIANTS), *, against_deepgemm: bool = True,
        steps: bool = True, torch_baseline: bool = True, on_row=None) -> dict:
    """The whole measurement: the copy ceiling and the timer's floor, then for every shape and cache our kernel in both
    precisions; on DeepGEMM's cache (block64-normal) also DeepGEMM (the build this process imports, named in the record;
    where it does not take next_n, on the flattened rows), the splits beside the launch rule, the eager call, the host's
    time per call (and its parts) and a clean-L2 flush on :data:`HOST_SHAPES`, both ladders (:func:`triton_ladder`,
    :func:`ladder`) on :data:`LADDER_SHAPES`, and the vectorised PyTorch baseline where it fits."""
    from tqdm.auto import tqdm

    timing.refuse_interpreter()
    dg = deepgemm.load() if against_deepgemm else None
    build = deepgemm.build_info(dg) if dg is not None else None
    record = {"provenance": provenance("bench"), "copy_bytes_per_s": timing.copy_bandwidth(),
              "timer_floor_us": 1e3 * timing.floor_ms(), "contracts": CONTRACTS,
              "deepgemm": build.as_dict() if build else None, "rows": [], "host_us": []}
    ceiling = record["copy_bytes_per_s"]

    def add(shape, name, **row):
        row.update(shape=asdict(shape), variant=name, seed=SEED, inputs_sha256=inputs)
        record["rows"].append(run_provenance.seal(row))
        if on_row:
            on_row(record, row)

    for shape, name in tqdm(_jobs(shapes, variants), desc="shapes x caches"):
        block_size, layout = VARIANTS[name]
        problem = benchmark_problem(shape, block_size, layout, seed=SEED)
        inputs = input_digest(problem)
        reference = problem.call(reference_and_magnitude)
        kernel = kernel_for(block_size, problem.heads, problem.head_dim, shape.next_n, layout=layout)
        rule_out = {}
        for precision in RUN_ORDER:
            fn = kernel_fn(problem, precision)
            add(shape, name, kernel=kernel, precision=precision, timing="graph", rule=True,
                **measure(fn, problem, reference, precision=precision, copy_bytes_per_s=ceiling))
            rule_out[precision] = fn()
        if name == "block64-normal":
            for pps in SPLITS if kernel == "hopper" else ():
                config = hopper_config(shape.batch, shape.next_n, programs_per_sm=pps)
                add(shape, name, kernel="hopper", precision="fp8", timing="graph", rule=False, programs_per_sm=pps,
                    config=asdict(config),
                    **measure(kernel_fn(problem, "fp8", config), problem, reference, precision="fp8",
                              copy_bytes_per_s=ceiling, checked=rule_out["fp8"]))
            add(shape, name, kernel=kernel, precision="fp8", timing="eager", rule=True,
                **measure(kernel_fn(problem, "fp8"), problem, reference, precision="fp8", copy_bytes_per_s=ceiling,
                          graph=False))
            if dg is not None:
                direct = deepgemm.refusal(problem, build) is None
                dg_problem = problem if direct else deepgemm.flattened(problem)
                if deepgemm.refusal(dg_problem, build) is None:
                    add(shape, name, kernel="deepgemm" if direct else "deepgemm-flattened", precision="fp8",
                        timing="graph", schedule_slots=build.schedule_slots(dg.get_num_sms(), dg_problem.next_n),
                        **measure(deepgemm.logits_fn(dg, dg_problem, build), problem, reference, precision="fp8",
                                  copy_bytes_per_s=ceiling, masked=True))
            if shape in HOST_SHAPES:
                fn = kernel_fn(problem, "fp8")
                parts, profile = host_parts(problem)  # the profile tells a slow host from a slow call
                record["host_us"].append({"shape": asdict(shape), "kernel": kernel, "us": parts.pop("call"),
                                          "parts": parts, "profile": profile})
                add(shape, name, kernel=kernel, precision="fp8", timing="graph-clean-l2", rule=True,
                    **measure(fn, problem, reference, precision="fp8", copy_bytes_per_s=ceiling, clean_l2=True))
                if dg is not None and deepgemm.refusal(problem, build) is None:
                    add(shape, name, kernel="deepgemm", precision="fp8", timing="graph-clean-l2",
                        **measure(deepgemm.logits_fn(dg, problem, build), problem, reference, precision="fp8",
                                  copy_bytes_per_s=ceiling, masked=True, clean_l2=True))
            ladder_here = steps and shape in LADDER_SHAPES
            if ladder_here and shape == LADDER_SHAPES[0]:
                add(shape, name, kernel="loops", precision="exact", timing="host", step="scalar loops (Python)",
                    chapter=3, **loops_step(problem, ceiling))
            if torch_baseline and torch_baseline_fits(shape):
                triton_rung = {"step": "vectorised PyTorch, fp32", "chapter": 3} if ladder_here else {}
                if ladder_here:
                    add(shape, name, kernel="torch-float64", precision="exact", timing="eager",
                        step="vectorised PyTorch, float64 (the reference)", chapter=3,
                        **measure(lambda: problem.call(fp8_paged_mqa_logits_ref), problem, reference,
                                  precision="exact", copy_bytes_per_s=ceiling, graph=False))
                add(shape, name, kernel="torch", precision="exact", timing="eager", **triton_rung,
                    **measure(torch_fn(problem), problem, reference, precision="exact", copy_bytes_per_s=ceiling,
                              graph=False))
            if ladder_here:
                for step, step_kernel, fn, graph in triton_ladder(problem):
                    add(shape, name, kernel=step_kernel, precision="exact", timing="graph" if graph else "eager",
                        step=step, chapter=3, **measure(fn, problem, reference, precision="exact",
                                                        copy_bytes_per_s=ceiling, graph=graph))
                for step, step_kernel, precision, fn, programs in ladder(problem):
                    add(shape, name, kernel=step_kernel, precision=precision, timing="graph", step=step, chapter=5,
                        programs_per_sequence=programs,
                        **measure(fn, problem, reference, precision=precision, copy_bytes_per_s=ceiling))
        del problem, reference, rule_out
        torch.cuda.empty_cache()
    return run_provenance.seal_record(record)
