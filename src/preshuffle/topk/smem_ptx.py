"""Shared-memory atomics, loads and stores, warp-aggregated counters and thread-block-cluster operations for Gluon
kernels, as inline PTX: what Triton's languages do not expose (``tl`` and Gluon have no shared-memory atomics, and
Gluon no distributed shared memory).

Addresses are int32 word offsets into the kernel's dynamic shared memory, ``global_smem``, the symbol Triton's
NVIDIA backend gives it. A kernel using these helpers must hold exactly one shared-memory allocation, live from start
to end, and let Triton allocate nothing else (no cross-warp reduction, scan or layout conversion through shared
memory), so that the allocation starts at word 0; :func:`check_single_allocation` checks a compiled kernel for it.

Each helper is elementwise: it takes tensors (or scalars) and runs once per element, in every thread that holds the
element. The warp-aggregated ones (:func:`warp_slot`, :func:`cluster_warp_slot`) shuffle across lanes: every lane of
a warp must run them together, each on one value (a tensor with one element a thread). Nothing here is pure, so the
compiler keeps these accesses in program order with the barriers around them."""

from __future__ import annotations

from triton.experimental import gluon
from triton.experimental.gluon import language as gl

_ADDR = "mov.u32 a, global_smem; mad.lo.u32 a, {word}, 4, a;"
_REMOTE = _ADDR + " mapa.shared::cluster.u32 a, a, {rank};"


def _at(op: str, remote: bool = False) -> gl.constexpr:
    """PTX running ``op [a], $3`` where $2 is non-zero, ``a`` the word $1 (of the CTA ranked $4 in the cluster)."""
    addr = _REMOTE.format(word="$1", rank="$4") if remote else _ADDR.format(word="$1")
    return gl.constexpr("{ .reg .pred p; .reg .u32 a; setp.ne.u32 p, $2, 0; " + addr
                        + f" @p {op} [a], $3; mov.u32 $0, 0; }}")


_RED_ADD = _at("red.shared.add.u32")
_RED_INC = gl.constexpr("{ .reg .u32 a; " + _ADDR.format(word="$1") + " red.shared.add.u32 [a], 1; mov.u32 $0, 0; }")
_RED_MIN = _at("red.shared.min.s32")
_RED_MAX = _at("red.shared.max.s32")
_STORE = _at("st.shared.u32")
_CLUSTER_STORE = _at("st.shared::cluster.u32", remote=True)
_LOAD = gl.constexpr("{ .reg .u32 a; " + _ADDR.format(word="$1") + " ld.shared.u32 $0, [a]; }")
_LOAD4 = gl.constexpr("{ .reg .u32 a; " + _ADDR.format(word="$4") + " ld.shared.v4.u32 {$0, $1, $2, $3}, [a]; }")
_CLUSTER_LOAD = gl.constexpr("{ .reg .u32 a; " + _REMOTE.format(word="$1", rank="$2")
                             + " ld.shared::cluster.u32 $0, [a]; }")
# An inclusive scan of $2 across the warp's lanes (s), the warp's total (t), and one atomic add of it by lane 31
# (into b); each lane gets the old value plus the lanes before it. Every lane of the warp must run it.
_WARP_SCAN = ("{ .reg .pred q; .reg .u32 a, s, t, l, b; mov.u32 s, $2; "
              "shfl.sync.up.b32 t|q, s, 1, 0, -1; @q add.u32 s, s, t; "
              "shfl.sync.up.b32 t|q, s, 2, 0, -1; @q add.u32 s, s, t; "
              "shfl.sync.up.b32 t|q, s, 4, 0, -1; @q add.u32 s, s, t; "
              "shfl.sync.up.b32 t|q, s, 8, 0, -1; @q add.u32 s, s, t; "
              "shfl.sync.up.b32 t|q, s, 16, 0, -1; @q add.u32 s, s, t; "
              "shfl.sync.idx.b32 t, s, 31, 31, -1; "
              "mov.u32 l, %laneid; setp.eq.u32 q, l, 31; setp.ne.and.u32 q, t, 0, q; mov.u32 b, 0; ")
_WARP_TAIL = " shfl.sync.idx.b32 b, b, 31, 31, -1; sub.u32 s, s, $2; add.u32 $0, b, s; }"
_WARP_SLOT = gl.constexpr(_WARP_SCAN + _ADDR.format(word="$1") + " @q atom.shared.add.u32 b, [a], t;" + _WARP_TAIL)
_CLUSTER_WARP_SLOT = gl.constexpr(_WARP_SCAN + _REMOTE.format(word="$1", rank="$3")
                                  + " @q atom.shared::cluster.add.u32 b, [a], t;" + _WARP_TAIL)
_CLUSTER_SYNC = gl.constexpr("barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; "
                             "mov.u32 $0, 0;")
_FP16_KEYS = gl.constexpr("{ .reg .f32 x, y; max.f32 x, $1, 0fFF800000; add.rn.f32 x, x, 0f00000000; "
                          "max.f32 y, $2, 0fFF800000; add.rn.f32 y, y, 0f00000000; cvt.rn.f16x2.f32 $0, y, x; }")


