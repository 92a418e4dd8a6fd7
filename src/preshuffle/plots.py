"""The workbook's figures. Each function returns a matplotlib Figure sized here, so notebooks stay thin."""

from __future__ import annotations

import io

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from .arguments import positive_int
from .cache import fp8_max, quantize_k, token_scales
from .layout import TILE, offset_map
from .negotiation import map_to_kernel_blocks, matching_entry, rejected_rows, sweep

WIDE = (10, 3.8)
SQUARE_PAIR = (10, 4.6)
EXPLORER = (10, 6.4)
DPI = 100  # explorers render their images at this dpi, so a test can redraw one byte for byte
CACHE_LINE = 128  # bytes
MAX_DRAWN_TOKENS, MAX_DRAWN_DIMS = 1024, 1024  # what a block figure draws one by one


def negotiation_plot(manager_block_sizes=(1, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 192, 256, 320, 512),
                     platform: str = "rocm"):
    """Kernel block size against ``--block-size``, before and after PR #51216, with AITER's rejections marked."""
    rows = sweep(manager_block_sizes, platform)
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=WIDE)
    # The sizes are categories, not a continuum: markers side by side, no lines between them.
    for offset, (key, label, marker) in zip((-0.12, 0.12), (("before_kernel_block_size", "before PR #51216", "o"),
                                                          ("after_kernel_block_size", "after PR #51216", "s"))):
        y = [r[key] if r[key] is not None else np.nan for r in rows]
        ax.plot(x + offset, y, marker, linestyle="none", markersize=7, label=label)
    rejected_sizes = set(rejected_rows(rows))
    rejected = [(i, r["after_kernel_block_size"]) for i, r in enumerate(rows)
                if r["manager_block_size"] in rejected_sizes]
    if rejected:
        rejected = [(i + 0.12, k) for i, k in rejected]
        ax.scatter(*zip(*rejected), s=160, facecolors="none", edgecolors="red", linewidths=2,
                   label="negotiates, but AITER asserts", zorder=3)
    ax.set_yscale("log", base=2)
    ax.set_xticks(x, [str(r["manager_block_size"]) for r in rows])
    ax.grid(axis="y", alpha=0.3)
    ax.set_xlabel("--block-size (manager block size)")
    ax.set_ylabel("kernel block size")
    ax.set_title(f"DeepSeek-V3.2 sparse MLA group on {platform}")
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


def quantization_plot(seed: int = 0, tokens: int = 2000, fp8_dtype=torch.float8_e4m3fn):
    """Left: the scale as a function of amax, plain and ue8m0 (a power of two, rounded up). Right: the relative
    error of dequantised tokens, ``|values * scale - k| / |k|``, for random bf16 keys, both ways."""
    amax = torch.logspace(-6, 3, 400, dtype=torch.float64)
    plain, ue8m0 = (token_scales(amax, fp8_dtype=fp8_dtype, scale_fmt=fmt) for fmt in (None, "ue8m0"))
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(tokens, 128, generator=g) * torch.exp(torch.randn(tokens, 1, generator=g) * 2)).bfloat16()
    fig, (left, right) = plt.subplots(1, 2, figsize=WIDE)
    left.loglog(amax, plain, label=f"max(amax, 1e-4) / {fp8_max(fp8_dtype):g}")
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


def _drawable_block(block_size, head_dim) -> tuple[int, int]:
    """A block's sizes, refused unless a figure of one (a bar or a row per token) can be drawn in seconds."""
    block_size, head_dim = positive_int(block_size, "block_size"), positive_int(head_dim, "head_dim")
    if block_size > MAX_DRAWN_TOKENS:
        raise ValueError(f"block_size must be at most {MAX_DRAWN_TOKENS} to be drawn token by token, got {block_size}")
    if head_dim % TILE or head_dim > MAX_DRAWN_DIMS:
        raise ValueError(f"head_dim must be a multiple of {TILE} up to {MAX_DRAWN_DIMS}, got {head_dim}")
    return block_size, head_dim


