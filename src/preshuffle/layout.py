"""Where each fp8 value of a K-cache block lives: the NORMAL and the preshuffled (SHUFFLE) layouts.

A block of ``B`` tokens holds ``B * D`` value bytes followed by ``B`` fp32 scales. NORMAL puts value
(t, d) at byte ``t*D + d``. SHUFFLE cuts the block into 16-token x 16-dim tiles and stores each tile's
16 bytes of one token contiguously, tile after tile along the head dimension::

    offset(t, d) = (t // 16) * 16*D + (d // 16) * 256 + (t % 16) * 16 + (d % 16)

so one 16-byte load gives one matrix-unit lane the 16 K-dim values of one token, and 16 lanes read one
contiguous 256-byte run (in the MFMA operand layout AITER's kernel loads: docs/layout.md). The scales are never
shuffled.
"""

from __future__ import annotations

import torch

from .arguments import int_in_range, positive_int

LAYOUTS = ("normal", "shuffle")
TILE = 16  # tokens and dims per MFMA tile


def check_block_layout(block_size: int, head_dim: int, layout: str) -> None:
    """Refuse a ``layout`` not in :data:`LAYOUTS`, and the shuffle layout for a block whose sizes are not multiples
    of 16 (only then is the shuffled formula a permutation of the block)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "shuffle":
        if block_size % TILE:
            raise ValueError(f"block_size must be a multiple of {TILE} for the shuffle layout, got {block_size}")
        if head_dim % TILE:
            raise ValueError(f"head_dim must be a multiple of {TILE} for the shuffle layout, got {head_dim}")


def _block_dims(block_size, head_dim) -> tuple[int, int]:
    return positive_int(block_size, "block_size"), positive_int(head_dim, "head_dim")


def _check_position(token, dim, block_size, head_dim) -> tuple[int, int, int, int]:
    block_size, head_dim = _block_dims(block_size, head_dim)
    return int_in_range(token, "token", 0, block_size), int_in_range(dim, "dim", 0, head_dim), block_size, head_dim


def _offset(token, dim, head_dim: int, layout: str):
    """The byte offset of value (token, dim) in ``layout``, for ints or broadcasting int tensors alike."""
    if layout == "normal":
        return token * head_dim + dim
    return (token // TILE) * TILE * head_dim + (dim // TILE) * TILE * TILE + (token % TILE) * TILE + dim % TILE


def normal_offset(token: int, dim: int, block_size: int, head_dim: int = 128) -> int:
    """Byte offset of value (token, dim) inside a NORMAL block."""
    token, dim, block_size, head_dim = _check_position(token, dim, block_size, head_dim)
    return _offset(token, dim, head_dim, "normal")


def shuffle_offset(token: int, dim: int, block_size: int, head_dim: int = 128) -> int:
    """Byte offset of value (token, dim) inside a SHUFFLE block."""
    token, dim, block_size, head_dim = _check_position(token, dim, block_size, head_dim)
    check_block_layout(block_size, head_dim, "shuffle")
    return _offset(token, dim, head_dim, "shuffle")


def offset_map(block_size: int, head_dim: int = 128, layout: str = "normal") -> torch.Tensor:
    """int64 ``[block_size, head_dim]``: the byte offset of every value of a block in ``layout``."""
    block_size, head_dim = _block_dims(block_size, head_dim)
    check_block_layout(block_size, head_dim, layout)
    return _offset(torch.arange(block_size).unsqueeze(1), torch.arange(head_dim).unsqueeze(0), head_dim, layout)


def _check_values(values: torch.Tensor) -> None:
    if not isinstance(values, torch.Tensor) or values.dim() < 2:
        raise TypeError("values must be a tensor of shape [..., block_size, head_dim]")


def preshuffle(values: torch.Tensor) -> torch.Tensor:
    """Natural ``[..., B, D]`` block values -> the same values in SHUFFLE byte order, flat ``[..., B*D]``."""
    _check_values(values)
    *lead, block_size, head_dim = values.shape
    offsets = offset_map(block_size, head_dim, "shuffle").to(values.device).reshape(-1)
    out = torch.empty((*lead, block_size * head_dim), dtype=values.dtype, device=values.device)
    out[..., offsets] = values.reshape(*lead, -1)
    return out


def unshuffle(flat: torch.Tensor, block_size: int, head_dim: int = 128) -> torch.Tensor:
    """Inverse of :func:`preshuffle`: flat SHUFFLE bytes ``[..., B*D]`` -> natural ``[..., B, D]``."""
    if not isinstance(flat, torch.Tensor):
        raise TypeError(f"flat must be a tensor [..., block_size*head_dim], got {type(flat).__name__}")
    block_size, head_dim = _block_dims(block_size, head_dim)
    if flat.shape[-1] != block_size * head_dim:
        raise ValueError(f"flat must end in block_size*head_dim = {block_size * head_dim}, got {flat.shape[-1]}")
    offsets = offset_map(block_size, head_dim, "shuffle").to(flat.device)
    return flat[..., offsets]
