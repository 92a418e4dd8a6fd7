"""The sliders, driven without a browser: set a control's value, read the callback's result."""

import threading
import time

import matplotlib

matplotlib.use("Agg")

import ipywidgets  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from preshuffle import device, negotiation, plots, report, widgets  # noqa: E402
from preshuffle.shapes import Shape  # noqa: E402


def controls(w):
    return {c.description: c for c in w.children if isinstance(c, ipywidgets.ValueWidget)}


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


@pytest.fixture
def shown(monkeypatch):
    """What the explorers display: the images they put in their output."""
    images = []
    monkeypatch.setattr(widgets, "display", images.append)
    return images


def test_negotiation_explorer_shows_the_package_figure(shown, record):
    w = widgets.negotiation_explorer()
    open_figures = plt.get_fignums()
    controls(w)["--block-size"].value = 24
    assert plt.get_fignums() == open_figures    # drawn, shown, closed: nothing left for the inline backend to show
    n = negotiation.negotiate(24, "rocm")
    assert shown[-1].data == plots.png_bytes(plots.negotiation_decision_plot(n, report.kernel_costs(n, record)))


def test_layout_explorer_shows_the_package_figure(shown):
    w = widgets.layout_explorer()
    open_figures = plt.get_fignums()
    controls(w)["dim"].value = 100
    assert plt.get_fignums() == open_figures
    assert shown[-1].data == plots.png_bytes(plots.lane_bytes_plot(widgets.lane_vector(3, 100, 16)))


def test_lane_vector_counts_the_runs_of_16_lanes():
    r = widgets.lane_vector(17, 17, 32)
    assert r["shuffle"]["group_runs"] == [(2304, 256)]
    assert r["normal"]["group_runs"] == [(t * 128 + 16, 16) for t in range(16, 32)]


def test_workload_explorer_follows_the_controls(shown, record):
    w = widgets.workload_explorer()
    nearest, bars = w.result
    assert nearest == Shape(64, 1, 8192) and [b["chosen"] for b in bars].index(True) == 3
    c = controls(w)
    open_figures = plt.get_fignums()
    c["batch"].value = 256
    c["avg context"].value = 65536
    c["next_n"].value = 2
    c["cache"].value = (16, "normal")
    c["precision"].value = "fp8"
    expected = report.workload_bars(record, 256, 65536, 2, 16, "normal", "fp8")
    assert w.result == expected and expected[0] == Shape(256, 2, 65536)
    assert plt.get_fignums() == open_figures
    assert shown[-1].data == plots.png_bytes(plots.workload_plot(expected[0], expected[0], expected[1]))


def live_controls(w):
    """The workload explorer's measure button and the note beside it."""
    return next(c for c in w.children if isinstance(c, ipywidgets.HBox)).children


@pytest.mark.skipif(not device.INTERPRETED, reason="the interpreter's refusal")
def test_workload_explorer_offers_no_live_measurement_under_the_interpreter(shown, monkeypatch):
    button, note = live_controls(widgets.workload_explorer())
    assert button.disabled and "interpreter" in note.value
    monkeypatch.setattr(widgets, "benchmark_problem", lambda *a, **k: pytest.fail("built inputs it cannot time"))
    with pytest.raises(RuntimeError, match="interpreter"):
        widgets.measure_point(64, 8192, 1, 64, "normal", "exact")


@pytest.mark.parametrize("args, message", [((64, 8192, 1, 64, "normal", "fp16"), "precision"),
                                           ((4096, 131072, 1, 64, "normal", "exact"), "batch x avg_ctx")])
def test_measure_point_rejects_bad_points(args, message):
    with pytest.raises(ValueError, match=message):
        widgets.measure_point(*args)


@pytest.mark.skipif(device.INTERPRETED, reason="needs a CUDA GPU: interpreter timings are not kernel timings")
@pytest.mark.parametrize("precision", ["exact", "fp8"])
def test_measure_point_times_the_point_on_the_gpu(precision):
    bar = widgets.measure_point(64, 8192, 1, 64, "normal", precision)
    assert bar["label"] == "live: B=64 next_n=1 ctx=8192" and bar["chosen"]
    assert 0 < bar["us"] < 1000 and 0 < bar["pct_copy"] < 100


@pytest.mark.skipif(device.INTERPRETED, reason="needs a CUDA GPU: interpreter timings are not kernel timings")
def test_workload_explorer_button_adds_the_live_bar(shown):
    w = widgets.workload_explorer()
    button, note = live_controls(w)
    button.click()
    nearest, bars = w.result
    assert len(bars) == 7 and bars[-1]["label"] == "live: B=64 next_n=1 ctx=8192" and bars[-1]["us"] > 0, note.value


