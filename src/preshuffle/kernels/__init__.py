"""The FP8 paged-MQA-logits kernels behind one entry point, :func:`fp8_paged_mqa_logits`: the portable Triton kernel
(:mod:`.portable`, every GPU Triton compiles fp8 for, and the CPU through Triton's interpreter), the Hopper kernel
(:mod:`.hopper`, Gluon: TMA, mbarriers, WGMMA) and the launch its unchecked repeats go through
(:mod:`.preset_launch`), their launch rules (:mod:`.launch`), and the table of what each takes, which dispatch reads
(:mod:`.backends`)."""

from __future__ import annotations

import torch

from .. import device
from ..arguments import positive_int
from ..contract import byte_span, check_inputs, check_output_options, output_tensor, refuse_overlap
from ..internals import tensor_guard
from .backends import choose
from .launch import HopperConfig, LaunchConfig

__all__ = ["HopperConfig", "LaunchConfig", "fp8_paged_mqa_logits", "kernel_for"]

# Launches for unchecked calls, by the cache's address and the call's scalars, each with a guard
# over its tensors (dtype, device, sizes, strides: everything else Triton's specialisation and the call's checks
# depend on, but 16-byte alignment, which the call checks itself). A launch holds the cache's TMA descriptors, not
# the cache. The guard is the C++ check torch.compile guards its graphs with: reading those attributes in Python
# cost 2.2 us a call on the H200's host (docs/kernel-design.md, "Designs tried").
_LAUNCHES: dict = {}
_MAX_LAUNCHES = 64


class _Kept:
    """A launch kept for unchecked calls: its guard over the tensors of the call that compiled it, one zero of the
    output's type broadcast to the output's shape (``torch.empty_like`` of it is a new output: 1.8-2.1 us of host
    time on the H200's host against 2.5 for ``torch.empty`` with the sizes; docs/kernel-design.md, "Designs tried"),
    the output's row stride, which the launch holds, and the byte spans an ``out`` must not overlap: the cache's, and
    the lengths of the other inputs' (the guard fixes their sizes)."""

    __slots__ = ("guard", "launch", "output", "row_stride", "cache_span", "lengths", "out_bytes")

    def __init__(self, guard, launch, output: torch.Tensor, row_stride: int, kv_cache: torch.Tensor, inputs: tuple):
        self.guard, self.launch, self.output, self.row_stride = guard, launch, output, row_stride
        self.cache_span = byte_span(kv_cache)
        self.lengths = tuple(end - first for first, end in map(byte_span, inputs))
        rows, length = output.shape
        self.out_bytes = ((rows - 1) * row_stride + length) * output.element_size()

    def __call__(self, q, weights, context_lens, block_tables, out) -> torch.Tensor | None:
        """Launch for a call whose tensors passed the guard and return its output, or None where an address is off
        the 16-byte grid, the output's rows lie another stride apart or a given ``out`` overlaps an input (the call
        then takes the checked path, which names it)."""
        given = out is not None
        if given:
            out = output_tensor(out, self.output.shape, q.device, self.output.dtype)
        else:
            out = self.new_output()
        addresses = self.addresses(q, weights, context_lens, block_tables, out)
        if addresses is None or out.stride(0) != self.row_stride or given and self.overlaps(addresses):
            return None
        self.launch(*addresses)
        return out

    def overlaps(self, addresses: tuple[int, ...]) -> bool:
        """Whether the output at ``addresses[-1]`` overlaps the cache or the inputs at the other addresses (written
        out, not looped: this runs on every unchecked call given an ``out``)."""
        a, b, c, d, e = addresses
        na, nb, nc, nd = self.lengths
        end = e + self.out_bytes
        lo, hi = self.cache_span
        return ((e < hi and lo < end) or (e < a + na and a < end) or (e < b + nb and b < end)
                or (e < c + nc and c < end) or (e < d + nd and d < end))

    def new_output(self) -> torch.Tensor:
        return torch.empty_like(self.output)

    @staticmethod
    def addresses(q, weights, context_lens, block_tables, out) -> tuple[int, ...] | None:
        """The tensors' addresses, or None unless all are 16-byte aligned (as kept launches are compiled for)."""
        a, b, c = q.data_ptr(), weights.data_ptr(), context_lens.data_ptr()
        d, e = block_tables.data_ptr(), out.data_ptr()
        return None if (a | b | c | d | e) % 16 else (a, b, c, d, e)