def check_single_allocation(compiled, words: int) -> None:
    """Raise unless the compiled kernel's shared memory is exactly its one buffer of ``words`` int32 words (so the
    buffer starts at ``global_smem``, where these helpers address it)."""
    if compiled.metadata.shared != 4 * words:
        raise RuntimeError(f"{compiled.metadata.name}: {compiled.metadata.shared} bytes of shared memory for a buffer "
                           f"of {4 * words}: Triton allocated scratch beside it, so the buffer's offset is unknown")


@gluon.jit
def red_add(word, value, pred):
    """``smem[word] += value`` where ``pred``."""
    gl.inline_asm_elementwise(
        _RED_ADD,
        "=r,r,r,r", [word, pred.to(gl.int32), value], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def red_inc(word):
    """``smem[word] += 1``."""
    gl.inline_asm_elementwise(_RED_INC, "=r,r", [word], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def red_min(word, value, pred):
    """``smem[word] = min(smem[word], value)`` (signed) where ``pred``."""
    gl.inline_asm_elementwise(
        _RED_MIN,
        "=r,r,r,r", [word, pred.to(gl.int32), value], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def red_max(word, value, pred):
    """``smem[word] = max(smem[word], value)`` (signed) where ``pred``."""
    gl.inline_asm_elementwise(
        _RED_MAX,
        "=r,r,r,r", [word, pred.to(gl.int32), value], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def load(word):
    """``smem[word]``."""
    return gl.inline_asm_elementwise(
        _LOAD, "=r,r", [word], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def load4(word):
    """``smem[word : word + 4]`` (``word`` a multiple of 4), as four values."""
    return gl.inline_asm_elementwise(
        _LOAD4, "=r,=r,=r,=r,r", [word], dtype=(gl.int32, gl.int32, gl.int32, gl.int32), is_pure=False, pack=1)


@gluon.jit
def store(word, value, pred):
    """``smem[word] = value`` where ``pred``."""
    gl.inline_asm_elementwise(
        _STORE,
        "=r,r,r,r", [word, pred.to(gl.int32), value], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def warp_slot(word, value):
    """Add every lane's ``value`` to ``smem[word]`` with one atomic a warp; return, to each lane, the counter's value
    before its own addition (the old value plus the values of the lanes below it)."""
    return gl.inline_asm_elementwise(
        _WARP_SLOT,
        "=r,r,r", [word, value], dtype=gl.int32, is_pure=False, pack=1)


# ------------------------------------------------------------------------------------------------------------------
# Thread-block clusters (sm90): another CTA's shared memory, by its rank in the cluster.


@gluon.jit
def cluster_sync():
    """Every thread of every CTA of the cluster arrives, then waits: shared-memory writes before it (local or
    remote) are visible to every CTA of the cluster after it. Every thread must run it."""
    gl.inline_asm_elementwise(
        _CLUSTER_SYNC, "=r,r", [gl.to_tensor(0)], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def cluster_load(word, rank):
    """``smem[word]`` of the cluster's CTA ``rank``."""
    return gl.inline_asm_elementwise(
        _CLUSTER_LOAD, "=r,r,r", [word, rank], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def cluster_store(word, value, pred, rank):
    """``smem[word] = value`` in the cluster's CTA ``rank``, where ``pred``."""
    gl.inline_asm_elementwise(
        _CLUSTER_STORE,
        "=r,r,r,r,r", [word, pred.to(gl.int32), value, rank], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def cluster_warp_slot(word, value, rank):
    """:func:`warp_slot` on the counter ``smem[word]`` of the cluster's CTA ``rank``."""
    return gl.inline_asm_elementwise(
        _CLUSTER_WARP_SLOT,
        "=r,r,r,r", [word, value, rank], dtype=gl.int32, is_pure=False, pack=1)


# ------------------------------------------------------------------------------------------------------------------
# Registers


@gluon.jit
def thread_index():
    """The thread's index in its CTA (a scalar that differs between threads: branch on it only around code that
    neither synchronises nor exchanges data across warps)."""
    return gl.inline_asm_elementwise("mov.u32 $0, %tid.x;", "=r,r", [gl.to_tensor(0)], dtype=gl.int32,
                                     is_pure=False, pack=1)


@gluon.jit
def bit_length64(value):
    """The number of significant bits of the unsigned 64-bit ``value`` (0 for 0)."""
    return gl.inline_asm_elementwise("{ .reg .u32 z; clz.b64 z, $1; sub.u32 $0, 64, z; }", "=r,l", [value],
                                     dtype=gl.int32, is_pure=True, pack=1)


@gluon.jit
def fp16_keys(a, b):
    """Two fp32 values' 16-bit order keys, packed (``a``'s in the low half): each value rounded to fp16 (overflowing
    to infinity), NaN taken as -inf and -0.0 as +0.0 first, the halves' bits then mapped so that unsigned order is
    the values' order. Rounding never reverses two values, so the keys order as the values do, with ties."""
    w = gl.inline_asm_elementwise(
        _FP16_KEYS,
        "=r,r,r", [a, b], dtype=gl.int32, is_pure=True, pack=1)
    # A negative half (sign bit set) flips its 15 low bits, then both sign bits flip: positive h -> h | 0x8000,
    # negative h -> ~h (16 bits).
    return w ^ (((w >> 15) & 0x00010001) * 0x7FFF) ^ -2147450880  # 0x80008000 as an int32
