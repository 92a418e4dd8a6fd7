"""What Triton makes of the chunked rungs (:data:`preshuffle.teaching.steps.RUNGS`) for an H100/H200 (sm90a), read on
any machine: each rung compiled with Triton's bundled ptxas, no GPU, at the launch the benchmark timed (64 heads,
64-token natural pages, next_n = 1, 4 warps, 5 stages), and read back from its TTGIR (Triton's GPU-level IR) and its
SASS.

The workbook claims things about the compiler (which loads Triton pipelines, where the keys live when they meet the
MMA); :func:`evidence` is what the compiled code says about them. Compiling needs a process that does not interpret
kernels, so :func:`rung_evidence` runs this module in a child process (``python -m preshuffle.teaching.steps_sm90``
prints the same as JSON).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

from .. import device
from ..kernels.launch import CHUNK, NUM_STAGES, NUM_WARPS

HEADS, HEAD_DIM, BLOCK_SIZE = 64, 128, 64
# The opcodes :func:`evidence` counts: the Hopper MMA; warp shuffles, shared-memory stores and barriers (data moved
# between threads); fp32 multiplies.
OPCODES = ("HGMMA", "SHFL", "STS", "BAR", "FMUL")


def compile_rung(*, keys_as_a: bool = False, scale_after_sum: bool = False, scales_ahead: bool = False):
    """One rung of :data:`preshuffle.teaching.steps.RUNGS` compiled for sm90a; Triton's compiled kernel. Call it where
    TRITON_INTERPRET is 0 (under the interpreter a kernel is no longer Triton's JIT function)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    import triton

    from . import steps

    switches = {"keys_as_a": keys_as_a, "scale_after_sum": scale_after_sum, "scales_ahead": scales_ahead}
    for name, value in switches.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")
    if device.INTERPRETED:
        raise RuntimeError("compile_rung needs TRITON_INTERPRET=0: this process interprets kernels "
                           "(rung_evidence compiles in a child process)")
    signature = {"q_ptr": "*u8", "w_ptr": "*fp32", "ctx_ptr": "*i32", "kv_ptr": "*u8", "scale_ptr": "*fp32",
                 "bt_ptr": "*i32", "bt_stride": "i32", "out_ptr": "*fp32", "out_stride": "i32", "max_model_len": "i32",
                 "tokens_per_program": "i32"}
    constexprs = dict(NEXT_N=1, ROWS=1, H=HEADS, D=HEAD_DIM, BLOCK_SIZE=BLOCK_SIZE, SHUFFLED=False, CTX_2D=False,
                      CHUNK=CHUNK, **{steps._SWITCHES[name]: value for name, value in switches.items()})
    pointers = [i for i, kind in enumerate(signature.values()) if kind.startswith("*")]
    source = ASTSource(steps._chunked_kernel, {**signature, **dict.fromkeys(constexprs, "constexpr")}, constexprs,
                       {(i,): [["tt.divisibility", 16]] for i in pointers})  # torch's allocations: 16-byte aligned
    return triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=NUM_WARPS, num_stages=NUM_STAGES))


def _main_loop(ttgir: str) -> list[str]:
    """The lines of the loop over chunks: the ``scf.for`` whose body holds the MMA."""
    lines = ttgir.splitlines()
    for start, line in enumerate(lines):
        if "scf.for" not in line:
            continue
        depth = 0
        for end in range(start, len(lines)):
            depth += lines[end].count("{") - lines[end].count("}")
            if depth == 0:
                break
        body = lines[start:end + 1]
        if any("ttng.warp_group_dot " in b for b in body):
            return body
    raise ValueError("the TTGIR has no loop around a warp_group_dot")


def _name(line: str) -> str:
    """The Python variable an SSA value is named after: ``%s_next_216 = ...`` -> ``s_next``."""
    match = re.match(r"\s*%([A-Za-z_]\w*?)(?:_\d+)?(?::\d+)? =", line)
    return match.group(1) if match else "?"


