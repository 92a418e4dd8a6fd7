"""The figures, checked without a browser: what they draw is what the package computes."""

import math

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402

from preshuffle import layout, negotiation, plots, report, widgets  # noqa: E402
from preshuffle.shapes import Shape  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def tagged(artist, gid: str) -> list:
    return artist.findobj(lambda a: a.get_gid() == gid)


def texts(artist, gid: str) -> list[str]:
    return [t.get_text() for t in tagged(artist, gid)]


@pytest.mark.parametrize("make, axes", [
    (lambda: plots.negotiation_plot(), 1), (lambda: plots.quantization_plot(tokens=50), 2),
    (lambda: plots.block_bytes_plot(16), 1), (lambda: plots.offset_maps_plot(32), 4),
    (lambda: plots.line_map_plot(16), 2),
])
def test_plots_build(make, axes):
    fig = make()
    assert len(fig.axes) == axes and tuple(fig.get_size_inches()) in {plots.WIDE, plots.SQUARE_PAIR, (10, 1.8)}


@pytest.mark.parametrize("plot", [plots.block_bytes_plot, plots.offset_maps_plot, plots.line_map_plot])
@pytest.mark.parametrize("block_size, head_dim, exc, message", [
    # block_bytes_plot(10**6) drew a bar a token for minutes; (-5) drew a figure.
    (10**6, 128, ValueError, "block_size must be at most 1024 to be drawn token by token, got 1000000"),
    (-5, 128, ValueError, "block_size must be a positive int, got -5"),
    (16.0, 128, TypeError, "block_size must be a positive int, got float 16.0"),
    (16, 100, ValueError, "head_dim must be a multiple of 16 up to 1024, got 100"),
])
def test_block_plots_refuse_blocks_they_cannot_draw(plot, block_size, head_dim, exc, message):
    with pytest.raises(exc, match=f"^{message}$"):
        plot(block_size, head_dim)