def block_bytes_plot(block_size: int = 16, head_dim: int = 128):
    """One block as a strip of bytes: each token's values, then the scale tail."""
    block_size, head_dim = _drawable_block(block_size, head_dim)
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
    block_size, head_dim = _drawable_block(block_size, head_dim)
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
    block_size, head_dim = _drawable_block(block_size, head_dim)
    fig, axes = plt.subplots(1, 2, figsize=SQUARE_PAIR, sharey=True)
    n_lines = block_size * head_dim // CACHE_LINE
    # One colour a line: tab20 while the lines are at most 20 (a 16-token block has 16), a continuous map beyond.
    cmap = plt.get_cmap("tab20", 20) if n_lines <= 20 else plt.get_cmap("turbo", n_lines)
    for ax, layout in zip(axes, ("normal", "shuffle")):
        lines = (offset_map(block_size, head_dim, layout) // CACHE_LINE).numpy()
        ax.imshow(lines, aspect="auto", cmap=cmap, vmin=-0.5, vmax=cmap.N - 0.5, interpolation="nearest")
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
    ax.imshow(torch.isfinite(logits).cpu().numpy(), aspect="auto", cmap="Greys", interpolation="nearest")
    for r in range(next_n, logits.shape[0], next_n):
        ax.axhline(r - 0.5, color="red", linewidth=0.8)
    ax.set_xlabel("key position p")
    ax.set_ylabel("row b*next_n + j")
    ax.set_title(title + " (black) - red lines separate sequences")
    fig.tight_layout()
    return fig


def grouped_bars(groups: list[str], series: dict[str, list[float]], ylabel: str, title: str, hline=None):
    """One group of bars per shape, one bar per series (each with one value per group: matplotlib would spread a
    single value over every group)."""
    if not series:
        raise ValueError("series must hold at least one series of bars")
    for name, values in series.items():
        if len(values) != len(groups):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(groups)} groups")
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


def _short(label: str) -> str:
    """A shape's label as B/next_n/ctx, short enough for an axis."""
    return label.replace(" next_n=", "/").replace(" ctx=", "/")


def _shape_labels(rows: list[dict]) -> list[str]:
    return [_short(r["shape"].label) for r in rows]


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
    for target, style, label in ((1.1, ":", "target for 16-token pages: 1.1x"),
                                 (1.5, "--", "target for block 1: 1.5x")):
        ax.axhline(target, color="red", linestyle=style, linewidth=0.8, label=label)
    _legend_right(fig, ax)
    return fig


def _legend_right(fig, ax) -> None:
    """The legend beside the axes, where it covers no bar."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    fig.tight_layout()


def page_read_plot(costs: list[dict]):
    """One-token pages against 64-token ones, per shape (rows of report.page_read_costs): what reading them alone
    costs (the page-read floor), what the kernel's call costs, and reading them kept together, with block 1's
    target (1.5x)."""
    series = {"block 1, read alone": "block1_floor_ratio", "block 1, the kernel": "block1_kernel_ratio",
              "block 1 kept together, read alone": "block1-contiguous_floor_ratio"}
    labels = [_short(c["shape"]) for c in costs]
    fig = grouped_bars(labels, {name: [c[key] for c in costs] for name, key in series.items()},
                       "time / the same on block 64",
                       "One-token pages (B/next_n/ctx): the memory's price and the kernel's", hline=1.0)
    ax = fig.axes[0]
    ax.axhline(1.5, color="red", linestyle="--", linewidth=0.8)
    ax.set_ylim(0, 1.25 * max(c[key] for c in costs for key in series.values()))  # room for the legend
    return fig


def deepgemm_share_plot(rows: list[dict]):
    """Share of the copy ceiling on DeepGEMM's cache: our fp8 and exact paths and DeepGEMM, all from one run."""
    shares = {"ours, fp8": [r["fp8_pct"] for r in rows], "ours, exact": [r["exact_pct"] for r in rows],
              "DeepGEMM (same run; * flattened rows)": [r["deepgemm_pct"] for r in rows]}
    labels = [label + ("*" if r["deepgemm"] == "deepgemm-flattened" else "")
              for label, r in zip(_shape_labels(rows), rows)]
    fig = grouped_bars(labels, shares, "% of the copy ceiling", "Share of the HBM copy ceiling (B/next_n/ctx)")
    ax = fig.axes[0]
    ax.tick_params(axis="x", labelrotation=30)
    _legend_right(fig, ax)
    return fig


def hopper_ladder_plot(ladders: dict[str, list[dict]]):
    """The ladder from the portable kernel to the Hopper kernel: each step's share of the copy ceiling, one panel per
    shape (rows of report.ladder), each step labelled with the programs a sequence it ran, where known."""
    fig, axes = plt.subplots(1, len(ladders), figsize=WIDE, sharey=True)
    for ax, (label, steps) in zip(np.atleast_1d(axes), ladders.items()):
        y = np.arange(len(steps))[::-1]
        ax.barh(y, [s["pct_copy"] for s in steps], color=["tab:gray" if s["kernel"] != "hopper" else "tab:blue"
                                                           for s in steps])
        for yi, s in zip(y, steps):
            split = f", {s['programs']}/seq" if s.get("programs") else ""
            ax.text(s["pct_copy"] + 1, yi, f"{s['us']:.0f} us{split}", va="center", fontsize=7)
        ax.set_yticks(y, [s["step"] for s in steps], fontsize=7)
        ax.set_xlim(0, 110)
        ax.set_xlabel("% of the copy ceiling")
        ax.set_title(label, fontsize=9)
    fig.tight_layout()
    return fig


