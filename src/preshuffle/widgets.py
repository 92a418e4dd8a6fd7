"""The workbook's explorers. Each is an ``ipywidgets.interactive`` whose callback draws a figure of
:mod:`preshuffle.plots` (shown as the PNG bytes ``plots.png_bytes`` renders, so a test can redraw it byte for
byte), prints its text report below and returns a value, so a test (or a reader) can set a control's ``.value``
and read ``.result``: no browser needed."""

from __future__ import annotations

import threading

import ipywidgets as widgets
from IPython.display import Image, display

from . import benchmark, decode_model, device, plots, report
from .topk import report as topk_report
from .arguments import int_in_range
from .layout import TILE, normal_offset, shuffle_offset
from .negotiation import format_negotiation, negotiate
from .plots import CACHE_LINE
from .precision import PRECISIONS
from .reference import reference_and_magnitude
from .shapes import MEASURED_NEXT_NS, VARIANTS, Shape
from .testing import timing
from .testing.inputs import benchmark_problem

MANAGER_BLOCK_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256, 320, 512, 768, 1024)
PR_STATES = ("after PR #51216", "before PR #51216")
# JupyterLab may deliver widget messages on a kernel subshell's thread while the main shell handles others: two
# updates of one explorer then ran at once, drawing into one output (and matplotlib is not thread-safe).
_DRAWING = threading.Lock()


class Explorer(widgets.interactive):
    """``ipywidgets.interactive`` whose updates run one at a time, each reading the controls' latest values."""

    def update(self, *args):
        with _DRAWING:
            super().update(*args)


def _choice(value, options, name: str):
    """``value`` if it is one of ``options`` (what a control offers); else ValueError naming ``name``."""
    if not any(value == option and type(value) is type(option) for option in options):
        raise ValueError(f"{name} must be one of {list(options)}, got {value!r}")
    return value


def show_figure(fig) -> None:
    """Display ``fig`` as the PNG bytes ``plots.png_bytes`` renders."""
    display(Image(data=plots.png_bytes(fig), format="png"))


def show_negotiation(block_size: int = 16, platform: str = "rocm", pr: str = PR_STATES[0], record: dict | None = None):
    """Draw what ``--block-size`` negotiates, which indexer kernel runs and what it costs (costs on CUDA from
    ``record``, the committed H200 results by default), print the same as text; return the Negotiation."""
    result = negotiate(block_size, platform, before_pr=_choice(pr, PR_STATES, "pr") == PR_STATES[1])
    show_figure(plots.negotiation_decision_plot(result, report.kernel_costs(result, record or report.load())))
    print(format_negotiation(result))
    return result


def negotiation_explorer(block_size: int = 16, platform: str = "rocm", pr: str = PR_STATES[0]):
    """A ``--block-size`` slider with platform and before/after toggles."""
    _choice(block_size, MANAGER_BLOCK_SIZES, "block_size")
    _choice(platform, ("rocm", "cuda"), "platform")
    _choice(pr, PR_STATES, "pr")
    return Explorer(
        show_negotiation,
        block_size=widgets.SelectionSlider(options=MANAGER_BLOCK_SIZES, value=block_size,
                                           description="--block-size", continuous_update=False),
        platform=widgets.ToggleButtons(options=["rocm", "cuda"], value=platform, description="platform"),
        pr=widgets.ToggleButtons(options=list(PR_STATES), value=pr, description="vLLM"),
        record=widgets.fixed(report.load()),
    )


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    """Sorted byte offsets -> (first byte, length) of each contiguous run."""
    runs: list[list[int]] = []
    for o in offsets:
        if runs and sum(runs[-1]) == o:
            runs[-1][1] += 1
        else:
            runs.append([o, 1])
    return [(first, length) for first, length in runs]


