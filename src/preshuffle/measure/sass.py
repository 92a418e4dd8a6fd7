"""A compiled kernel's resources and machine code, read without a GPU through the ``cuobjdump`` that Triton's
NVIDIA backend bundles: registers, stack (spills), shared memory, warps, and how many of each instruction."""

from __future__ import annotations

import collections
import re
import subprocess
import tempfile
from pathlib import Path

import triton


def _cuobjdump(compiled, flag: str) -> str:
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        cubin.write(compiled.asm["cubin"])
        cubin.flush()
        return subprocess.run([str(tool), flag, cubin.name], capture_output=True, text=True, check=True).stdout


def resources(compiled) -> dict:
    """Registers a thread, stack bytes a thread (non-zero: ptxas spilled), shared memory bytes and warps of a
    program."""
    usage = _cuobjdump(compiled, "-res-usage")
    return {"registers": int(re.search(r"REG:(\d+)", usage).group(1)),
            "stack": int(re.search(r"STACK:(\d+)", usage).group(1)),
            "shared": compiled.metadata.shared, "warps": compiled.metadata.num_warps}


def instruction_counts(compiled) -> collections.Counter:
    """How many times each SASS opcode (without its modifiers) appears in the kernel."""
    sass = _cuobjdump(compiled, "-sass")
    return collections.Counter(m.group(1).split(".")[0] for m in
                               re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", sass))