def test_explorer_runs_one_update_at_a_time():
    """Widget messages may arrive on a kernel subshell's thread while the main shell handles another."""
    running, overlaps = [], []

    def slow(x=1):
        if running:
            overlaps.append(x)
        running.append(x)
        time.sleep(0.05)
        running.pop()

    w = widgets.Explorer(slow, x=ipywidgets.IntSlider(value=1))
    threads = [threading.Thread(target=w.update) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert overlaps == []


def test_decode_step_explorer_follows_the_sliders_and_the_setup(shown, topk_record):
    from preshuffle import decode_model
    from preshuffle.topk import report as topk_report

    w = widgets.decode_step_explorer(record=topk_record)
    first = w.result
    assert first["setup"] == "GLM-5.2, 4x MI355X"
    assert first["terms"] == decode_model.GLM52_MI355X_TP4.step_seconds(4, 2 ** 16)
    c = controls(w)
    open_figures = plt.get_fignums()
    c["batch"].value = 64
    c["context"].value = 2 ** 13
    c["setup"].value = "DeepSeek-V3.2, 8x H200"
    r = w.result
    assert r["terms"] == decode_model.DecodeModel().step_seconds(64, 2 ** 13)
    assert r["experts_touched"] == pytest.approx(decode_model.DecodeModel().experts_touched(64))
    nearest = topk_report.nearest(topk_record, 64, 2 ** 13)
    assert r["nearest"] == nearest and r["measured"] == pytest.approx(
        {"our logits kernel": 61 * 30.0e-6, "our top-k": 61 * 8.0e-6})
    assert plt.get_fignums() == open_figures
    assert shown[-1].data == plots.png_bytes(plots.decode_step_plot(r["terms"], "DeepSeek-V3.2, 8x H200: batch 64, "
                                                                    "context 8192", r["measured"]))


def test_decode_step_without_a_committed_run_says_so(capsys):
    r = widgets.decode_step(4, 50000, "GLM-5.2, 4x MI355X")
    assert r["measured"] is None and "no committed top-k run" in widgets.format_decode_step(r)
    with pytest.raises(ValueError, match="setup must be one of"):
        widgets.decode_step(4, 50000, "GLM-5")


def test_show_negotiation_refuses_an_unknown_pr_state(shown):
    # "bogus" meant after the PR.
    with pytest.raises(ValueError, match=r"^pr must be one of \['after PR #51216', 'before PR #51216'\], got 'bogus'$"):
        widgets.show_negotiation(16, "rocm", pr="bogus")


@pytest.mark.parametrize("token", [16, 40, -1])
def test_show_lane_vector_refuses_a_token_outside_the_block(shown, token):
    # Clamped to the last token (15) before; the explorer's slider clamps itself, its function refuses.
    with pytest.raises(ValueError, match=rf"^token must be in \[0, 16\), got {token}$"):
        widgets.show_lane_vector(16, token, 37)


@pytest.mark.parametrize("explorer, kwargs, message", [
    # A raw TraitError from the slider before.
    (widgets.negotiation_explorer, dict(block_size=17), r"^block_size must be one of \[1, 2, 4, .*\], got 17$"),
    (widgets.negotiation_explorer, dict(platform="tpu"), r"^platform must be one of \['rocm', 'cuda'\], got 'tpu'$"),
    (widgets.layout_explorer, dict(block_size=24), r"^block_size must be one of \[16, 32, .*\], got 24$"),
    (widgets.layout_explorer, dict(block_size=16, token=16), r"^token must be in \[0, 16\), got 16$"),
    (widgets.layout_explorer, dict(dim=128), r"^dim must be in \[0, 128\), got 128$"),
    (widgets.workload_explorer, dict(batch=100), r"^batch must be one of \[1, 2, 4, .*\], got 100$"),
    (widgets.workload_explorer, dict(avg_ctx=8192.0), r"^avg_ctx must be one of \[1024, .*\], got 8192.0$"),
    (widgets.workload_explorer, dict(variant=(8, "normal")), r"^variant must be one of .*, got \(8, 'normal'\)$"),
    (widgets.workload_explorer, dict(precision="fp16"), r"^precision must be one of \['exact', 'fp8'\], got 'fp16'$"),
    (widgets.decode_step_explorer, dict(batch=3), r"^batch must be one of \[1, 2, 4, .*\], got 3$"),
    (widgets.decode_step_explorer, dict(context=5000), r"^context must be one of \[4096, .*\], got 5000$"),
    (widgets.decode_step_explorer, dict(setup="GLM-5"), r"^setup must be one of \['GLM-5.2, 4x MI355X', .*\], got "
                                                        r"'GLM-5'$"),
])
def test_explorers_name_a_bad_starting_value(shown, explorer, kwargs, message):
    with pytest.raises(ValueError, match=message):
        explorer(**kwargs)
