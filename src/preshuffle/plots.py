"""The workbook's figures. Each function returns a matplotlib Figure sized here, so notebooks stay thin."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import torch

from .cache import FP8_MAX, SCALE_FLOOR, quantize_k
from .layout import offset_map
from .negotiation import sweep

WIDE = (10, 3.8)
SQUARE_PAIR = (10, 4.6)


def negotiation_plot(manager_block_sizes=(1, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 192, 256, 320, 512),
                     platform: str = "rocm"):
    """Kernel block size against ``--block-size``, before and after PR #51216, with AITER's rejections marked."""
    rows = sweep(manager_block_sizes, platform)
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=WIDE)
    for key, label, style in (("before_kernel_block_size", "before PR #51216", "o--"),
                              ("after_kernel_block_size", "after PR #51216", "s-")):
        y = [r[key] if r[key] is not None else np.nan for r in rows]
        ax.plot(x, y, style, label=label)
    rejected = [(i, r["after_kernel_block_size"]) for i, r in enumerate(rows)
                if r["after_kernel_block_size"] is not None and not r["after_accepted"]]
    if rejected:
        ax.scatter(*zip(*rejected), s=160, facecolors="none", edgecolors="red", linewidths=2,
                   label="negotiates, but AITER asserts", zorder=3)
    ax.set_yscale("log", base=2)
    ax.set_xticks(x, [str(r["manager_block_size"]) for r in rows])
    ax.set_xlabel("--block-size (manager block size)")
    ax.set_ylabel("kernel block size")
    ax.set_title(f"DeepSeek-V3.2 sparse MLA group on {platform}")
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


def quantization_plot(seed: int = 0, tokens: int = 2000, fp8_dtype=torch.float8_e4m3fn):
    """Left: the scale as a function of amax, plain and ue8m0 (a power of two, rounded up). Right: the relative
    error of dequantised tokens, ``|values * scale - k| / |k|``, for random bf16 keys, both ways."""
    top = FP8_MAX[fp8_dtype]
    amax = torch.logspace(-6, 3, 400, dtype=torch.float64)
    plain = amax.clamp(min=SCALE_FLOOR) / top
    ue8m0 = torch.exp2(torch.ceil(torch.log2(plain)))
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(tokens, 128, generator=g) * torch.exp(torch.randn(tokens, 1, generator=g) * 2)).bfloat16()
    fig, (left, right) = plt.subplots(1, 2, figsize=WIDE)
    left.loglog(amax, plain, label="max(amax, 1e-4) / 448")
    left.loglog(amax, ue8m0, label="ue8m0: next power of two")
    left.set_xlabel("amax of the token")
    left.set_ylabel("scale")
    left.legend()
    bins = np.linspace(0.0, 0.05, 51)
    for fmt, label in ((None, "plain scale"), ("ue8m0", "ue8m0 scale")):
        values, scales = quantize_k(k, fp8_dtype=fp8_dtype, scale_fmt=fmt)
        err = ((values.float() * scales[:, None] - k.float()).norm(dim=1) / k.float().norm(dim=1)).numpy()
        right.hist(err, bins=bins, alpha=0.6, label=f"{label} (median {np.median(err):.4f})")
    right.set_xlabel("relative error of a dequantised token")
    right.set_ylabel("tokens")
    right.legend()
    fig.tight_layout()
    return fig


def block_bytes_plot(block_size: int = 16, head_dim: int = 128):
    """One block as a strip of bytes: each token's values, then the scale tail."""
    value_bytes = block_size * head_dim
    fig, ax = plt.subplots(figsize=(10, 1.8))
    colors = plt.cm.tab20(np.arange(block_size) % 20)
    for t in range(block_size):
        ax.barh(0, head_dim, left=t * head_dim, color=colors[t], edgecolor="white", linewidth=0.3)
    for t in range(block_size):
        ax.barh(0, 4, left=value_bytes + 4 * t, color=colors[t], edgecolor="black", linewidth=0.3)
    ax.axvline(value_bytes, color="black")
    ax.set_xlim(0, value_bytes + 4 * block_size)
    ax.set_yticks([])
    ax.set_xlabel(f"byte offset in the block ({value_bytes} value bytes, then {4 * block_size} scale bytes)")
    ax.set_title(f"{block_size}-token block, NORMAL layout: token t's values at t*{head_dim}, its scale at "
                 f"{value_bytes} + 4t")
    fig.tight_layout()
    return fig


