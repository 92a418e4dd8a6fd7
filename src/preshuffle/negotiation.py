"""Kernel block-size negotiation, modelled on vLLM's v1 engine.

Two block sizes meet here. The KV-cache manager allocates pages of ``--block-size`` tokens (the
*manager* size); attention kernels see pages of the *kernel* size, which must divide it. Every backend
of one KV-cache group declares the kernel sizes it accepts, and :func:`select_common_block_size`
picks one they all accept. vLLM PR #51216 changed the ROCm declarations of the DeepSeek-V3.2 sparse
indexer and sparse MLA backends from ``[1, 64]`` to ``[1, MultipleOf(16)]``, so that ``--block-size 16``
negotiates 16 (preshuffled AITER kernel) instead of 1 (per-token paging).

Differences from vLLM, all on inputs vLLM does not validate: block sizes must be positive ints
(``TypeError``/``ValueError`` instead of a silent answer for 0 or a float); backends must be classes with
``get_supported_kernel_block_sizes()``, and their int and ``MultipleOf`` entries positive (vLLM returns -16 for a
declared ``[-16]`` and divides by zero on ``[0]``), with errors that name the backend; and :class:`MultipleOf` has
a readable repr and structural equality (vLLM's compares by identity). Entries of any other type raise vLLM's
"Unknown supported size" when the search reaches them, as in vLLM, with the backend's name added.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np

from .arguments import positive_int
from .paging import block_slots, integers

PLATFORMS = ("cuda", "rocm")

# AITER's paged-MQA-logits kernel processes the context in chunks of this many tokens.
AITER_CHUNK_K = 256


class MultipleOf:
    """A kernel block size declaration meaning "any multiple of ``base``"."""

    def __init__(self, base: int):
        self.base = positive_int(base, "base")

    def __repr__(self) -> str:
        return f"MultipleOf({self.base})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MultipleOf) and other.base == self.base

    def __hash__(self) -> int:
        return hash(("MultipleOf", self.base))


# --------------------------------------------------------------------------------------------------
# The platform, read at call time so tests can flip it exactly as vLLM's do (monkeypatch is_rocm). Its name lives in
# a context variable, not in the object: each thread (a notebook kernel runs widget callbacks on threads) and each
# asyncio task sees the platform it set itself, and none sees another's.

_PLATFORM: contextvars.ContextVar[str] = contextvars.ContextVar("platform", default="cuda")


class Platform:
    """vLLM's ``current_platform``: which platform the calling context runs on (:func:`use_platform` sets it)."""

    @property
    def name(self) -> str:
        return _PLATFORM.get()

    def is_rocm(self) -> bool:
        return self.name == "rocm"

    def __repr__(self) -> str:
        return f"Platform({self.name!r})"


current_platform = Platform()


def check_platform(name) -> str:
    if name not in PLATFORMS:
        raise ValueError(f"platform must be one of {PLATFORMS}, got {name!r}")
    return name


@contextlib.contextmanager
def use_platform(name: str) -> Iterator[Platform]:
    """Make :data:`current_platform` report ``name`` ("cuda" or "rocm") inside the block, in this thread (or task)
    only."""
    token = _PLATFORM.set(check_platform(name))
    try:
        yield current_platform
    finally:
        _PLATFORM.reset(token)


# --------------------------------------------------------------------------------------------------
# Backends: only their kernel block-size declarations matter here.


class AttentionBackend:
    @staticmethod
    def get_supported_kernel_block_sizes() -> list:
        return [MultipleOf(1)]


class DeepseekV32IndexerBackend(AttentionBackend):
    """The sparse "lightning indexer" of DeepSeek-V3.2, as declared after PR #51216."""

    @staticmethod
    def get_supported_kernel_block_sizes() -> list:
        if current_platform.is_rocm():
            return [1, MultipleOf(16)]
        return [64]


class ROCMAiterMLASparseBackend(AttentionBackend):
    """AITER's sparse MLA attention (ROCm only), as declared after PR #51216."""

    @staticmethod
    def get_supported_kernel_block_sizes() -> list:
        return [1, MultipleOf(16)]