def kernel_for(block_size: int, heads: int, head_dim: int, next_n: int, config=None, *,
               layout: str = "normal", precision: str | None = None) -> str:
    """Which kernel a call runs here: the first of :data:`.backends.BACKENDS` that runs on this device and takes
    the call ("hopper" on an sm90 GPU for the dimensions and layout it takes, else "portable"), or the one
    ``config`` is for (ValueError where it cannot run the call here)."""
    for value, name in ((block_size, "block_size"), (heads, "heads"), (head_dim, "head_dim"), (next_n, "next_n")):
        positive_int(value, name)
    return choose(device.current_support(), block_size, heads, head_dim, next_n, layout=layout, precision=precision,
                  config=config).name


def _launch_key(q, kv_cache, max_model_len, layout, precision, config, clean_logits=True,
                logits_dtype=torch.float32) -> tuple:
    return kv_cache.data_ptr(), q.shape, max_model_len, layout, precision, config, clean_logits, logits_dtype


def _kept_for(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout="normal",
              precision: str | None = None, config=None, clean_logits=True, logits_dtype=torch.float32) -> _Kept | None:
    """What an unchecked call with these arguments repeats (its launch takes the addresses of the call's own
    tensors), or None before the first such call; for timing the parts of a call."""
    return _guarded(_launch_key(q, kv_cache, max_model_len, layout, precision, config, clean_logits, logits_dtype),
                    q, kv_cache, weights, context_lens, block_tables)


def _guarded(key, q, kv_cache, weights, context_lens, block_tables) -> _Kept | None:
    """The launch kept under ``key`` if these tensors pass its guard."""
    kept = _LAUNCHES.get(key)
    return kept if kept is not None and kept.guard.check(q, kv_cache, weights, context_lens, block_tables) else None


