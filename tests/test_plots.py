"""The workbook's figures drawn from the data they are given."""

import math

import matplotlib

matplotlib.use("Agg")

from preshuffle import plots, portable_ladder  # noqa: E402


def test_portable_ladder_plot_draws_a_bar_per_recorded_share():
    loaded = portable_ladder.load()
    kept = [r for r in loaded.rungs if not r.dropped]
    expected = sorted(f.pct_copy for r in kept for f in r.figures if f.pct_copy is not None)
    fig = plots.portable_ladder_plot(loaded)
    (ax,) = fig.axes
    heights = sorted(p.get_height() for p in ax.patches if not math.isnan(p.get_height()))
    assert heights == expected
    assert len(ax.get_xticklabels()) == len(kept) and ax.get_xticklabels()[1].get_text().startswith("version 2\n")
    matplotlib.pyplot.close(fig)