class DeepseekV32IndexerBackendBeforePR(DeepseekV32IndexerBackend):
    """The indexer's declaration before PR #51216: 16 was not accepted on ROCm."""

    @staticmethod
    def get_supported_kernel_block_sizes() -> list:
        if current_platform.is_rocm():
            return [1, 64]
        return [64]


class ROCMAiterMLASparseBackendBeforePR(ROCMAiterMLASparseBackend):
    """AITER sparse MLA before PR #51216."""

    @staticmethod
    def get_supported_kernel_block_sizes() -> list:
        return [1, 64]


class FlashMLASparseBackend(AttentionBackend):
    @staticmethod
    def get_supported_kernel_block_sizes() -> list:
        return [64]


def sparse_mla_group(*, before_pr: bool = False) -> list[type]:
    """The backends sharing the DeepSeek-V3.2 KV-cache group on the current platform."""
    if current_platform.is_rocm():
        if before_pr:
            return [DeepseekV32IndexerBackendBeforePR, ROCMAiterMLASparseBackendBeforePR]
        return [DeepseekV32IndexerBackend, ROCMAiterMLASparseBackend]
    return [DeepseekV32IndexerBackendBeforePR if before_pr else DeepseekV32IndexerBackend, FlashMLASparseBackend]


# --------------------------------------------------------------------------------------------------
# The algorithm.


def _declaration(backend) -> list:
    """The backend's declared kernel block sizes, its int and MultipleOf entries checked (entries of other types
    are left for :func:`matching_entry` to refuse when reached, as vLLM does)."""
    if not isinstance(backend, type) or not callable(getattr(backend, "get_supported_kernel_block_sizes", None)):
        raise TypeError(f"a backend must be a class with get_supported_kernel_block_sizes(), got {backend!r}")
    entries = backend.get_supported_kernel_block_sizes()
    if not isinstance(entries, (list, tuple)):
        raise TypeError(f"{backend.__name__}.get_supported_kernel_block_sizes() must return a list, "
                        f"got {type(entries).__name__}")
    for entry in entries:
        if not isinstance(entry, (int, MultipleOf)):
            continue
        size = entry.base if isinstance(entry, MultipleOf) else entry
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"{backend.__name__} declares {entry!r}: entries must be positive ints or "
                             f"MultipleOf(a positive int)")
    return list(entries)


def matching_entry(entries: list, block_size: int, declared_by: str = "a backend") -> int | None:
    """Index of the first entry of a declaration that accepts ``block_size`` (vLLM's first match), or None."""
    for i, entry in enumerate(entries):
        if isinstance(entry, int):
            if block_size == entry:
                return i
        elif isinstance(entry, MultipleOf):
            if block_size % entry.base == 0:
                return i
        else:
            raise ValueError(f"Unknown supported size: {entry!r} (declared by {declared_by}; entries must be int or "
                             f"MultipleOf, not {type(entry).__module__}.{type(entry).__qualname__})")
    return None


def block_size_is_supported(backend: type, block_size: int) -> bool:
    """True when some entry of the backend's declaration matches ``block_size`` (first match wins)."""
    entries = _declaration(backend)
    return matching_entry(entries, positive_int(block_size, "block_size"), backend.__name__) is not None


def select_common_block_size(kv_manager_block_size: int, backends: Sequence[type]) -> int:
    """The kernel block size every backend accepts: the manager size itself, else the largest int entry
    that divides it and every backend accepts.

    Why int entries are the only candidates needed: a backend that rejects the manager size M cannot
    accept a divisor d of M through ``MultipleOf(n)``, since ``n | d`` and ``d | M`` give ``n | M``. So any
    common divisor below M is accepted by that backend as an exact int entry, and trying the int entries
    largest first finds the largest common divisor of M.
    """
    kv_manager_block_size = positive_int(kv_manager_block_size, "kv_manager_block_size")
    if isinstance(backends, (type, str)) or not isinstance(backends, Iterable):
        raise TypeError(f"backends must be a list of backend classes, got {backends!r}")
    declared = [(_declaration(backend), backend.__name__) for backend in backends]

    def common(size: int) -> bool:
        return all(matching_entry(entries, size, name) is not None for entries, name in declared)

    if common(kv_manager_block_size):
        return kv_manager_block_size
    int_sizes = {e for entries, _ in declared for e in entries if isinstance(e, int)}
    for size in sorted(int_sizes, reverse=True):
        if kv_manager_block_size % size == 0 and common(size):
            return size
    raise ValueError(f"No common block size for {kv_manager_block_size}. ")


