"""How a call is cut into programs: :class:`LaunchConfig` for the portable kernel, :class:`HopperConfig` for the
Hopper kernel, and the rules measured on the H200 that pick one for a shape.

Portable kernel:
benchmarks/tune.py compared chunks of 64/128 positions, 4/8 warps and 1-6 pipeline stages on the anchor shapes
(docs/kernel-design.md, "Split across the SMs"): 64 positions, 4 warps, 5 stages was fastest on every shape (4 stages
lose 7-20%, chunks of 128 lose 15-45%). What depends on the shape is how finely each sequence's row is split
into programs: batches of 64 or fewer were fastest near 4 programs per SM, batches of 128-256 at 16, and 4096
is flat (one program per sequence is already 31 per SM).

Both kernels split each row on the device: the launch fixes how many programs a sequence gets (``splits``, from the
batch and the SMs alone), and each program takes its share of its own row's context, read from the lengths it is
given. So the launch does not depend on ``max_model_len`` (vLLM passes the model's longest context, 163840 for
DeepSeek-V3.2, whatever the batch holds) and needs no host sync: the -inf fill past a row's context, when asked
for, is shared among the same programs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from .. import device
from ..arguments import positive_int

# The portable kernel's MMA: fp8, fp16 on values widened by Triton's e4m3 conversion (sm89 and newer), or fp16 on
# values decoded with integer instructions (sm80-sm86, where Triton has no e4m3 type).
DOT_MODES = ("fp8", "fp16", "fp16-decode")
REGISTERS_PER_SM = 65536  # on every GPU from sm80 to sm90
CHUNK, NUM_WARPS, NUM_STAGES = 64, 4, 5


@dataclass(frozen=True)
class LaunchConfig:
    """How one call is cut into programs: ``chunk`` positions per ``tl.dot``; ``splits`` programs per sequence, each
    taking an even share of its row's context on the device, or else ``tokens_per_program`` positions per program
    (a multiple of ``chunk``, a fixed run of the output row whatever the context); Triton's
    ``num_warps``/``num_stages``. Neither split given: one program per sequence."""

    chunk: int = 64
    tokens_per_program: int | None = None
    num_warps: int = 4
    num_stages: int = 2
    dot: str = "fp16"
    splits: int | None = None

    def __post_init__(self):
        if positive_int(self.chunk, "chunk") < 16 or self.chunk & (self.chunk - 1):
            raise ValueError(f"chunk must be a power of two >= 16, got {self.chunk}")
        if self.dot not in DOT_MODES:
            raise ValueError(f"dot must be one of {DOT_MODES}, got {self.dot!r}")
        if self.tokens_per_program is not None and (positive_int(self.tokens_per_program, "tokens_per_program")
                                                    % self.chunk):
            raise ValueError(f"tokens_per_program must be a positive multiple of chunk {self.chunk}, "
                             f"got {self.tokens_per_program}")
        # Triton takes a power of two of warps, up to a program of 1024 threads, and at least one stage.
        if positive_int(self.num_warps, "num_warps") > 32 or self.num_warps & (self.num_warps - 1):
            raise ValueError(f"num_warps must be a power of two in [1, 32], got {self.num_warps}")
        positive_int(self.num_stages, "num_stages")
        if self.splits is not None:
            positive_int(self.splits, "splits")
            if self.tokens_per_program is not None:
                raise ValueError(f"give splits or tokens_per_program, not both (got {self.splits} and "
                                 f"{self.tokens_per_program})")


def dot_precision(dot: str) -> str:
    """The precision contract a portable MMA mode (:data:`DOT_MODES`) holds."""
    return "exact" if dot.startswith("fp16") else "fp8"


def default_programs_per_sm(batch: int) -> int:
    return 4 if batch < 128 else 16


def multiprocessor_count() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def whole_row(max_model_len: int, chunk: int = CHUNK) -> int:
    """Positions per program when one program covers a whole output row."""
    return triton.cdiv(max_model_len, chunk) * chunk


def splits_for(batch: int, programs_per_sm: int, sms: int | None = None) -> int:
    """Programs per sequence so that ``batch * splits`` is about ``programs_per_sm`` programs per SM (of ``sms``, by
    default the current GPU's), at least one: small batches with long contexts get each row split along its
    context."""
    positive_int(batch, "batch")
    positive_int(programs_per_sm, "programs_per_sm")
    return max(1, triton.cdiv(programs_per_sm * (sms or multiprocessor_count()), batch))


def fixed_run(max_model_len: int, splits: int, chunk: int = CHUNK) -> int:
    """Positions per program of a fixed-run launch (the teaching kernels' kind) that cuts a row of
    ``max_model_len`` into at most ``splits`` runs of whole chunks."""
    chunks = triton.cdiv(max_model_len, chunk)
    return triton.cdiv(chunks, min(splits, chunks)) * chunk


def config_for(batch: int, *, programs_per_sm: int | None = None, chunk: int = CHUNK, num_warps: int = NUM_WARPS,
               num_stages: int = NUM_STAGES, **fields) -> LaunchConfig:
    """The portable kernel's launch: :func:`splits_for` at ``programs_per_sm`` (default: the measured rule)."""
    splits = splits_for(batch, programs_per_sm or default_programs_per_sm(batch))
    return LaunchConfig(chunk, None, num_warps, num_stages, splits=splits, **fields)


def default_config(batch: int) -> LaunchConfig:
    """Under the interpreter every program costs Python overhead, so one program per sequence; compiled, split
    each row so that the grid has a few programs per SM."""
    if device.INTERPRETED:
        return LaunchConfig(CHUNK, splits=1)
    return config_for(batch)


@dataclass(frozen=True)
class HopperConfig:
    """How one call of the Hopper kernel is cut: ``splits`` programs per sequence (each an even share of its row's
    context, cut on the device), a ring of ``stages`` shared-memory stages, and the register budget per thread
    (``maxnreg``: it sets how many programs share an SM, and ptxas must fit the math warpgroups in it; the loader
    gets ``loader_regs``, by default :func:`hopper_loader_regs`'s). ``row_warpgroups``: with next_n >= 2, a math
    warpgroup for each query row, all reading the same stages, instead of one warpgroup for every row.
    ``row_groups``: programs a sequence's query rows are cut into (a power of two, at most next_n), launched side by
    side so that the second to read a page finds it in L2; each program takes ``next_n / row_groups`` rows
    (rounded up to a power of two) in one warpgroup."""

    splits: int
    stages: int = 4
    maxnreg: int | None = None  # None: hopper_maxnreg's value for the call
    loader_regs: int | None = None
    row_warpgroups: bool = False
    row_groups: int = 1

    def __post_init__(self):
        positive_int(self.splits, "splits")
        if not 2 <= positive_int(self.stages, "stages") <= 12:
            raise ValueError(f"stages must be in [2, 12], got {self.stages}")
        for name in ("maxnreg", "loader_regs"):
            value = getattr(self, name)
            if value is not None and (positive_int(value, name) % 8 or not 24 <= value <= 256):
                raise ValueError(f"{name} must be a multiple of 8 in [24, 256] (setmaxnreg's range), got {value}")
        if not isinstance(self.row_warpgroups, bool):
            raise TypeError(f"row_warpgroups must be a bool, got {type(self.row_warpgroups).__name__} "
                            f"{self.row_warpgroups!r}")
        if positive_int(self.row_groups, "row_groups") & (self.row_groups - 1):
            raise ValueError(f"row_groups must be a power of two, got {self.row_groups}")
        if self.row_groups > 1 and self.row_warpgroups:
            raise ValueError("give row_warpgroups or row_groups > 1, not both: a program's rows share one warpgroup "
                             f"when they are cut into groups (got row_groups {self.row_groups})")


def gathers(block_size: int) -> bool:
    """Whether the Hopper kernel gathers pages of this size with a loader warpgroup's cp.async copies instead of
    TMA. A TMA descriptor's page stride, B*132 bytes, must be a multiple of 16 (B a multiple of 4), and a copy takes
    ``min(B, 64)`` rows of one page (a box dimension, so a power of two) where a 64-position chunk must be whole
    copies: B must divide 64 or be a multiple of it. TMA takes the multiples of 16 among those (what vLLM's
    ``MultipleOf(16)`` backends negotiate; the sizes it is tested with). Pages of 48, 80 or 96 tokens, whose copies
    cannot tile a chunk, 4 or 8, and every other size are gathered."""
    return block_size % 16 != 0 or (64 % block_size != 0 and block_size % 64 != 0)


def hopper_programs_per_sm(batch: int, next_n: int, exact: bool, gather: bool = False) -> int:
    """Programs per SM for the Hopper kernel, from the H200 sweeps (docs/kernel-design.md,
    results/h200-hopper-sweep.json and results/h200-gather-sweep.json). One query row, 80 registers (three programs
    an SM): fp8 2 below 256 sequences, 8 from there; the exact path and the gather, whose chunks take longer, 3 below
    128 sequences, 6 below 256. Two rows share an MMA (128 registers, two programs an SM): 4, 8 from 256 sequences;
    exact 2 below 128 or from 1024, 4 below 256, else 8. Three query rows (a warpgroup each): fp8 4 below 256
    sequences (at vLLM's call, B=64: 44.3-44.7 us against 47.8-48.8 at 2 and 46.3 for one full wave,
    results/h200-vllm-call-sweep.json and `git show e3200a2:results/h200-vllm-call-nvdev.json`), 8 from there;
    exact 2 below 256, then 4."""
    if next_n == 3:
        return (2 if batch < 256 else 4) if exact else (4 if batch < 256 else 8)
    if next_n == 1:
        if batch >= 256:
            return 8
        if exact or gather:
            return 3 if batch < 128 else 6
        return 2
    if exact:
        return 2 if batch < 128 or batch >= 1024 else 4 if batch < 256 else 8
    return 8 if batch >= 256 else 4


def programs_held(maxnreg: int, math_wgs: int) -> int:
    """Programs of ``math_wgs`` math warpgroups (and the loader's, a warpgroup) at ``maxnreg`` registers a thread
    that an SM's registers hold at once."""
    return REGISTERS_PER_SM // (maxnreg * 32 * 4 * (math_wgs + 1))


def one_wave(batch: int, held: int, sms: int | None = None) -> int | None:
    """Programs per sequence that fill one wave of ``held`` programs an SM, when a wave holds at least two a
    sequence; None for larger batches. A sequence's programs share its context evenly, so programs differ in length
    as contexts do: in one wave the longest decides, and more programs a sequence make it shorter."""
    slots = held * (sms or multiprocessor_count())
    return slots // batch if 2 * batch <= slots else None


def hopper_config(batch: int, next_n: int, *, exact: bool = False, block_size: int = 64, layout: str = "normal",
                  programs_per_sm: int | None = None, stages: int | None = None,
                  sms: int | None = None) -> HopperConfig:
    """The Hopper kernel's launch for a shape. fp8 through TMA with one math warpgroup: batches that leave room for two
    programs a sequence in one wave fill that wave (:func:`one_wave`; at vLLM's call on the H200 the fastest split
    swept or within 2% of it on every such shape, results/h200-vllm-call-sweep.json), larger ones take
    :func:`hopper_programs_per_sm`'s split, as warpgroups a row, the exact path and the gather do at every batch. A
    4-stage ring was best or within 3% on every anchor shape; the gather takes 3 (the same at one query row, 49.9 us
    instead of 59.0 at B=64 next_n=2: its copies pass through L1, which shares the SM's memory with the ring). Three
    query rows get a math warpgroup each (10-14% faster than one warpgroup for all four padded rows at 64 and 256
    sequences), except on preshuffled pages, whose keys a warpgroup a row cannot hold in 64 registers (it spills):
    there one warpgroup at 128 registers was faster at 64 and 256 sequences. At two rows one warpgroup was 3-5%
    faster. Four rows on natural pages through TMA are cut into two groups of programs (:func:`row_groups_for`),
    launched as two rows of twice the batch. ``programs_per_sm`` asks for :func:`splits_for`'s split instead;
    ``sms``: the rule for a GPU of that many SMs (default: the current one's)."""
    gather = gathers(block_size)
    rows = next_n == 3 and layout != "shuffle"
    groups = row_groups_for(next_n, exact=exact, block_size=block_size, layout=layout)
    batch, next_n = batch * groups, next_n // groups
    maxnreg = hopper_maxnreg(next_n, exact, rows)
    # Three rows took more than one wave (hopper_programs_per_sm): warpgroups a row wait on one another's stages.
    wave = one_wave(batch, programs_held(maxnreg, 1), sms) if not (exact or gather or next_n == 3) else None
    if programs_per_sm or wave is None:
        splits = splits_for(batch, programs_per_sm or hopper_programs_per_sm(batch, next_n, exact, gather), sms)
    else:
        splits = wave
    return HopperConfig(splits, stages or (3 if gather else 4), maxnreg, row_warpgroups=rows, row_groups=groups)


def row_groups_for(next_n: int, *, exact: bool = False, block_size: int = 64, layout: str = "normal") -> int:
    """Groups of programs the launch rule cuts a sequence's query rows into: two at four rows of fp8 on natural
    pages copied by TMA, each program the kernel of two rows (at vLLM's call on the H200, 3-5% faster than one
    program for all four at 64 and 256 sequences; on 16-token preshuffled pages, slower), else one. At two rows
    (a program a row) and three (two rows a program) the groups were slower (docs/kernel-design.md)."""
    return 2 if next_n == 4 and not exact and layout != "shuffle" and not gathers(block_size) else 1


def hopper_maxnreg(next_n: int, exact: bool, row_warpgroups: bool = False) -> int:
    """Registers a thread for the Hopper kernel, the fewest ptxas fits without spilling (compiled for sm90a; the
    math warpgroup gets more through setmaxnreg, what the loader leaves): 80 fit one query row, in either precision
    (three programs an SM); two rows, or the exact path's widened keys for two, need 128. A warpgroup per row fits
    in 64 (fp8), so that two programs of three rows (16 warps) share an SM."""
    if row_warpgroups and not exact:
        return 64
    return 80 if next_n == 1 else 128


def hopper_loader_regs(block_size: int) -> int:
    """Registers a loader thread gets, the fewest ptxas fits without spilling: 40 for the TMA loader warp, 56 for
    the cp.async gather's loader warpgroup (its 16 copies a chunk each hold an address)."""
    return 56 if gathers(block_size) else 40


def program_rows(config: HopperConfig, next_n: int) -> int:
    """Query rows a program of ``config`` takes (padded to a power of two), checked: ``config.row_groups`` cuts
    next_n rows into groups none of which is empty."""
    padded = triton.next_power_of_2(next_n)
    if config.row_groups > next_n:
        raise ValueError(f"row_groups must be at most next_n {next_n}, got {config.row_groups}")
    return padded // config.row_groups


def math_warpgroups(config: HopperConfig, next_n: int) -> int:
    """Math warpgroups in a program of the Hopper kernel: one for every query row, or one for all of them."""
    return next_n if config.row_warpgroups else 1


def hopper_registers(config: HopperConfig, next_n: int, exact: bool) -> int:
    """The register budget a thread of ``config``'s program gets, checked: the program's warps (its math
    warpgroups, and the loader warp, which Triton pads to a warpgroup) must fit in an SM's registers."""
    maxnreg = config.maxnreg or hopper_maxnreg(program_rows(config, next_n), exact, config.row_warpgroups)
    warps = 4 * math_warpgroups(config, next_n) + 4
    if warps * 32 * maxnreg > REGISTERS_PER_SM:
        raise ValueError(f"{config} cannot launch at next_n {next_n}: {warps} warps x 32 threads x {maxnreg} "
                         f"registers is more than an SM's {REGISTERS_PER_SM}; lower maxnreg or turn row_warpgroups off")
    return maxnreg