def offset_maps_plot(block_size: int = 32, head_dim: int = 128):
    """token x dim -> byte offset, NORMAL beside SHUFFLE, with 16-wide tiles drawn."""
    fig, axes = plt.subplots(1, 2, figsize=SQUARE_PAIR, sharey=True)
    for ax, layout in zip(axes, ("normal", "shuffle")):
        offsets = offset_map(block_size, head_dim, layout).numpy()
        image = ax.imshow(offsets, aspect="auto", cmap="viridis", interpolation="nearest")
        for d in range(16, head_dim, 16):
            ax.axvline(d - 0.5, color="white", linewidth=0.5)
        for t in range(16, block_size, 16):
            ax.axhline(t - 0.5, color="white", linewidth=0.5)
        ax.set_title(f"{layout}: byte offset of (token, dim)")
        ax.set_xlabel("dim (white lines: 16-byte lane vectors)")
        fig.colorbar(image, ax=ax, label="byte offset")
    axes[0].set_ylabel("token")
    fig.tight_layout()
    return fig


def line_map_plot(block_size: int = 16, head_dim: int = 128):
    """Which 128-byte line each value lands in: the 16 lanes of one MFMA operand load (dims 0-15 of 16 tokens)
    touch 16 lines in NORMAL and 2 in SHUFFLE."""
    fig, axes = plt.subplots(1, 2, figsize=SQUARE_PAIR, sharey=True)
    for ax, layout in zip(axes, ("normal", "shuffle")):
        lines = (offset_map(block_size, head_dim, layout) // 128).numpy()
        ax.imshow(lines % 8, aspect="auto", cmap="Set2", interpolation="nearest")
        ax.add_patch(plt.Rectangle((-0.5, -0.5), 16, 16, fill=False, edgecolor="red", linewidth=2))
        touched = len(np.unique(lines[:16, :16]))
        ax.set_title(f"{layout}: 128-byte line of each value\nred tile (one 16-lane load) spans {touched} lines")
        ax.set_xlabel("dim")
    axes[0].set_ylabel("token")
    fig.tight_layout()
    return fig


def valid_region_plot(logits: torch.Tensor, next_n: int, title: str = "visible (finite) logits"):
    """The -inf pattern of a logits tensor: rows b*next_n + j against key positions."""
    fig, ax = plt.subplots(figsize=WIDE)
    ax.imshow(torch.isfinite(logits).numpy(), aspect="auto", cmap="Greys", interpolation="nearest")
    for r in range(next_n, logits.shape[0], next_n):
        ax.axhline(r - 0.5, color="red", linewidth=0.8)
    ax.set_xlabel("key position p")
    ax.set_ylabel("row b*next_n + j")
    ax.set_title(title + " (black) - red lines separate sequences")
    fig.tight_layout()
    return fig


def roofline_plot(points: list[dict], copy_tb_s: float, tensor_tflops: float, title: str):
    """Achieved TFLOP/s against arithmetic intensity, under the copy ceiling and the fp16 MMA peak."""
    fig, ax = plt.subplots(figsize=WIDE)
    intensity = np.logspace(1, 3, 200)
    ax.loglog(intensity, np.minimum(intensity * copy_tb_s, tensor_tflops), "k-", label="roofline (copy, fp16 MMA)")
    for p in points:
        ax.scatter(p["intensity"], p["tflop_per_s"], marker=p.get("marker", "o"), label=p["label"], zorder=3)
    ax.set_xlabel("flop per byte moved")
    ax.set_ylabel("TFLOP/s")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2, loc="lower right")
    fig.tight_layout()
    return fig


def grouped_bars(groups: list[str], series: dict[str, list[float]], ylabel: str, title: str, hline=None):
    """One group of bars per shape, one bar per series."""
    fig, ax = plt.subplots(figsize=WIDE)
    width = 0.8 / len(series)
    x = np.arange(len(groups))
    for i, (name, values) in enumerate(series.items()):
        ax.bar(x + (i - (len(series) - 1) / 2) * width, values, width, label=name)
    if hline is not None:
        ax.axhline(hline, color="black", linewidth=0.8)
    ax.set_xticks(x, groups, fontsize=7)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=3, loc="upper left")
    fig.tight_layout()
    return fig