# The kernels of the Triton ladder's rungs that run in Python or PyTorch; the others are Triton kernels.
PYTHON_KERNELS = ("loops", "torch-float64", "torch")


def ladder_plot(ladders: dict[str, list[dict]], title: str):
    """The Triton ladder in two panels (rows of report.ladder, ``{shape label: steps}``). Left, every step of the
    longest ladder, its time per visible logit on a log scale: the scalar loops to a Triton kernel span six orders of
    magnitude. Right, the Triton steps of every ladder, their share of the copy ceiling on a linear scale, a bar per
    shape with its time, where steps a few percent apart stay apart."""
    if not ladders or not all(ladders.values()):
        raise ValueError("ladders must map at least one shape to its non-empty list of steps")
    fig, (every, triton) = plt.subplots(1, 2, figsize=(10, 4.6), gridspec_kw={"width_ratios": [1, 1.15]})
    label, steps = max(ladders.items(), key=lambda item: len(item[1]))
    y = np.arange(len(steps))[::-1]
    every.barh(y, [s["ns_per_logit"] for s in steps],
               color=["tab:gray" if s["kernel"] in PYTHON_KERNELS else "tab:blue" for s in steps])
    for yi, s in zip(y, steps):
        every.text(s["ns_per_logit"] * 1.15, yi, f"{s['ns_per_logit']:.3g}", va="center", fontsize=7)
    every.set_xscale("log")
    every.set_yticks(y, [s["step"] for s in steps], fontsize=7)
    every.set_xlim(right=max(s["ns_per_logit"] for s in steps) * 100)
    every.set_xlabel("ns per visible logit (log scale; gray: Python, blue: Triton)")
    every.set_title(f"every step, {label}", fontsize=9)

    names = list(dict.fromkeys(s["step"] for steps in ladders.values() for s in steps
                               if s["kernel"] not in PYTHON_KERNELS))
    height = 0.8 / len(ladders)
    y = np.arange(len(names))[::-1]
    for i, (label, steps) in enumerate(ladders.items()):
        by_name = {s["step"]: s for s in steps}
        rungs = [(yi, by_name[n]) for yi, n in zip(y, names) if n in by_name]
        offset = (len(ladders) - 1) / 2 - i
        triton.barh([yi + offset * height for yi, _ in rungs], [s["pct_copy"] for _, s in rungs], height,
                    color=f"C{i}", label=label)
        for yi, s in rungs:
            triton.text(s["pct_copy"] + 1, yi + offset * height, f"{s['us']:.1f} us", va="center", fontsize=6.5)
    triton.set_yticks(y, names, fontsize=7)
    triton.set_xlim(0, 100)
    triton.set_xlabel("% of the copy ceiling (linear scale)")
    triton.set_title("the Triton steps", fontsize=9)
    fig.legend(*triton.get_legend_handles_labels(), loc="lower right", ncol=len(ladders), fontsize=7, frameon=False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 1))  # room below for the shapes' legend, which covers no bar there
    return fig


