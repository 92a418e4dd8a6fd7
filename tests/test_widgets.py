"""The sliders, driven without a browser: set a control's value, read the callback's result."""

import matplotlib

matplotlib.use("Agg")

import pytest  # noqa: E402

from preshuffle import plots, widgets  # noqa: E402


def controls(w):
    return {c.description: c for c in w.children[:-1]}


def test_negotiation_explorer_follows_the_slider_and_toggles(capsys):
    w = widgets.negotiation_explorer()
    assert (w.result.kernel_block_size, w.result.kernel.preshuffled) == (16, True)
    c = controls(w)
    c["vLLM"].value = widgets.PR_STATES[1]
    assert (w.result.kernel_block_size, w.result.blocks_per_manager_block, w.result.kernel.preshuffled) == (1, 16, False)
    c["--block-size"].value = 128
    assert w.result.kernel_block_size == 64
    c["vLLM"].value = widgets.PR_STATES[0]
    c["--block-size"].value = 48
    assert w.result.kernel_block_size == 48 and not w.result.kernel.accepted
    c["platform"].value = "cuda"
    assert w.result.kernel_block_size is None and "No common block size for 48" in w.result.error
    c["--block-size"].value = 256
    assert w.result.kernel_block_size == 64 and w.result.kernel.name.startswith("DeepGEMM")


def test_layout_explorer_follows_the_sliders():
    w = widgets.layout_explorer()
    assert w.result["shuffle"]["offset"] == 565 and w.result["normal"]["offset"] == 3 * 128 + 37
    c = controls(w)
    c["block size"].value = 32
    c["token"].value = 17
    c["dim"].value = 17
    assert w.result["shuffle"]["offset"] == 2321
    assert w.result["shuffle"]["group_contiguous"] and w.result["shuffle"]["group_lines"] == 2
    assert not w.result["normal"]["group_contiguous"] and w.result["normal"]["group_lines"] == 16
    c["block size"].value = 16
    assert c["token"].max == 15 and w.result["token"] <= 15


def test_lane_vector_reports_the_16_byte_load():
    r = widgets.lane_vector(3, 37, 16)
    assert r["lane_dims"] == (32, 47)
    assert r["shuffle"]["vector"] == (560, 575) and r["normal"]["vector"] == (416, 431)


@pytest.mark.parametrize("make, axes", [
    (lambda: plots.negotiation_plot(), 1), (lambda: plots.quantization_plot(tokens=50), 2),
    (lambda: plots.block_bytes_plot(16), 1), (lambda: plots.offset_maps_plot(32), 4),
    (lambda: plots.line_map_plot(16), 2),
])
def test_plots_build(make, axes):
    fig = make()
    assert len(fig.axes) == axes and tuple(fig.get_size_inches()) in {plots.WIDE, plots.SQUARE_PAIR, (10, 1.8)}
    matplotlib.pyplot.close(fig)


def test_performance_plots_draw_the_committed_results():
    from preshuffle import report
    from preshuffle.shapes import Shape

    record = report.load()
    rows = report.summary(record)
    anchors = [r for r in rows if r["block1_over_block64"] is not None]
    fig = plots.cache_cost_plot(rows)
    heights = sorted(round(p.get_height(), 9) for p in fig.axes[0].patches)
    assert heights == sorted(round(r[f"{v}_over_block64"], 9) for r in anchors
                             for v in ("block1", "block16-normal", "block16-shuffle", "block64-shuffle"))
    matplotlib.pyplot.close(fig)
    fig = plots.deepgemm_share_plot(rows)
    assert sorted(p.get_height() for p in fig.axes[0].patches) == sorted(
        r[k] for r in rows for k in ("fp8_pct", "exact_pct", "deepgemm_pct"))
    matplotlib.pyplot.close(fig)
    ladders = {s.label: report.ladder(record, s) for s in (Shape(64, 1, 8192), Shape(4096, 1, 8192))}
    fig = plots.hopper_ladder_plot(ladders)
    for ax, steps in zip(fig.axes, ladders.values()):
        assert [p.get_width() for p in ax.patches] == [s["pct_copy"] for s in steps]
    matplotlib.pyplot.close(fig)