def decode_share_plot(contexts, shares: dict[str, list[float]], pr_share: float):
    fig, ax = plt.subplots(figsize=WIDE)
    for label, values in shares.items():
        ax.semilogx(contexts, 100 * np.asarray(values), label=label)
    ax.axhline(100 * pr_share, color="red", linestyle="--", label=f"share implied by PR #51216 ({100 * pr_share:.1f}%)")
    ax.set_xlabel("context length")
    ax.set_ylabel("indexer share of a decode step (%)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _shape_labels(rows: list[dict]) -> list[str]:
    return [r["shape"].label.replace(" next_n=", "/").replace(" ctx=", "/") for r in rows]


def cache_cost_plot(rows: list[dict]):
    """Each cache's time over DeepGEMM's (64-token natural blocks), fp8 path, per shape (rows of report.summary),
    with the targets: 16-token blocks within 1.1x, kernel block size 1 within 1.5x."""
    rows = [r for r in rows if r["block1_over_block64"] is not None]
    caches = {"block 1": "block1", "block 16": "block16-normal", "block 16 preshuffled": "block16-shuffle",
              "block 64 preshuffled": "block64-shuffle"}
    fig = grouped_bars(_shape_labels(rows), {label: [r[f"{v}_over_block64"] for r in rows]
                                             for label, v in caches.items()},
                       "time / block 64 natural", "Same workload, other caches (B/next_n/ctx), fp8 path", hline=1.0)
    ax = fig.axes[0]
    for target, style in ((1.1, ":"), (1.5, "--")):
        ax.axhline(target, color="red", linestyle=style, linewidth=0.8)
    return fig


def deepgemm_share_plot(rows: list[dict]):
    """Share of the copy ceiling on DeepGEMM's cache: our fp8 and exact paths and DeepGEMM, all from one run."""
    shares = {"ours, fp8": [r["fp8_pct"] for r in rows], "ours, exact": [r["exact_pct"] for r in rows],
              "DeepGEMM (same run; * flattened rows)": [r["deepgemm_pct"] for r in rows]}
    labels = [label + ("*" if r["deepgemm"] == "deepgemm-flattened" else "")
              for label, r in zip(_shape_labels(rows), rows)]
    return grouped_bars(labels, shares, "% of the copy ceiling", "Share of the HBM copy ceiling (B/next_n/ctx)")


def hopper_ladder_plot(ladders: dict[str, list[dict]]):
    """Chapter 5's ladder: each step's share of the copy ceiling, one panel per shape (rows of report.ladder)."""
    fig, axes = plt.subplots(1, len(ladders), figsize=WIDE, sharey=True)
    for ax, (label, steps) in zip(np.atleast_1d(axes), ladders.items()):
        y = np.arange(len(steps))[::-1]
        ax.barh(y, [s["pct_copy"] for s in steps], color=["tab:gray" if s["kernel"] != "hopper" else "tab:blue"
                                                           for s in steps])
        for yi, s in zip(y, steps):
            ax.text(s["pct_copy"] + 1, yi, f"{s['us']:.0f} us", va="center", fontsize=7)
        ax.set_yticks(y, [s["step"] for s in steps], fontsize=7)
        ax.set_xlim(0, 110)
        ax.set_xlabel("% of the copy ceiling")
        ax.set_title(label, fontsize=9)
    fig.tight_layout()
    return fig


def portable_ladder_plot(ladder):
    """Share of the copy ceiling after each version the kernel kept (a :class:`preshuffle.portable_ladder.Ladder`), one bar
    per recorded shape; no bar where the notes recorded no share."""
    rungs = [r for r in ladder.rungs if not r.dropped]
    groups = [f"version {r.version}\n" + "\n".join(r.ideas.values()) for r in rungs]
    shares = {s.label: [f.pct_copy if (f := r.figure(s)) and f.pct_copy is not None else np.nan for r in rungs]
              for s in ladder.shapes}
    return grouped_bars(groups, shares, "% of the copy ceiling", "The portable kernel's ladder on an H200")