def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout="normal",
                         precision: str | None = None, check_values=True, config=None, out: torch.Tensor | None = None,
                         clean_logits: bool = True, logits_dtype: torch.dtype = torch.float32):
    """FP8 paged MQA logits: same contract and output as :func:`preshuffle.reference.fp8_paged_mqa_logits_ref`,
    fp32 ``[B * next_n, max_model_len]``, -inf where a row may not see a position.

    ``clean_logits=False`` (DeepGEMM's default) skips the -inf fill past each sequence's context: the logits a row
    may see are the same bits, every other position is unspecified (the kernels leave what they do not need to
    write). ``logits_dtype=torch.bfloat16`` writes bf16 logits: each fp32 logit rounded to nearest even.

    ``precision``: "fp8" multiplies the fp8 values on fp8 tensor cores (DeepGEMM's numerics, what vLLM runs on
    Hopper: about 3e-4 of each logit's sum of |terms|), "exact" adds exact products in fp32 (1e-7). Default: fp8
    on a GPU with fp8 MMAs, else exact (under the interpreter, which computes both exactly, and on sm80-sm86, where
    the portable kernel decodes e4m3 with integer instructions); a GPU that cannot run the precision asked for
    raises ValueError naming what it lacks.

    On an sm90 GPU the Hopper kernel runs when it takes the dimensions (head_dim 128, 16-128 heads, next_n <= 4;
    natural pages of any size: 16, 32 and multiples of 64 tokens through TMA, others gathered; preshuffled pages
    through TMA only), else the portable one; ``config`` picks one explicitly (:class:`HopperConfig` or
    :class:`LaunchConfig`) and sets its launch. The kernel block size is read from ``kv_cache.shape[1]``.

    ``check_values=False`` skips the checks that read context lengths and block ids on the host (a device sync);
    the result stays defined for any values: NaN where a row may see a position whose block id is outside the
    cache or the table (:func:`preshuffle.contract.unreadable_positions`). Repeated unchecked calls of the same
    dimensions skip the other checks too and launch the compiled Hopper kernel directly. ``out``, a
    ``[B * next_n, max_model_len]`` tensor of ``logits_dtype`` (its rows contiguous, and may be padded), receives the
    result instead of a new one; every element is written unless ``clean_logits`` is False. It must not overlap any
    input's bytes (checked or not: ValueError names the input).

    Non-finite and non-positive inputs (docs/input-contract.md): a NaN in q, the cache's fp8 values or the weights
    gives NaN at every logit it enters; a scale that is not finite and positive at a position a row reads is refused
    by a checked call (naming its block and token) and gives NaN at that position unchecked."""
    # A key compares 1 equal to True: an option that is not a bool takes the checks, which refuse it (so does a
    # check_values of 0, which would otherwise skip them).
    keep = check_values is False and (clean_logits is True or clean_logits is False)
    if keep:
        try:  # the caller's arguments, unchecked
            key = _launch_key(q, kv_cache, max_model_len, layout, precision, config, clean_logits, logits_dtype)
            kept = _guarded(key, q, kv_cache, weights, context_lens, block_tables)
        except (AttributeError, TypeError):  # no tensor or an unhashable scalar: the checks below name it
            keep, kept = False, None
        if kept is not None:
            result = kept(q, weights, context_lens, block_tables, out)
            if result is not None:
                return result
    support = device.current_support()
    if precision is None:
        precision = support.default_precision
    device.require_precision(precision, support)
    dims = check_inputs(q, kv_cache, weights, context_lens, block_tables, max_model_len, layout,
                        check_values=check_values)
    check_output_options(clean_logits, logits_dtype)
    if q.dtype != torch.float8_e4m3fn:  # the kernels' fp8 type (the reference takes every fp8 type)
        raise TypeError(f"the kernels take q as torch.float8_e4m3fn, got {q.dtype}")
    device.require_kernel_devices(q=q, kv_cache=kv_cache)
    max_model_len = dims.max_model_len  # a plain int, whatever integer type the caller passed
    backend = choose(support, dims.block_size, dims.heads, dims.head_dim, dims.next_n, layout=layout,
                     precision=precision, config=config)
    kernel = backend.kernel()
    alignment = kernel.alignment(dims.block_size)
    if kv_cache.data_ptr() % alignment:
        raise ValueError(f"kv_cache must start on a {alignment}-byte boundary for the {backend.name} kernel, got "
                         f"address {kv_cache.data_ptr():#x} (storage offset {kv_cache.storage_offset()} bytes): pass "
                         f"kv_cache.clone()")
    given = out is not None
    out = output_tensor(out, (dims.batch * dims.next_n, max_model_len), q.device, logits_dtype)
    if given:
        refuse_overlap(out, q=q, kv_cache=kv_cache, weights=weights, context_lens=context_lens,
                       block_tables=block_tables)
    out, repeat = kernel.launch(q, kv_cache, weights, context_lens, block_tables, max_model_len, dims, layout=layout,
                                precision=precision, support=support, config=config, out=out, clean=clean_logits)
    if keep and repeat is not None and _Kept.addresses(q, weights, context_lens, block_tables, out) is not None:
        if len(_LAUNCHES) >= _MAX_LAUNCHES:
            _LAUNCHES.clear()
        guard = tensor_guard(q, kv_cache, weights, context_lens, block_tables)
        _LAUNCHES[key] = _Kept(guard, repeat, out.new_zeros(()).expand(out.shape), out.stride(0), kv_cache,
                               (q, weights, context_lens, block_tables))
    return out