def evidence(ttgir: str, sass_counts: dict | None = None, resources: dict | None = None) -> dict:
    """What a compiled rung's TTGIR (and, where given, its SASS opcode counts and resources) says:

    - ``key_buffers``: buffers of the shared-memory ring the key tile's asynchronous copies fill (Triton's
      software pipeline);
    - ``pipelined``: the variables whose loads in the loop over chunks are asynchronous copies into shared memory;
      ``plain_loads``: those loaded by ``tt.load``, which the chunk waits for;
    - ``carried``: of ``plain_loads``, those whose value the loop hands to its next chunk (``scf.yield``);
    - ``stored_to_shared``: tiles the loop writes from registers to shared memory each chunk (``local_alloc`` of a
      tensor), as ``"variable: type"``;
    - ``dot_a``, ``dot_b``: where the MMA's operands come from: "registers" or "shared memory";
    - ``ops``: how many of each of :data:`OPCODES` the kernel's SASS holds (instructions in the code, not executed);
      ``registers`` a thread, ``spills`` (stack bytes a thread), ``shared`` (bytes a program)."""
    if not isinstance(ttgir, str) or "tt.func" not in ttgir:
        raise ValueError("ttgir must be the text of a TTGIR module (compiled.asm['ttgir'])")
    body = _main_loop(ttgir)
    rings = re.findall(r"%k(?:_\d+)? = ttg\.local_alloc : \(\) -> !ttg\.memdesc<(\d+)x", ttgir)
    dot = next(line for line in body if "ttng.warp_group_dot " in line)
    a_type, b_type = re.search(r":\s*(\S+<.*?>+)\s*\*\s*(\S+<.*?>+)\s*->", dot).groups()
    yielded = next((line for line in reversed(body) if "scf.yield" in line), "")
    plain = [line for line in body if " = tt.load " in line]
    out = {
        "key_buffers": int(rings[0]) if rings else None,
        "pipelined": sorted({_name(line) for line in body if "ttg.async_copy_global_to_local" in line}),
        "plain_loads": sorted({_name(line) for line in plain}),
        "carried": sorted({_name(line) for line in plain
                           if re.search(re.escape(line.split("=")[0].strip()) + r"\b", yielded)}),
        "stored_to_shared": [f"{m.group(1)}: {m.group(2)}>" for m in
                             (re.search(r"ttg\.local_alloc %([A-Za-z_]\w*?)(?:_\d+)? : \((tensor<[^,]+),", line)
                              for line in body) if m],
        "dot_a": "shared memory" if a_type.startswith("!ttg.memdesc") else "registers",
        "dot_b": "shared memory" if b_type.startswith("!ttg.memdesc") else "registers",
    }
    if sass_counts is not None:
        out["ops"] = {op: sass_counts.get(op, 0) for op in OPCODES}
    if resources is not None:
        out.update(registers=resources["registers"], spills=resources["stack"], shared=resources["shared"])
    return out


def format_evidence(found: dict) -> str:
    """One rung's :func:`evidence` as a line per question."""
    def names(values):
        return ", ".join(values) if values else "none"

    ops = ", ".join(f"{n} {op}" for op, n in found["ops"].items())
    return "\n".join([
        f"key tile: {found['key_buffers']} shared-memory buffers, filled by asynchronous copies of: "
        f"{names(found['pipelined'])}",
        f"plain loads each chunk waits for: {names(found['plain_loads'])}; handed to the next chunk: "
        f"{names(found['carried'])}",
        f"written from registers to shared memory each chunk: {names(found['stored_to_shared'])}",
        f"MMA operands: A from {found['dot_a']}, B from {found['dot_b']}",
        f"SASS: {ops}; {found['registers']} registers a thread, {found['spills']} bytes spilled, "
        f"{found['shared']} bytes of shared memory a program"])


def _evidence_here() -> dict[str, dict]:
    from ..measure import sass
    from . import steps

    found = {}
    for step, switches in steps.RUNGS.items():
        compiled = compile_rung(**switches)
        found[step] = evidence(compiled.asm["ttgir"], sass.instruction_counts(compiled), sass.resources(compiled))
    return found


def rung_evidence() -> dict[str, dict]:
    """:func:`evidence` of every rung of :data:`preshuffle.teaching.steps.RUNGS`, ``{step: evidence}``, compiled in a
    child process that does not interpret kernels (a few seconds a rung when Triton's cache is cold)."""
    if not device.INTERPRETED:
        return _evidence_here()
    done = subprocess.run([sys.executable, "-m", __name__], capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "0"})
    if done.returncode:
        raise RuntimeError(f"compiling the chunked rungs for sm90a failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


# The Hopper kernel's launches whose compiled code the chapters' claims rest on: (block size, layout, stages), fp8,
# one query row, 80 registers (the launch rule's).
HOPPER_LAUNCHES = {"natural 64-token pages, 4 stages": (64, "normal", 4),
                   "natural 64-token pages, 2 stages": (64, "normal", 2),
                   "preshuffled 16-token pages, 4 stages": (16, "shuffle", 4)}
HOPPER_OPCODES = ("QGMMA", "UTMALDG", "LDSM", "LDGSTS")  # fp8 WGMMA, TMA copies, ldmatrix, cp.async


def _hopper_here() -> dict[str, dict]:
    from ..kernels import hopper
    from ..kernels.launch import HopperConfig
    from ..measure import sass

    found = {}
    for label, (block_size, layout, stages) in HOPPER_LAUNCHES.items():
        compiled = hopper.compile_sm90a(1, block_size=block_size, layout=layout,
                                        config=HopperConfig(1, stages, 80))
        ops = sass.instruction_counts(compiled)
        found[label] = {**sass.resources(compiled), **{op: ops[op] for op in HOPPER_OPCODES}}
    return found


def hopper_evidence() -> dict[str, dict]:
    """The Hopper kernel compiled for sm90a at each of :data:`HOPPER_LAUNCHES`: registers, spills, shared memory
    and warps a program, and how many of :data:`HOPPER_OPCODES` its SASS holds. Compiled in a child process that
    does not interpret kernels, as :func:`rung_evidence` is."""
    if not device.INTERPRETED:
        return _hopper_here()
    done = subprocess.run([sys.executable, "-m", __name__, "hopper"], capture_output=True, text=True,
                          env={**os.environ, "TRITON_INTERPRET": "0"})
    if done.returncode:
        raise RuntimeError(f"compiling the Hopper kernel for sm90a failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


if __name__ == "__main__":
    print(json.dumps(_hopper_here() if sys.argv[1:] == ["hopper"] else _evidence_here()))