@pytest.mark.parametrize("series, message", [
    ({"ours": [1.0], "theirs": [2.0, 3.0]}, "series 'ours' has 1 values for 2 groups"),  # broadcast before
    ({"ours": [1.0, 2.0, 3.0]}, "series 'ours' has 3 values for 2 groups"),
    ({}, "series must hold at least one series of bars"),
])
def test_grouped_bars_refuses_a_series_that_does_not_match_the_groups(series, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        plots.grouped_bars(["B=1", "B=64"], series, "us", "times")


def test_performance_plots_draw_the_committed_results(record):
    rows = report.summary(record)
    anchors = [r for r in rows if r["block1_over_block64"] is not None]
    fig = plots.cache_cost_plot(rows)
    heights = sorted(round(p.get_height(), 9) for p in fig.axes[0].patches)
    assert heights == sorted(round(r[f"{v}_over_block64"], 9) for r in anchors
                             for v in ("block1", "block16-normal", "block16-shuffle", "block64-shuffle"))
    plt.close(fig)
    fig = plots.deepgemm_share_plot(rows)
    assert sorted(p.get_height() for p in fig.axes[0].patches) == sorted(
        r[k] for r in rows for k in ("fp8_pct", "exact_pct", "deepgemm_pct"))
    plt.close(fig)
    ladders = {s.label: report.ladder(record, s) for s in (Shape(64, 1, 8192), Shape(4096, 1, 8192))}
    fig = plots.hopper_ladder_plot(ladders)
    for ax, steps in zip(fig.axes, ladders.values()):
        assert [p.get_width() for p in ax.patches] == [s["pct_copy"] for s in steps]
        assert [t.get_text().rsplit(", ", 1)[1] for t in ax.texts] == [f"{s['programs']}/seq" for s in steps]
    plt.close(fig)


def test_page_read_plot_draws_the_committed_floor():
    costs = report.page_read_costs(report.load(report.RESULTS / "h200-page-read.json"))
    fig = plots.page_read_plot(costs)
    heights = sorted(round(p.get_height(), 9) for p in fig.axes[0].patches)
    assert heights == sorted(round(c[k], 9) for c in costs
                             for k in ("block1_floor_ratio", "block1_kernel_ratio", "block1-contiguous_floor_ratio"))
    assert {line.get_ydata()[0] for line in fig.axes[0].lines} == {1.0, 1.5}
    plt.close(fig)


class NotOnCpu(torch.Tensor):
    """Stands in for a CUDA tensor on a machine without one: numpy() refuses, as torch does for any tensor that is
    not on the CPU, and .cpu() gives a plain CPU tensor."""

    def numpy(self, *args, **kwargs):
        raise TypeError("can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() first.")

    def cpu(self, *args, **kwargs):
        return self.as_subclass(torch.Tensor)


def test_valid_region_plot_moves_a_device_tensor_to_the_cpu():
    logits = torch.full((4, 6), float("-inf"))
    logits[0, :3] = 1.0
    logits[3, :5] = -2.0
    fig = plots.valid_region_plot(logits.as_subclass(NotOnCpu), next_n=2)
    image = fig.axes[0].get_images()[0].get_array()
    assert (image == torch.isfinite(logits).numpy()).all()


def test_png_bytes_are_reproducible_and_carry_no_software_tag():
    first = plots.png_bytes(plots.block_bytes_plot(16))
    assert first.startswith(b"\x89PNG") and b"Software" not in first
    assert plots.png_bytes(plots.block_bytes_plot(16)) == first
    assert plots.png_bytes(plots.block_bytes_plot(32)) != first


def decision(record, size, platform, before_pr=False):
    n = negotiation.negotiate(size, platform, before_pr=before_pr)
    return plots.negotiation_decision_plot(n, report.kernel_costs(n, record), manager_id=5)


def test_negotiation_decision_plot_cuts_the_manager_block(record):
    before = decision(record, 16, "rocm", before_pr=True)
    assert [(b.get_x(), b.get_width()) for b in tagged(before, "kernel-block")] == [(i, 1) for i in range(16)]
    assert texts(before, "kernel-block-id") == [str(5 * 16 + i) for i in range(16)]
    assert before.get_suptitle().endswith("kernel block size 1")
    after = decision(record, 16, "rocm")
    assert [(b.get_x(), b.get_width()) for b in tagged(after, "kernel-block")] == [(0, 16)]
    assert texts(after, "kernel-block-id") == ["5"]
    assert after.get_suptitle().endswith("kernel block size 16")
    many = decision(record, 160, "rocm", before_pr=True)   # 160 blocks: only the ends carry their ids
    assert len(tagged(many, "kernel-block")) == 160 and texts(many, "kernel-block-id") == ["800", "959"]


@pytest.mark.parametrize("size, platform, before_pr, entries, variant, accepted", [
    (16, "rocm", True, ["1", "1"], "per-token (kernel block 1)", True),
    (16, "rocm", False, ["MultipleOf(16)", "MultipleOf(16)"], "preshuffled 16x16 tiles", True),
    (128, "rocm", True, ["64", "64"], "preshuffled 16x16 tiles", True),
    (48, "rocm", False, ["MultipleOf(16)", "MultipleOf(16)"], "preshuffled 16x16 tiles", False),
    (256, "cuda", False, ["64", "64"], "natural blocks", True),
])
def test_negotiation_decision_plot_marks_the_entries_and_the_variant(record, size, platform, before_pr, entries,
                                                                     variant, accepted):
    fig = decision(record, size, platform, before_pr)
    assert texts(fig, "matched-entry-label") == entries
    assert texts(fig, "kernel-variant-label") == [variant]
    (box,) = tagged(fig, "kernel-variant")
    assert box.get_facecolor() == to_rgba(plots.OK_COLOR if accepted else plots.BAD_COLOR)
    assert ("REJECTS" in fig.axes[2].get_title()) == (not accepted)


def test_negotiation_decision_plot_of_a_failed_negotiation(record):
    fig = decision(record, 48, "cuda")
    assert tagged(fig, "matched-entry") == [] and tagged(fig, "kernel-variant") == []
    assert tagged(fig, "kernel-block") == [] and len(tagged(fig, "manager-block")) == 1
    assert fig.get_suptitle().endswith("negotiation fails")


@pytest.mark.parametrize("size, platform, before_pr", [(16, "rocm", True), (16, "rocm", False), (32, "rocm", False),
                                                       (48, "rocm", False), (64, "cuda", False)])
def test_negotiation_decision_plot_draws_the_costs(record, size, platform, before_pr):
    n = negotiation.negotiate(size, platform, before_pr=before_pr)
    costs = report.kernel_costs(n, record)
    fig = plots.negotiation_decision_plot(n, costs)
    for bar in costs["bars"]:
        (patch,) = tagged(fig, f"cost-{bar['kernel_block_size']}")
        assert patch.get_width() == (bar["us"] or 0)
        label = f"kernel block {bar['kernel_block_size']}{' (negotiated)' * bar['negotiated']}"
        assert label in [t.get_text() for t in fig.axes[3].get_yticklabels()]
    notes = [t.get_text() for t in fig.axes[3].texts]
    assert notes.count("not measured") == sum(b["us"] is None and n.kernel.accepted for b in costs["bars"])
    assert ("the kernel asserts: nothing runs" in notes) == (not n.kernel.accepted)


def cells(ax, gid: str) -> set[int]:
    """Byte offsets covered by the rectangles tagged ``gid`` (x: byte within its 128-byte line, y: the line)."""
    return {int(r.get_y()) * 128 + int(r.get_x()) + i for r in tagged(ax, gid) for i in range(int(r.get_width()))}


@pytest.mark.parametrize("block_size, token, dim", [(16, 3, 37), (32, 17, 17), (64, 40, 100), (256, 200, 5)])
def test_lane_bytes_plot_highlights_the_layout_offsets(block_size, token, dim):
    fig = plots.lane_bytes_plot(widgets.lane_vector(token, dim, block_size))
    d0, t0 = dim - dim % 16, token - token % 16
    for ax, offset, runs, lines in ((fig.axes[0], layout.normal_offset, 16, 16),
                                    (fig.axes[1], layout.shuffle_offset, 1, 2)):
        assert cells(ax, "lane") == {offset(token, d, block_size) for d in range(d0, d0 + 16)}
        group = {offset(t, d, block_size) for t in range(t0, t0 + 16) for d in range(d0, d0 + 16)}
        assert cells(ax, "lanes") == group
        (marker,) = tagged(ax, "value")
        x, y = marker.get_xdata()[0], marker.get_ydata()[0]
        assert (y - 0.5) * 128 + (x - 0.5) == offset(token, dim, block_size)
        bottom, top = ax.get_ylim()
        assert top <= min(group) // 128 and max(group) // 128 < bottom     # every highlighted line is in view
        assert f"{runs} contiguous run" in ax.get_title() and f"{lines} lines of 128 bytes" in ax.get_title()


def test_workload_plot_bars_are_the_bars(record):
    nearest, bars = report.workload_bars(record, 64, 8192, 1, 16, "shuffle", "fp8")
    asked = Shape(50, 1, 6000)
    fig = plots.workload_plot(nearest, asked, bars)
    time_ax, share_ax = fig.axes
    assert [p.get_width() for p in time_ax.patches] == [b["us"] or 0 for b in bars]
    assert [p.get_width() for p in share_ax.patches] == [b["pct_copy"] or 0 for b in bars]
    assert [t.get_text() for t in time_ax.texts].count("not measured") == sum(b["us"] is None for b in bars)
    assert [t.get_text() for t in time_ax.get_yticklabels()] == [b["label"] for b in bars]
    assert [t.get_fontweight() == "bold" for t in time_ax.get_yticklabels()] == [b["chosen"] for b in bars]
    assert fig.get_suptitle() == f"nearest measured shape: {nearest.label} (asked for {asked.label})"
    assert plots.workload_plot(nearest, nearest, bars).get_suptitle() == f"nearest measured shape: {nearest.label}"


def test_explorer_plots_are_not_held_by_pyplot(record):
    """A widget message handled on another kernel thread flushes (draws and closes) every figure pyplot holds."""
    held = plt.get_fignums()
    n = negotiation.negotiate(16, "rocm")
    plots.negotiation_decision_plot(n, report.kernel_costs(n, record))
    plots.lane_bytes_plot(widgets.lane_vector(3, 37, 16))
    nearest, bars = report.workload_bars(record, 64, 8192, 1, 64, "normal", "exact")
    plots.workload_plot(nearest, nearest, bars)
    assert plt.get_fignums() == held


def test_ladder_plot_of_chapter_3_draws_the_committed_steps(record):
    ladders = {s.label: report.ladder(record, s, chapter=3) for s in (Shape(64, 1, 8192), Shape(4096, 1, 8192))}
    fig = plots.ladder_plot(ladders, "chapter 3")
    every, triton = fig.axes
    small = ladders["B=64 next_n=1 ctx=8192"]
    assert [p.get_width() for p in every.patches] == [s["ns_per_logit"] for s in small]
    rungs = [s["pct_copy"] for steps in ladders.values() for s in steps if s["kernel"] not in plots.PYTHON_KERNELS]
    assert sorted(p.get_width() for p in triton.patches) == sorted(rungs)
    plt.close(fig)


def test_hopper_kernel_diagram_draws_the_pieces_of_the_kernel():
    fig = plots.hopper_kernel_diagram(stages=3)
    texts = " ".join(t.get_text() for t in fig.axes[0].texts)
    for piece in ("TMA descriptors", "loader warp", "WGMMA", "epilogue", "block table", "logits"):
        assert piece in texts
    assert [f"ready[{s}]" in texts and f"empty[{s}]" in texts for s in range(4)] == [True, True, True, False]
    assert tuple(fig.get_size_inches()) == (10, 5.4)


def test_topk_plots_draw_the_runs_numbers(topk_record):
    from preshuffle.topk import report as topk_report, steps as topk_steps

    rows = topk_report.summary(topk_record)
    fig = plots.step_split_plot(rows)
    bars = [p for p in fig.axes[0].patches]
    assert [round(p.get_height(), 9) for p in bars[:2]] == [11.0, 30.0]               # the logits kernel
    assert [round(p.get_height(), 9) for p in bars[2:4]] == [10.0, 8.0]               # our top-k, on top of it
    assert round(bars[4].get_height(), 9) == 40.0 and math.isnan(bars[5].get_height())  # DeepGEMM's step, where run
    plt.close(fig)
    fig = plots.topk_changes_plot(topk_report.agreement(topk_record))
    assert [t.get_text() for t in fig.axes[0].get_legend().get_texts()] == ["dropped (above the 2048th): 2",
                                                                           "added (below it): 2"]
    plt.close(fig)
    keys = topk_steps.order_keys(torch.randn(300, generator=torch.Generator().manual_seed(0)))
    t, trace = topk_steps.bisect(keys, 40)
    fig = plots.bisection_plot({"fp32 keys": trace}, {"fp32 keys": 40})
    assert list(fig.axes[0].lines[0].get_ydata()) == [s["count"] for s in trace]


def test_ladder_plot_draws_every_step_on_a_log_axis_and_the_triton_steps_on_a_linear_one():
    steps = [{"step": "loops", "kernel": "loops", "ns_per_logit": 2e6, "pct_copy": 1e-5, "us": 9e4},
             {"step": "grid", "kernel": "steps", "ns_per_logit": 0.06, "pct_copy": 30.0, "us": 50.0},
             {"step": "kernel", "kernel": "portable", "ns_per_logit": 0.05, "pct_copy": 32.0, "us": 47.0}]
    fig = plots.ladder_plot({"B=64": steps, "B=4096": steps[2:]}, "a ladder")
    every, triton = fig.axes
    labels = {t.get_text(): t.get_position()[1] for t in every.get_yticklabels()}
    assert every.get_xscale() == "log" and labels["loops"] > labels["kernel"]  # the first step on top
    assert [p.get_width() for p in every.patches] == [2e6, 0.06, 0.05]
    assert triton.get_xscale() == "linear" and triton.get_xlim() == (0, 100)
    assert [t.get_text() for t in triton.get_yticklabels()] == ["grid", "kernel"]  # no Python step
    assert sorted(p.get_width() for p in triton.patches) == [30.0, 32.0, 32.0]
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["B=64", "B=4096"]
    with pytest.raises(ValueError, match="ladders must map at least one shape"):
        plots.ladder_plot({"B=64": []}, "empty")
    plt.close(fig)


def test_topk_changes_plot_says_so_where_a_precision_changes_nothing():
    import warnings

    rows = [{"precision": "exact", "gaps_dropped": [], "gaps_added": []},
            {"precision": "fp8", "gaps_dropped": [1e-4], "gaps_added": [-1e-4, -2e-4]}]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no legend without artists
        fig = plots.topk_changes_plot(rows)
    exact, fp8 = fig.axes
    assert [t.get_text() for t in exact.texts] == ["no position changed"] and exact.get_legend() is None
    assert [t.get_text() for t in fp8.get_legend().get_texts()] == ["dropped (above the 2048th): 1",
                                                                     "added (below it): 2"]


def test_step_split_plot_floor_lies_below_every_bar(topk_record):
    from preshuffle.topk import report as topk_report

    fig = plots.step_split_plot(topk_report.summary(topk_record))
    ax = fig.axes[0]
    tops = [p.get_y() + p.get_height() for p in ax.patches if not math.isnan(p.get_height())]
    assert ax.get_ylim()[0] < min(tops) and ax.get_ylim()[0] == pytest.approx(11.0 / 2)
    plt.close(fig)


def test_topk_passes_plot_colours_the_threshold_bucket_and_its_neighbours():
    from preshuffle.topk import radix as topk_radix

    x = torch.randn(131072, generator=torch.Generator().manual_seed(1))
    _, trace = topk_radix.select(x, 2048)
    fig = plots.topk_passes_plot(x, 2048)
    counts, search, settle = fig.axes
    legend = [t.get_text() for t in counts.get_legend().get_texts()]
    assert legend[:2] == [f"above: {trace.above} selected", f"bucket {trace.bin}: {trace.in_bin} candidates"]
    orange = [p for p in counts.patches if p.get_facecolor() == to_rgba("tab:orange")]
    assert len(orange) == 1 and orange[0].get_height() == trace.in_bin
    green = sum(p.get_height() for p in counts.patches if p.get_facecolor() == to_rgba("tab:green"))
    assert green == trace.above
    assert counts.get_ylim()[0] < 1 and search.get_yscale() == "log"
    assert "radix level (list)" in settle.get_title() and tuple(fig.get_size_inches()) == plots.WIDE
    plt.close(fig)
    with pytest.raises(ValueError, match="selects them all"):
        plots.topk_passes_plot(torch.randn(10), 2048)


def test_topk_variants_plot_is_linear_from_zero():
    rows = [{"label": "default launch", "us": 11.6, "over_default": 1.0, "default": True},
            {"label": "bits: 12 -> 11", "us": 23.2, "over_default": 2.0, "default": False}]
    fig = plots.topk_variants_plot(rows, "t")
    ax = fig.axes[0]
    assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0
    assert [p.get_width() for p in ax.patches] == [11.6, 23.2]
    assert [t.get_text() for t in ax.texts] == [" 11.6 us (1.00x)", " 23.2 us (2.00x)"]
    plt.close(fig)
    with pytest.raises(ValueError, match="at least the default"):
        plots.topk_variants_plot([], "t")