def kernel_blocks_per_manager_block(kv_manager_block_size: int, kernel_block_size: int) -> int:
    kv_manager_block_size = positive_int(kv_manager_block_size, "kv_manager_block_size")
    kernel_block_size = positive_int(kernel_block_size, "kernel_block_size")
    if kv_manager_block_size % kernel_block_size:
        raise ValueError(
            f"kernel_block_size {kernel_block_size} must divide kv_manager_block_size size "
            f"{kv_manager_block_size} evenly"
        )
    return kv_manager_block_size // kernel_block_size


def map_to_kernel_blocks(ids, blocks_per_kv_block: int) -> np.ndarray:
    """Manager block ids -> kernel block ids: id m becomes m*r, ..., m*r + r-1, flattened in order."""
    r = positive_int(blocks_per_kv_block, "blocks_per_kv_block")
    ids = integers(ids, "ids").reshape(-1)
    if (ids < 0).any():
        raise ValueError(f"ids must be non-negative block ids, got {ids[ids < 0][:4].tolist()}")
    return block_slots(ids[:, None], r, np.arange(r), "ids", "blocks_per_kv_block").reshape(-1)


# --------------------------------------------------------------------------------------------------
# Which indexer kernel runs for a negotiated kernel block size.


@dataclass(frozen=True)
class IndexerKernel:
    name: str
    kv_block_size: int
    preshuffled: bool
    accepted: bool
    reason: str


def indexer_kernel(kernel_block_size: int, platform: str | None = None) -> IndexerKernel:
    """The paged-MQA-logits kernel vLLM calls for this kernel block size, and whether it accepts it.

    ROCm: AITER with ``KVBlockSize = kernel_block_size`` and ``Preshuffle = KVBlockSize > 1`` (the cache
    writer shuffles exactly then); AITER asserts ``KVBlockSize % 16 == 0`` when preshuffling and that
    ``ChunkK = 256`` and ``KVBlockSize`` divide one another. CUDA: DeepGEMM, natural layout, block 64.
    ``platform`` None: :data:`current_platform`'s.
    """
    size = positive_int(kernel_block_size, "kernel_block_size")
    platform = check_platform(current_platform.name if platform is None else platform)
    if platform == "cuda":
        ok = size == 64
        return IndexerKernel("DeepGEMM fp8_paged_mqa_logits", size, False, ok,
                             "block 64" if ok else "DeepGEMM's paged kernel is used with block 64")
    preshuffled = size > 1
    if preshuffled and size % 16:
        return IndexerKernel("AITER paged MQA (preshuffled)", size, True, False,
                             f"KVBlockSize {size} is not a multiple of 16")
    if AITER_CHUNK_K % size and size % AITER_CHUNK_K:
        return IndexerKernel("AITER paged MQA (preshuffled)", size, preshuffled, False,
                             f"ChunkK {AITER_CHUNK_K} and KVBlockSize {size} do not divide one another")
    if not preshuffled:
        return IndexerKernel("AITER paged MQA (per-token, no preshuffle)", size, False, True, "block size 1")
    return IndexerKernel("AITER paged MQA (preshuffled)", size, True, True, "preshuffled 16x16 tiles")


@dataclass(frozen=True)
class Negotiation:
    """What one ``--block-size`` turns into, end to end."""

    platform: str
    before_pr: bool
    manager_block_size: int
    declarations: dict
    kernel_block_size: int | None
    error: str | None
    kernel: IndexerKernel | None

    @property
    def blocks_per_manager_block(self) -> int | None:
        if self.kernel_block_size is None:
            return None
        return self.manager_block_size // self.kernel_block_size


