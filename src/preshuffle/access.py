"""What one chunk of positions costs the memory system in each cache layout, counted, not timed."""

from __future__ import annotations

from .arguments import positive_int
from .cache import SCALE_BYTES
from .layout import check_block_layout
from .shapes import VARIANTS


def chunk_accesses(block_size: int, layout: str = "normal", chunk: int = 64, head_dim: int = 128) -> dict:
    """For ``chunk`` consecutive positions of one sequence whose pages are scattered at random:
    block-table reads, separate contiguous runs of key bytes and their length, the widest aligned load the
    addresses allow, and the separate scale runs."""
    block_size, chunk, head_dim = (positive_int(v, name) for v, name in (
        (block_size, "block_size"), (chunk, "chunk"), (head_dim, "head_dim")))
    check_block_layout(block_size, head_dim, layout)
    token_bytes = head_dim + SCALE_BYTES
    blocks = -(-chunk // block_size)
    tokens_per_block = min(block_size, chunk)
    # A block starts at page * block_size * 132 bytes: 16-byte aligned exactly when 16 divides that stride.
    stride = block_size * token_bytes
    align = 16 if stride % 16 == 0 else 8 if stride % 8 == 0 else 4
    run = tokens_per_block * head_dim
    return {
        "table_reads": blocks,
        "key_runs": blocks,
        "key_run_bytes": run,
        "widest_aligned_load": align,
        "scale_runs": blocks,
        "scale_run_bytes": tokens_per_block * SCALE_BYTES,
        # 16 lanes of a matrix-unit operand load: 16 tokens x 16 dims.
        "lines_per_16x16_tile": 2 if layout == "shuffle" else 16,  # natural: every token row is its own line
    }


def format_accesses(chunk: int = 64) -> str:
    header = (f"{'variant':20s} {'table reads':>11s} {'key runs':>8s} {'bytes/run':>9s} {'widest load':>11s} "
              f"{'scale runs':>10s} {'128B lines per 16x16 tile':>26s}")
    lines = [f"one chunk of {chunk} positions, pages scattered at random", header, "-" * len(header)]
    for name, (block_size, layout) in VARIANTS.items():
        a = chunk_accesses(block_size, layout, chunk)
        lines.append(f"{name:20s} {a['table_reads']:11d} {a['key_runs']:8d} {a['key_run_bytes']:9d} "
                     f"{a['widest_aligned_load']:9d} B {a['scale_runs']:10d} {a['lines_per_16x16_tile']:26d}")
    return "\n".join(lines)