def png_bytes(fig, dpi: int = DPI) -> bytes:
    """The figure as PNG bytes, reproducibly: fixed dpi and no software tag, so two processes agree byte for byte."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, metadata={"Software": None})
    return buffer.getvalue()


# --------------------------------------------------------------------------------------------------
# The explorers' figures: each draws one state of its widget. They are plain Figures, not pyplot's: a widget
# message handled on another kernel thread runs the inline backend's flush, which would draw and close every
# figure pyplot holds, a half-built one included. Display one with display(fig), or as a cell's value.

KERNEL_VARIANTS = ("per-token (kernel block 1)", "natural blocks", "preshuffled 16x16 tiles")
OK_COLOR, BAD_COLOR, IDLE_COLOR = "#9fd89f", "#f4a6a6", "#e8e8e8"


def _variant_index(kernel) -> int:
    if kernel.kv_block_size == 1:
        return 0
    return 2 if kernel.preshuffled else 1


def _boxes(ax, labels: list[str], x0: float, width: float, y: float, faces: list[str], gids: list) -> None:
    for i, (label, face, gid) in enumerate(zip(labels, faces, gids)):
        x = x0 + i * (width + 0.2)
        ax.add_patch(Rectangle((x, y - 0.35), width, 0.7, facecolor=face, gid=gid,
                               edgecolor="black" if gid else "grey", linewidth=2 if gid else 0.8))
        ax.text(x + width / 2, y, label, ha="center", va="center", fontsize=9, gid=gid and f"{gid}-label")


def _blank(ax, xmax: float, ymax: float) -> None:
    ax.set_xlim(0, xmax)
    ax.set_ylim(0, ymax)
    ax.axis("off")


def negotiation_decision_plot(negotiation, costs: dict, manager_id: int = 5):
    """One ``--block-size`` decision, top to bottom: manager block ``manager_id`` cut into kernel blocks (their
    ids), each backend's declaration with the entry that accepted the kernel size in green, the kernel variant
    that runs (green: the kernel accepts it, red: it asserts), and what it costs (``report.kernel_costs``)."""
    n, m = negotiation, manager_id
    size, k = n.manager_block_size, n.kernel_block_size
    when = "before" if n.before_pr else "after"
    fig = Figure(figsize=EXPLORER, layout="constrained")
    split, decl, variant, cost = fig.subplots(4, 1, height_ratios=[1, 1.2, 1.1, 1.5])
    verdict = f"kernel block size {k}" if k else "negotiation fails"
    fig.suptitle(f"--block-size {size} on {n.platform}, {when} PR #51216:  {verdict}", fontsize=13, weight="bold")

    split.set_xlim(0, size)
    split.set_ylim(0, 1)
    split.set_yticks([])
    split.set_xticks([0, size])
    split.set_xlabel("token of the manager block", labelpad=-8)
    if k is None:
        split.add_patch(Rectangle((0, 0), size, 1, facecolor=BAD_COLOR, hatch="//", gid="manager-block"))
        split.text(size / 2, 0.5, n.error.strip(), ha="center", va="center", bbox={"facecolor": "white"})
        split.set_title(f"manager block {m} ({size} tokens): no kernel block size divides it for every backend",
                        fontsize=10)
    else:
        r = size // k
        ids = map_to_kernel_blocks([m], r)
        for i, kid in enumerate(ids):
            split.add_patch(Rectangle((i * k, 0), k, 1, facecolor=("#cfe2f3", "#9fc5e8")[i % 2], edgecolor="black",
                                      linewidth=0.5 if r > 16 else 1, gid="kernel-block"))
            if r <= 16:
                split.text((i + 0.5) * k, 0.5, str(kid), ha="center", va="center", fontsize=9, gid="kernel-block-id")
            elif i in (0, r - 1):  # too narrow to hold their ids: the ends carry them, inside the manager block
                split.text(i * k + (0.2 if i == 0 else 0.8) * k, 0.5, str(kid), ha="left" if i == 0 else "right",
                           va="center", fontsize=9, gid="kernel-block-id", bbox={"facecolor": "white", "pad": 1})
        if r > 16:
            split.text(size / 2, 0.5, f"... {r} kernel blocks ...", ha="center", va="center",
                       bbox={"facecolor": "white", "edgecolor": "none"})
        ids_text = f"id {ids[0]}" if r == 1 else f"ids {ids[0]}..{ids[-1]}"
        split.set_title(f"manager block {m} ({size} tokens) = {r} kernel block{'s' * (r > 1)} of {k} "
                        f"token{'s' * (k > 1)}: {ids_text}", fontsize=10)

    rows = list(n.declarations.items())
    _blank(decl, 12, len(rows))
    decl.set_title("what each backend declares (green: the entry that accepts the kernel block size)", fontsize=10)
    for i, (name, entries) in enumerate(rows):
        y = len(rows) - i - 0.5
        hit = matching_entry(entries, k, name) if k else None
        decl.text(0, y, name, va="center", fontsize=9)
        _boxes(decl, [repr(e) for e in entries], 5.6, 1.9, y,
               [OK_COLOR if j == hit else "white" for j in range(len(entries))],
               ["matched-entry" if j == hit else None for j in range(len(entries))])

    _blank(variant, 12, 1)
    running = _variant_index(n.kernel) if n.kernel else None
    face = OK_COLOR if n.kernel and n.kernel.accepted else BAD_COLOR
    _boxes(variant, list(KERNEL_VARIANTS), 0.1, 3.8, 0.5, [face if j == running else "white" for j in range(3)],
           ["kernel-variant" if j == running else None for j in range(3)])
    if n.kernel:
        verb = "accepts" if n.kernel.accepted else "REJECTS"
        variant.set_title(f"the kernel that runs: {n.kernel.name}\n{verb} KVBlockSize={n.kernel.kv_block_size}: "
                          f"{n.kernel.reason}", fontsize=10)
    else:
        variant.set_title("the kernel that runs: none (no kernel block size)", fontsize=10)

    bars = costs["bars"]
    y = np.arange(len(bars))[::-1]
    widths = [b["us"] or 0.0 for b in bars]
    faces = [face if b["negotiated"] else IDLE_COLOR for b in bars]
    for patch, b in zip(cost.barh(y, widths, color=faces, edgecolor="black"), bars):
        patch.set_gid(f"cost-{b['kernel_block_size']}")
    top = max(widths, default=0) or 1.0
    for yi, b in zip(y, bars):
        if b["us"] is not None:
            note = f"{b['us']:.2f} us"
        elif b["negotiated"] and n.kernel and not n.kernel.accepted:
            note = "the kernel asserts: nothing runs"
        else:
            note = "not measured"
        cost.text((b["us"] or 0) + 0.01 * top, yi, note, va="center", fontsize=9)
    cost.set_yticks(y, [f"kernel block {b['kernel_block_size']}{' (negotiated)' * b['negotiated']}" for b in bars],
                    fontsize=9)
    cost.set_xlim(0, 1.3 * top)
    cost.set_xlabel("microseconds per indexer call")
    cost.set_title(f"what it costs: {costs['source']}", fontsize=10)
    return fig


def _line_segments(first: int, length: int):
    """(byte in line, line, width) of each 128-byte line's share of the byte run [first, first + length)."""
    end = first + length
    while first < end:
        stop = min(end, (first // CACHE_LINE + 1) * CACHE_LINE)
        yield first % CACHE_LINE, first // CACHE_LINE, stop - first
        first = stop


def lane_bytes_plot(report: dict):
    """The value bytes of one block as rows of 128-byte lines, NORMAL beside SHUFFLE, for a ``widgets.lane_vector``
    report: the 256 bytes that 16 lanes load in orange, the value's own lane (16 bytes) in red, the value an x.
    Background shades alternate by token. Blocks above 32 lines show the 32 lines around the 16 tokens."""
    block_size, head_dim = report["block_size"], report["head_dim"]
    lines = block_size * head_dim // CACHE_LINE
    first_token = report["token"] - report["token"] % TILE
    line0 = first_token * head_dim // CACHE_LINE
    low = 0 if lines <= 32 else min(line0 - line0 % 32, lines - 32)
    high = min(lines, low + 32)
    fig = Figure(figsize=SQUARE_PAIR, layout="constrained")
    axes = fig.subplots(1, 2, sharey=True)
    fig.suptitle(f"value (token {report['token']}, dim {report['dim']}) of a {block_size}-token block: the bytes "
                 f"16 lanes load (tokens {first_token}..{first_token + TILE - 1}, dims {report['lane_dims'][0]}.."
                 f"{report['lane_dims'][1]})", fontsize=11)
    for ax, name in zip(axes, ("normal", "shuffle")):
        where = report[name]
        token_of_byte = torch.empty(block_size * head_dim, dtype=torch.long)
        token_of_byte[offset_map(block_size, head_dim, name).reshape(-1)] = torch.arange(block_size).repeat_interleave(head_dim)
        ax.imshow((token_of_byte.reshape(lines, CACHE_LINE) % 2).numpy(), cmap="Greys", vmin=0, vmax=4,
                  extent=(0, CACHE_LINE, lines, 0), aspect="auto", interpolation="nearest")
        for gid, color, runs in (("lanes", "orange", where["group_runs"]),
                                 ("lane", "red", [(where["vector"][0], TILE)])):
            for first, length in runs:
                for x, y, width in _line_segments(first, length):
                    ax.add_patch(Rectangle((x, y), width, 1, facecolor=color, edgecolor="none", gid=gid))
        value = where["offset"]
        ax.plot(value % CACHE_LINE + 0.5, value // CACHE_LINE + 0.5, "kx", markersize=7, markeredgewidth=2, gid="value")
        ax.hlines(range(low, high + 1), 0, CACHE_LINE, colors="royalblue", linewidth=0.8)
        ax.set_ylim(high, low)
        ax.set_xticks(range(0, CACHE_LINE + 1, TILE))
        ax.set_xlabel("byte within its 128-byte line (blue lines: line boundaries)")
        runs = len(where["group_runs"])
        ax.set_title(f"{name.upper()}: 16 lanes = {runs} contiguous run{'s' * (runs > 1)}, "
                     f"{where['group_lines']} lines of 128 bytes", fontsize=10)
    axes[0].set_ylabel(f"128-byte line of the block ({lines} lines)")
    fig.legend(handles=[Patch(color="orange", label="the 16 lanes' 256 bytes"),
                        Patch(color="red", label="the value's lane: 16 bytes"),
                        Line2D([], [], color="black", marker="x", linestyle="none", label="the value")],
               loc="outside lower center", ncols=3, fontsize=9)
    return fig


def workload_plot(nearest, asked, bars: list[dict]):
    """Time and share of the copy ceiling of each bar of ``report.workload_bars`` (the chosen variant dark,
    DeepGEMM orange), titled with the measured shape the bars come from."""
    y = np.arange(len(bars))[::-1]
    colors = ["C0" if b["chosen"] else "C1" if b["label"].startswith("DeepGEMM") else "#c6d4e6" for b in bars]
    fig = Figure(figsize=WIDE, layout="constrained")
    time_ax, share_ax = fig.subplots(1, 2, sharey=True)
    shown = f"nearest measured shape: {nearest.label}"
    fig.suptitle(shown if asked == nearest else f"{shown} (asked for {asked.label})", fontsize=11)
    for ax, key, unit, xlabel in ((time_ax, "us", " us", "microseconds per call (median)"),
                                  (share_ax, "pct_copy", "%", "% of the HBM copy ceiling (line: 100%)")):
        values = [b[key] for b in bars]
        ax.barh(y, [v or 0.0 for v in values], color=colors, edgecolor="black", linewidth=0.5)
        top = 100.0 if key == "pct_copy" else max((v for v in values if v), default=1.0)
        for yi, v in zip(y, values):
            ax.text((v or 0) + 0.01 * top, yi, f"{v:.1f}{unit}" if v else "not measured", va="center", fontsize=8)
        ax.set_xlim(0, 1.25 * top)
        ax.set_xlabel(xlabel)
    share_ax.axvline(100, color="black", linewidth=1)
    time_ax.set_yticks(y, [b["label"] for b in bars], fontsize=8)
    for label, b in zip(time_ax.get_yticklabels(), bars):
        label.set_fontweight("bold" if b["chosen"] else "normal")
    return fig


def hopper_kernel_diagram(stages: int = 4):
    """The Hopper kernel as one picture: pages in HBM, the two TMA descriptors, the loader warp, the ring of
    shared-memory stages with their ready/empty mbarriers, the math warpgroup's WGMMA and epilogue, the logits."""
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    fig, ax = plt.subplots(figsize=(10, 5.4))
    ax.set_xlim(0, 100)
    ax.set_ylim(0, 58)
    ax.axis("off")

    def box(x, y, w, h, text, face, size=7):
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.3,rounding_size=0.8", facecolor=face,
                                    edgecolor="black", linewidth=0.8))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size)

    def arrow(start, end, color="black", rad=0.0):
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=11, color=color, linewidth=1.1,
                                     connectionstyle=f"arc3,rad={rad}"))

    def note(x, y, text, color="black", **kw):
        ax.text(x, y, text, fontsize=6.5, color=color, **kw)

    for x, title in ((11, "HBM"), (36, "loader warp"), (57, f"shared memory: {stages} stages"),
                     (86, "math warpgroup")):
        ax.text(x, 56, title, ha="center", fontsize=9, weight="bold")
    box(1, 45, 20, 7, "block table [B, max_blocks]\nint32 page ids", "#f2f2f2", size=7.5)
    for i, y in enumerate((35, 27.5, 20)):
        box(1, y, 20, 5.5, f"page {(7, 2, 11)[i]}: B x 128 fp8 values,\nthen B fp32 scales", "#dce9f5")
    note(11, 17, "pages scattered in the cache", ha="center", style="italic")

    box(27, 41, 18, 11, "TMA descriptors\nvalues [blocks, B, 128],\npage stride B x 132 bytes;\n"
        "scales [blocks, B x 33] fp32,\nNaN outside the cache", "#fff2cc")
    box(27, 24, 18, 12, "per chunk of 64 positions:\nwait empty[s];\nexpect(ready[s], bytes);\n"
        "issue the copies (64 / B\nof keys, and their scales)", "#fff2cc")
    arrow((21, 48.5), (27, 33), rad=-0.25)
    note(25.5, 38, "page ids,\n32 at a time", ha="right")
    arrow((45, 30), (50, 30))
    note(44.6, 31, "issues")

    height = 40 / stages
    for s_ in range(stages):
        y = 52 - (s_ + 1) * height
        box(50, y + 0.6, 13, height - 1.8, f"stage {s_}: keys 64 x 128\nfp8 (8 KB), 64 scales", "#dce9f5")
        note(64, y + height * 0.62, f"ready[{s_}]", color="tab:green", va="center")
        note(64, y + height * 0.28, f"empty[{s_}]", color="tab:red", va="center")
    # The copies go from the pages to the stages; the loader only issues them.
    arrow((21, 22.7), (50, 15.5), color="tab:blue", rad=0.1)
    note(27, 13.2, "TMA: the copy engine moves the bytes,\nready[s] completes once they have landed",
         color="tab:blue")

    box(74, 38, 24, 13, "wait ready[s];\nWGMMA: keys (A, 64 x 128 fp8)\nx queries (B, N x 128, in\n"
        "shared memory) -> fp32 64 x N;\narrive empty[s]", "#fde2e2")
    box(74, 19, 24, 13, "epilogue in registers:\nrelu, x weights,\nsum over heads, x scale,\n"
        "-inf past the row's length", "#fde2e2")
    arrow((70.5, 46.5), (74, 46.5), color="tab:green")
    note(71, 47.4, "full", color="tab:green")
    arrow((74, 41), (70.5, 41), color="tab:red")
    note(71, 38.6, "free", color="tab:red")
    arrow((86, 38), (86, 32))

    box(33, 1.5, 32, 6.5, "logits [B * next_n, max_model_len], fp32\n(-inf where a row may not see a position)",
        "#e8f4e0", size=7.5)
    arrow((80, 19), (65, 5), rad=-0.2)
    note(73, 9.5, "store 64 logits\na row")
    box(74, 1.5, 24, 6.5, "grid: sequences x runs of positions,\nset by the launch rule", "#f2f2f2")
    fig.tight_layout()
    return fig