def negotiate(manager_block_size: int, platform: str = "rocm", *, before_pr: bool = False) -> Negotiation:
    """Run the DeepSeek-V3.2 sparse-MLA group's negotiation and the indexer dispatch for one block size."""
    manager_block_size = positive_int(manager_block_size, "manager_block_size")
    if not isinstance(before_pr, (bool, np.bool_)):
        raise TypeError(f"before_pr must be a bool, got {type(before_pr).__name__} {before_pr!r}")
    with use_platform(platform):
        group = sparse_mla_group(before_pr=before_pr)
        declarations = {b.__name__: b.get_supported_kernel_block_sizes() for b in group}
        try:
            size = select_common_block_size(manager_block_size, group)
        except ValueError as exc:
            return Negotiation(platform, before_pr, manager_block_size, declarations, None, str(exc), None)
        return Negotiation(platform, before_pr, manager_block_size, declarations, size, None,
                           indexer_kernel(size, platform))


DEFAULT_SWEEP = (1, 8, *range(16, 1025, 16))


def sweep(manager_block_sizes: Sequence[int] = DEFAULT_SWEEP, platform: str = "rocm") -> list[dict]:
    """Before and after PR #51216, for each manager block size: negotiated size, kernel, and acceptance."""
    if isinstance(manager_block_sizes, str) or not isinstance(manager_block_sizes, Iterable):
        raise TypeError(f"manager_block_sizes must be a sequence of ints, got {type(manager_block_sizes).__name__} "
                        f"{manager_block_sizes!r}")
    rows = []
    for m in manager_block_sizes:
        before, after = (negotiate(m, platform, before_pr=flag) for flag in (True, False))
        rows.append({
            "manager_block_size": m,
            "before_kernel_block_size": before.kernel_block_size,
            "before_preshuffled": bool(before.kernel and before.kernel.preshuffled),
            "after_kernel_block_size": after.kernel_block_size,
            "after_preshuffled": bool(after.kernel and after.kernel.preshuffled),
            "after_accepted": bool(after.kernel and after.kernel.accepted),
            "after_reason": after.kernel.reason if after.kernel else after.error,
        })
    return rows


def rejected_rows(rows: list[dict]) -> list[int]:
    """The manager sizes of sweep rows that negotiate after the PR but that AITER's kernel would assert on."""
    return [r["manager_block_size"] for r in rows if r["after_kernel_block_size"] is not None and not r["after_accepted"]]


def rejected_after_pr(manager_block_sizes: Sequence[int] = DEFAULT_SWEEP, platform: str = "rocm") -> list[int]:
    """Manager sizes that negotiate after the PR but whose kernel size AITER's kernel would assert on."""
    return rejected_rows(sweep(manager_block_sizes, platform))


def format_negotiation(n: Negotiation) -> str:
    when = "before PR #51216" if n.before_pr else "after PR #51216"
    lines = [f"--block-size {n.manager_block_size} on {n.platform}, {when}"]
    for name, decl in n.declarations.items():
        lines.append(f"  {name}: {decl}")
    if n.error:
        lines.append(f"  negotiation fails: {n.error.strip()}")
        return "\n".join(lines)
    lines.append(f"  kernel block size: {n.kernel_block_size} "
                 f"({n.blocks_per_manager_block} kernel blocks per manager block)")
    k = n.kernel
    lines.append(f"  indexer kernel: {k.name}, KVBlockSize={k.kv_block_size}, preshuffled={k.preshuffled}")
    lines.append(f"  kernel accepts it: {'yes' if k.accepted else 'NO'} ({k.reason})")
    return "\n".join(lines)


def format_sweep(rows: list[dict]) -> str:
    def cell(size, shuffled):
        return "error" if size is None else f"{size}{' (shuffled)' if shuffled else ''}"

    header = f"{'--block-size':>12} | {'before PR':>15} | {'after PR':>15} | AITER accepts (after)"
    lines = [header, "-" * len(header)]
    for r in rows:
        ok = r["after_reason"] if r["after_accepted"] else f"NO: {r['after_reason']}"
        lines.append(f"{r['manager_block_size']:>12} | {cell(r['before_kernel_block_size'], r['before_preshuffled']):>15}"
                     f" | {cell(r['after_kernel_block_size'], r['after_preshuffled']):>15} | {ok}")
    return "\n".join(lines)
