"""The workbook's explorers. Each is an ``ipywidgets.interactive`` whose callback draws a figure of
:mod:`preshuffle.plots` (shown as the PNG bytes ``plots.png_bytes`` renders, so a test can redraw it byte for
byte), prints its text report below and returns a value, so a test (or a reader) can set a control's ``.value``
and read ``.result``: no browser needed."""

from __future__ import annotations

import threading

import ipywidgets as widgets
from IPython.display import Image, display

from . import benchmark, device, plots, report
from .layout import TILE, normal_offset, shuffle_offset
from .negotiation import format_negotiation, negotiate
from .plots import CACHE_LINE
from .precision import PRECISIONS
from .reference import reference_and_magnitude
from .shapes import VARIANTS, Shape
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


def show_figure(fig) -> None:
    """Display ``fig`` as the PNG bytes ``plots.png_bytes`` renders."""
    display(Image(data=plots.png_bytes(fig), format="png"))


def show_negotiation(block_size: int = 16, platform: str = "rocm", pr: str = PR_STATES[0], record: dict | None = None):
    """Draw what ``--block-size`` negotiates, which indexer kernel runs and what it costs (costs on CUDA from
    ``record``, the committed H200 results by default), print the same as text; return the Negotiation."""
    result = negotiate(block_size, platform, before_pr=pr == PR_STATES[1])
    show_figure(plots.negotiation_decision_plot(result, report.kernel_costs(result, record or report.load())))
    print(format_negotiation(result))
    return result


def negotiation_explorer(block_size: int = 16, platform: str = "rocm", pr: str = PR_STATES[0]):
    """A ``--block-size`` slider with platform and before/after toggles."""
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
    """Draw both layouts' bytes of the value's 16 lanes, print where they are; return the lane_vector report."""
    lanes = lane_vector(min(token, block_size - 1), dim, block_size)
    show_figure(plots.lane_bytes_plot(lanes))
    print(format_lane_vector(lanes))
    return lanes


def layout_explorer(block_size: int = 16, token: int = 3, dim: int = 37):
    """Block size (multiples of 16), token and dim sliders; the token slider follows the block size."""
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
NEXT_NS = (1, 2, 3)
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