# From logits to tokens: the top-k.


def bisection_plot(traces: dict[str, list[dict]], targets: dict[str, int]):
    """Each bisection of the top-k's row path (``topk.steps.bisect`` traces): the count of keys at or above each
    midpoint, halving by halving, against the count it looks for."""
    fig, axes = plt.subplots(1, len(traces), figsize=WIDE)
    for ax, (label, trace) in zip(np.atleast_1d(axes), traces.items()):
        counts = [step["count"] for step in trace]
        ax.plot(range(1, len(counts) + 1), counts, "o-")
        ax.axhline(targets[label], color="red", linestyle="--", linewidth=0.8, label=f"looks for {targets[label]}")
        ax.set_yscale("log")
        ax.set_xlabel("halving")
        ax.set_ylabel("keys >= midpoint")
        ax.set_title(label, fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def step_split_plot(rows: list[dict]):
    """The indexer's step per shape (rows of ``topk.report.summary``): our logits kernel and our top-k, timed apart,
    beside the step in one graph, ours and DeepGEMM + vLLM's top-k."""
    labels = _shape_labels(rows)
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=WIDE)
    logits = np.array([r["logits_us"] or np.nan for r in rows])
    topk = np.array([r["ours_us"] or np.nan for r in rows])
    ax.bar(x - 0.2, logits, 0.4, label="our logits kernel")
    ax.bar(x - 0.2, topk, 0.4, bottom=logits, label="our top-k")
    ax.bar(x + 0.2, [r["deepgemm_step_us"] or np.nan for r in rows], 0.4,
           label="DeepGEMM + vLLM decode_topk (one graph)", color="tab:gray")
    ax.plot(x - 0.2, [r["step_us"] or np.nan for r in rows], "k_", markersize=18, label="ours in one graph")
    ax.set_yscale("log")
    # A bar on a log axis starts at the axis' floor: put it below the shortest bar, which would otherwise vanish.
    drawn = [v for r in rows for v in (r["logits_us"], r["deepgemm_step_us"]) if v]
    ax.set_ylim(bottom=min(drawn) / 2)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("us (H200, log scale)")
    ax.set_title("The indexer's step (B/next_n/ctx)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def topk_changes_plot(rows: list[dict]):
    """Where the positions an fp8 path changes lie (rows of ``topk.report.agreement``): each dropped or added
    position's float64 logit minus the reference's 2048th, over its sum of |terms|, per precision."""
    precisions = sorted({r["precision"] for r in rows})
    fig, axes = plt.subplots(1, len(precisions), figsize=WIDE, sharey=True)
    for ax, precision in zip(np.atleast_1d(axes), precisions):
        dropped = [g for r in rows if r["precision"] == precision for g in r["gaps_dropped"]]
        added = [g for r in rows if r["precision"] == precision for g in r["gaps_added"]]
        for gaps, label in ((dropped, "dropped (above the 2048th)"), (added, "added (below it)")):
            if gaps:
                ax.hist(gaps, bins=30, alpha=0.6, label=f"{label}: {len(gaps)}")
        ax.set_xlabel("(logit - 2048th) / sum |terms|")
        ax.set_title(precision, fontsize=9)
        if dropped or added:
            ax.legend(fontsize=7)
        else:  # the exact path changes nothing
            ax.text(0.5, 0.5, "no position changed", transform=ax.transAxes, ha="center", fontsize=8)
    np.atleast_1d(axes)[0].set_ylabel("positions")
    fig.tight_layout()
    return fig


def decode_step_plot(terms: dict[str, float], title: str, measured: dict[str, float] | None = None):
    """One decode step's floor (``DecodeModel.step_seconds``, seconds) as a stacked bar, and beside it, where a run
    measured them, the indexer's kernels summed over the step's indexer layers (``measured``, seconds). An
    explorer's figure: a plain Figure."""
    fig = Figure(figsize=WIDE)
    ax = fig.subplots()
    bars = [("floor of one step", [(name, terms[name]) for name in ("weights", "indexer", "topk", "attention")])]
    if measured:
        bars.append(("indexer kernels measured\non the H200, every layer", list(measured.items())))
    for y, (_, parts) in enumerate(bars):
        left = 0.0
        for name, seconds in parts:
            ax.barh(y, 1e3 * seconds, left=left, label=f"{name}: {1e3 * seconds:.3g} ms")
            left += 1e3 * seconds
    ax.set_yticks(range(len(bars)), [label for label, _ in bars], fontsize=8)
    ax.set_xlabel("ms")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def topk_passes_plot(x: torch.Tensor, k: int, bits: int = 12, capacity: int = 960, rank_limit: int = 128):
    """The sm90 top-k's passes over one row ``x`` (as ``topk.radix.select`` models them): the histogram of its
    ``2**bits`` buckets, the positions above the threshold bucket (selected), in it (candidates) and below it; the
    coarse search for that bucket; and the candidates, settled by a radix level over their composite keys or ranked
    against each other."""
    from .topk import radix as topk_radix

    _, trace = topk_radix.select(x, k, bits=bits, capacity=capacity, rank_limit=rank_limit)
    if trace.bin < 0:
        raise ValueError(f"a row of {x.numel()} logits selects them all: give more than k = {k}")
    bucket = topk_radix.fp16_keys(x) >> (16 - bits)
    hist = torch.bincount(bucket, minlength=1 << bits).double()
    p = trace.bin
    fig, (counts, search, settle) = plt.subplots(1, 3, figsize=WIDE, gridspec_kw={"width_ratios": [1.4, 1, 1]})

    used = torch.nonzero(hist).flatten()
    lo, hi = int(used.min()), int(used.max())
    idx = np.arange(lo, hi + 1)
    colors = np.where(idx > p, "tab:green", np.where(idx == p, "tab:orange", "tab:gray"))
    counts.bar(idx, hist[lo:hi + 1].numpy(), width=1.0, color=colors)
    counts.set_yscale("log")
    counts.set_ylim(0.5, hist.max().item() * 2)  # a bucket of one position still shows
    counts.set_xlabel(f"bucket (top {bits} bits of the 16-bit key)")
    counts.set_ylabel("positions")
    counts.set_title(f"1. load and count: {x.numel()} positions", fontsize=9)
    counts.legend(handles=[Patch(color="tab:green", label=f"above: {trace.above} selected"),
                           Patch(color="tab:orange", label=f"bucket {p}: {trace.in_bin} candidates"),
                           Patch(color="tab:gray", label="below: never written")], fontsize=7, loc="upper left")

    per = (1 << bits) // 32
    coarse = hist.reshape(32, per).sum(1)
    at_or_above = coarse.flip(0).cumsum(0).flip(0).numpy()
    big = p // per
    search.bar(np.arange(32), at_or_above, color=["tab:orange" if c == big else "tab:blue" for c in range(32)])
    search.axhline(k, color="red", linestyle="--", linewidth=0.8, label=f"k = {k}")
    search.set_yscale("log")
    search.set_ylim(0.5, at_or_above.max() * 2)
    search.set_xlabel(f"coarse bin ({per} buckets each)")
    search.set_ylabel("positions at or above")
    search.set_title(f"2. threshold: coarse bin {big}, bucket {p}", fontsize=9)
    search.legend(fontsize=7)

    need = k - trace.above
    members = bucket == p
    comp = topk_radix.composite(topk_radix.fp32_keys(x[members]), torch.nonzero(members).flatten())
    if trace.levels:
        kind, s, p2, above2, in2 = trace.levels[0]
        digit, level = np.unique(((comp - comp.min()) >> s).numpy(), return_counts=True)
        settle.bar(digit, level, width=max(1.0, (digit.max() - digit.min()) / 60),
                   color=["tab:green" if d > p2 else "tab:orange" if d == p2 else "tab:gray" for d in digit])
        settle.set_xlabel(f"digit: composite key offset >> {s}")
        settle.set_title(f"3-4. radix level ({kind}): {above2} win, {in2} left", fontsize=9)
    else:
        order = comp.sort(descending=True).values
        settle.bar(np.arange(order.numel()), np.arange(order.numel()),
                   color=["tab:green" if r < need else "tab:gray" for r in range(order.numel())])
        settle.set_xlabel("candidate, by composite key")
        settle.set_title(f"3-4. {trace.ranked} candidates ranked, {need} win", fontsize=9)
    settle.set_ylabel("candidates" if trace.levels else "rank")
    fig.tight_layout()
    return fig


def topk_variants_plot(variants: list[dict], title: str):
    """The sm90 top-k's default launch and each variant one change away (rows of ``topk.report.variants``), their
    times on a linear axis from zero, each labelled with its change and its time over the default's."""
    if not variants:
        raise ValueError("variants must hold at least the default launch")
    fig, ax = plt.subplots(figsize=WIDE)
    y = np.arange(len(variants))[::-1]
    ax.barh(y, [v["us"] for v in variants], color=["tab:blue" if v["default"] else "tab:gray" for v in variants])
    for yi, v in zip(y, variants):
        ax.text(v["us"], yi, f" {v['us']:.1f} us ({v['over_default']:.2f}x)", va="center", fontsize=7)
    ax.set_yticks(y, [v["label"] for v in variants], fontsize=7)
    ax.set_xlim(0, max(v["us"] for v in variants) * 1.3)
    ax.set_xlabel("us (linear scale from zero)")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig
