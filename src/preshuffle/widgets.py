"""The workbook's sliders. Each explorer is an ``ipywidgets.interactive`` whose callback prints a report and
returns a value, so a test (or a reader) can set a control's ``.value`` and read ``.result``: no browser needed."""

from __future__ import annotations

import ipywidgets as widgets

from .layout import TILE, normal_offset, shuffle_offset
from .negotiation import format_negotiation, negotiate

MANAGER_BLOCK_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256, 320, 512, 768, 1024)
PR_STATES = ("after PR #51216", "before PR #51216")
CACHE_LINE = 128  # bytes


def show_negotiation(block_size: int = 16, platform: str = "rocm", pr: str = PR_STATES[0]):
    """Print what ``--block-size`` negotiates and which indexer kernel runs; return the Negotiation."""
    result = negotiate(block_size, platform, before_pr=pr == PR_STATES[1])
    print(format_negotiation(result))
    return result


def negotiation_explorer(block_size: int = 16, platform: str = "rocm", pr: str = PR_STATES[0]):
    """A ``--block-size`` slider with platform and before/after toggles."""
    return widgets.interactive(
        show_negotiation,
        block_size=widgets.SelectionSlider(options=MANAGER_BLOCK_SIZES, value=block_size,
                                           description="--block-size", continuous_update=False),
        platform=widgets.ToggleButtons(options=["rocm", "cuda"], value=platform, description="platform"),
        pr=widgets.ToggleButtons(options=list(PR_STATES), value=pr, description="vLLM"),
    )


def lane_vector(token: int, dim: int, block_size: int, head_dim: int = 128) -> dict:
    """Where value (token, dim) sits in both layouts, and what one 16-byte load around it holds.

    A matrix-unit lane loads the 16 K-dim values of one token (dims ``d0 .. d0+15``). Sixteen lanes load the
    same dims of 16 consecutive tokens: one contiguous 256-byte run in the SHUFFLE layout, 16 runs 128 bytes
    apart (one per token row) in the NORMAL layout."""
    d0 = dim - dim % TILE
    t0 = token - token % TILE
    report = {"token": token, "dim": dim, "block_size": block_size, "lane_dims": (d0, d0 + TILE - 1)}
    for name, offset in (("normal", normal_offset), ("shuffle", shuffle_offset)):
        first = offset(token, d0, block_size, head_dim)
        group = sorted(offset(t, d, block_size, head_dim) for t in range(t0, t0 + TILE) for d in range(d0, d0 + TILE))
        lines = {o // CACHE_LINE for o in group}
        report[name] = {
            "offset": offset(token, dim, block_size, head_dim),
            "vector": (first, first + TILE - 1),
            "group_contiguous": group == list(range(group[0], group[0] + TILE * TILE)),
            "group_lines": len(lines),
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
    report = lane_vector(min(token, block_size - 1), dim, block_size)
    print(format_lane_vector(report))
    return report


def layout_explorer(block_size: int = 16, token: int = 3, dim: int = 37):
    """Block size (multiples of 16), token and dim sliders; the token slider follows the block size."""
    size = widgets.SelectionSlider(options=list(range(16, 257, 16)), value=block_size, description="block size",
                                   continuous_update=False)
    tok = widgets.IntSlider(min=0, max=block_size - 1, value=token, description="token", continuous_update=False)
    d = widgets.IntSlider(min=0, max=127, value=dim, description="dim", continuous_update=False)

    def follow(change):
        tok.max = change["new"] - 1

    size.observe(follow, names="value")
    return widgets.interactive(show_lane_vector, block_size=size, token=tok, dim=d)