def lane_vector(token: int, dim: int, block_size: int, head_dim: int = 128) -> dict:
    """Where value (token, dim) sits in both layouts, and what one 16-byte load around it holds.

    A matrix-unit lane loads the 16 K-dim values of one token (dims ``d0 .. d0+15``). Sixteen lanes load the
    same dims of 16 consecutive tokens: one contiguous 256-byte run in the SHUFFLE layout, 16 runs 128 bytes
    apart (one per token row) in the NORMAL layout."""
    d0 = dim - dim % TILE
    t0 = token - token % TILE
    report = {"token": token, "dim": dim, "block_size": block_size, "head_dim": head_dim,
              "lane_dims": (d0, d0 + TILE - 1)}
    for name, offset in (("normal", normal_offset), ("shuffle", shuffle_offset)):
        first = offset(token, d0, block_size, head_dim)
        group = sorted(offset(t, d, block_size, head_dim) for t in range(t0, t0 + TILE) for d in range(d0, d0 + TILE))
        runs = _runs(group)
        report[name] = {
            "offset": offset(token, dim, block_size, head_dim),
            "vector": (first, first + TILE - 1),
            "group_runs": runs,
            "group_contiguous": len(runs) == 1,
            "group_lines": len({o // CACHE_LINE for o in group}),
        }
    return report


def format_lane_vector(r: dict) -> str:
    lines = [f"value (token {r['token']}, dim {r['dim']}) in a {r['block_size']}-token block; one lane loads dims "
             f"{r['lane_dims'][0]}..{r['lane_dims'][1]} of token {r['token']}"]
    for name in ("normal", "shuffle"):
        x = r[name]
        lines.append(f"  {name:7s}: byte {x['offset']:5d}; its 16-byte vector = bytes {x['vector'][0]}..{x['vector'][1]}; "
                     f"16 lanes (16 tokens) read {'one contiguous 256-byte run' if x['group_contiguous'] else '16 separate 16-byte pieces'}"
                     f" across {x['group_lines']} 128-byte lines")
    return "\n".join(lines)


def show_lane_vector(block_size: int = 16, token: int = 3, dim: int = 37) -> dict:
    """Draw both layouts' bytes of the value's 16 lanes, print where they are; return the lane_vector report (a
    token outside the block is refused, not moved to its last token: the explorer's slider keeps inside it)."""
    lanes = lane_vector(token, dim, block_size)
    show_figure(plots.lane_bytes_plot(lanes))
    print(format_lane_vector(lanes))
    return lanes


def layout_explorer(block_size: int = 16, token: int = 3, dim: int = 37):
    """Block size (multiples of 16), token and dim sliders; the token slider follows the block size."""
    _choice(block_size, range(16, 257, 16), "block_size")
    int_in_range(token, "token", 0, block_size)
    int_in_range(dim, "dim", 0, 128)
    size = widgets.SelectionSlider(options=list(range(16, 257, 16)), value=block_size, description="block size",
                                   continuous_update=False)
    tok = widgets.IntSlider(min=0, max=block_size - 1, value=token, description="token", continuous_update=False)
    d = widgets.IntSlider(min=0, max=127, value=dim, description="dim", continuous_update=False)

    def follow(change):
        tok.max = change["new"] - 1

    size.observe(follow, names="value")
    return Explorer(show_lane_vector, block_size=size, token=tok, dim=d)


# --------------------------------------------------------------------------------------------------
# The workload explorer: the committed results at the nearest measured shape, and a live measurement on a GPU.

BATCHES = tuple(2 ** i for i in range(13))
CONTEXTS = tuple((f"{2 ** i // 1024}K", 2 ** i) for i in range(10, 18))
NEXT_NS = MEASURED_NEXT_NS
LIVE_TOKEN_LIMIT = 1 << 25  # batch x context a live measurement may allocate (the largest anchor shape)


def measure_point(batch: int, avg_ctx: int, next_n: int, block_size: int, layout: str, precision: str) -> dict:
    """Our kernel (the one ``fp8_paged_mqa_logits`` picks on this GPU) timed by the benchmark harness at exactly
    this point, at ``precision``: one more bar for ``plots.workload_plot``. Checked against the float64 reference
    first; a result outside the precision's accuracy contract is not reported."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if batch * avg_ctx > LIVE_TOKEN_LIMIT:
        raise ValueError(f"batch x avg_ctx must be at most {LIVE_TOKEN_LIMIT} tokens to measure live, got "
                         f"{batch} x {avg_ctx}")
    ceiling = timing.copy_bandwidth()  # refuses under Triton's interpreter before anything is built
    shape = Shape(batch, next_n, avg_ctx)
    problem = benchmark_problem(shape, block_size, layout)
    row = benchmark.measure(benchmark.kernel_fn(problem, precision), problem, problem.call(reference_and_magnitude),
                            precision=precision, copy_bytes_per_s=ceiling)
    if "us" not in row:
        raise RuntimeError(f"not reported: error {row['max_rel_error']:.1e} is outside the {precision} contract")
    return {"label": f"live: {shape.label}", "us": row["us"], "pct_copy": row["pct_copy"], "chosen": True}


def show_workload(batch: int = 64, avg_ctx: int = 8192, next_n: int = 1, variant: tuple = (64, "normal"),
                  precision: str = "exact", record: dict | None = None, live: dict | None = None):
    """Draw the bars of ``report.workload_bars`` (plus a live bar measured at this very point, if ``live``
    holds one); return (nearest measured shape, bars)."""
    block_size, layout = variant
    nearest, bars = report.workload_bars(record or report.load(), batch, avg_ctx, next_n, block_size, layout,
                                         precision)
    point = (batch, avg_ctx, next_n, block_size, layout, precision)
    if live and point in live:
        bars = [*bars, live[point]]
    show_figure(plots.workload_plot(nearest, Shape(batch, next_n, avg_ctx), bars))
    return nearest, bars


def workload_explorer(batch: int = 64, avg_ctx: int = 8192, next_n: int = 1, variant: tuple = (64, "normal"),
                      precision: str = "exact", record: dict | None = None):
    """Batch, context, next_n, cache variant and precision controls over the committed results (``record``);
    on a GPU a button measures the chosen point live and adds it to the figure."""
    for value, options, name in ((batch, BATCHES, "batch"), (avg_ctx, [v for _, v in CONTEXTS], "avg_ctx"),
                                 (next_n, NEXT_NS, "next_n"), (variant, list(VARIANTS.values()), "variant"),
                                 (precision, PRECISIONS, "precision")):
        _choice(value, options, name)
    live: dict = {}
    w = Explorer(
        show_workload,
        batch=widgets.SelectionSlider(options=BATCHES, value=batch, description="batch", continuous_update=False),
        avg_ctx=widgets.SelectionSlider(options=CONTEXTS, value=avg_ctx, description="avg context",
                                        continuous_update=False),
        next_n=widgets.ToggleButtons(options=NEXT_NS, value=next_n, description="next_n"),
        variant=widgets.Dropdown(options=[(name, v) for name, v in VARIANTS.items()], value=variant,
                                 description="cache"),
        precision=widgets.ToggleButtons(options=PRECISIONS, value=precision, description="precision"),
        record=widgets.fixed(record or report.load()), live=widgets.fixed(live),
    )
    button = widgets.Button(description="measure live", disabled=device.INTERPRETED)
    note = widgets.Label("Triton's interpreter here: its timings are not kernel timings, so live measurement needs a "
                         "CUDA GPU" if device.INTERPRETED else "times the chosen point on this GPU")

    def measure(_):
        kw = w.kwargs
        point = (kw["batch"], kw["avg_ctx"], kw["next_n"], *kw["variant"], kw["precision"])
        button.disabled, note.value = True, "measuring ..."
        try:
            live[point] = measure_point(*point)
            note.value = f"{live[point]['label']}: {live[point]['us']:.1f} us"
        except (RuntimeError, ValueError) as error:
            note.value = str(error)
        finally:
            button.disabled = False
        w.update()

    button.on_click(measure)
    w.children = (*w.children[:-1], widgets.HBox([button, note]), w.children[-1])
    return w


# --------------------------------------------------------------------------------------------------------------------
# The decode-step explorer: one step's floor at a batch and context, and the indexer's kernels measured.

STEP_BATCHES = tuple(2 ** i for i in range(13))
STEP_CONTEXTS = tuple((f"{2 ** i // 1024}K", 2 ** i) for i in range(12, 18)) + (("1M", 2 ** 20),)
STEP_SETUPS = {"GLM-5.2, 4x MI355X": decode_model.GLM52_MI355X_TP4,
               "DeepSeek-V3.2, 8x H200": decode_model.DecodeModel()}


def decode_step(batch: int, context: int, setup: str, record: dict | None = None) -> dict:
    """The floor of a decode step of ``batch`` query rows seeing ``context`` tokens on ``setup`` (a key of
    STEP_SETUPS), the experts a MoE layer touches, the indexer's share of the floor; and, where ``record`` (a
    benchmarks/topk_gpu.py run) holds one, its nearest measured shape, whose logits kernel and fastest top-k (ours,
    and vLLM's best) summed over the setup's indexer layers give the indexer's measured time a step."""
    if setup not in STEP_SETUPS:
        raise ValueError(f"setup must be one of {list(STEP_SETUPS)}, got {setup!r}")
    model = STEP_SETUPS[setup]
    terms = model.step_seconds(batch, context)
    result = {"setup": setup, "batch": batch, "context": context, "terms": terms,
              "experts_touched": model.experts_touched(batch), "experts": model.geometry.experts,
              "indexer_step_share": model.indexer_step_share(batch, context), "nearest": None, "measured": None}
    if record is not None:
        row = topk_report.nearest(record, batch, context)
        layers = model.geometry.indexer_layers
        result["nearest"] = row
        result["measured"] = {name: layers * row[key] * 1e-6 for name, key in
                              (("our logits kernel", "logits_us"), ("our top-k", "ours_us")) if row[key] is not None}
    return result


def format_decode_step(r: dict) -> str:
    t = r["terms"]
    lines = [f"{r['setup']}, batch {r['batch']}, context {r['context']}: floor {1e3 * t['total']:.3g} ms = weights "
             f"{1e3 * t['weights']:.3g} ms ({r['experts_touched']:.0f} of {r['experts']} experts a MoE layer) + "
             f"indexer {1e3 * t['indexer']:.3g} + top-k {1e3 * t['topk']:.3g} + sparse attention "
             f"{1e3 * t['attention']:.3g}; the indexer's two kernels are {100 * r['indexer_step_share']:.1f}% of it"]
    if r["nearest"] is None:
        lines.append("no committed top-k run (results/h200-topk.json): nothing measured to show beside the floor")
    else:
        n = r["nearest"]
        lines.append(f"measured on the H200 at {n['shape'].label} (nearest): logits {n['logits_us']} us, our top-k "
                     f"{n['ours_us']} us, vLLM's best top-k {n['vllm_best_us']} us a call")
    return "\n".join(lines)


def show_decode_step(batch: int = 4, context: int = 2 ** 16, setup: str = next(iter(STEP_SETUPS)),
                     record: dict | None = None) -> dict:
    """Draw :func:`decode_step`'s floor and measured bars, print them; return its result."""
    r = decode_step(batch, context, setup, record)
    show_figure(plots.decode_step_plot(r["terms"], f"{setup}: batch {batch}, context {context}", r["measured"]))
    print(format_decode_step(r))
    return r


def decode_step_explorer(batch: int = 4, context: int = 2 ** 16, setup: str = next(iter(STEP_SETUPS)),
                         record: dict | None = None):
    """Batch and context sliders and a setup toggle over the decode-step model, with the committed top-k run
    (``record``, None where none is committed) beside it."""
    for value, options, name in ((batch, STEP_BATCHES, "batch"), (context, [v for _, v in STEP_CONTEXTS], "context"),
                                 (setup, list(STEP_SETUPS), "setup")):
        _choice(value, options, name)
    return Explorer(
        show_decode_step,
        batch=widgets.SelectionSlider(options=STEP_BATCHES, value=batch, description="batch", continuous_update=False),
        context=widgets.SelectionSlider(options=STEP_CONTEXTS, value=context, description="context",
                                        continuous_update=False),
        setup=widgets.ToggleButtons(options=list(STEP_SETUPS), value=setup, description="setup"),
        record=widgets.fixed(record),
    )
