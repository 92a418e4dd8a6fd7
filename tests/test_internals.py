"""The one module that reaches private Triton and PyTorch internals: the releases it checks, and that no other
module of the package reaches them."""

import re
import tomllib
from pathlib import Path

import pytest
import torch
import triton

import preshuffle
from preshuffle import internals

PACKAGE = Path(preshuffle.__file__).resolve().parent
# What reaching a private internal looks like in the package's source.
PRIVATE = re.compile(r"torch\._C|torch\._dynamo|gluon\._runtime|triton\.runtime\.(jit|build|interpreter|driver)"
                     r"|from triton\.runtime import (driver|interpreter)|backends\.nvidia\.driver|_convert_float"
                     r"|clear_cache|_init_handles|packed_metadata|PyCUtensorMap|compiled\.(run|function)\b"
                     r"|GluonASTSource|make_tensordesc_arg|compile_module_from_src|TensorGuards")


def test_release_reads_major_and_minor():
    assert internals.release("2.13.0+cpu") == (2, 13) and internals.release("3.6.0") == (3, 6)
    with pytest.raises(ValueError, match="^version must start with major.minor, got 'nightly'$"):
        internals.release("nightly")
    with pytest.raises(TypeError, match="^version must be a str, got int$"):
        internals.release(3)


def test_check_versions_names_what_it_found_and_what_it_was_written_for():
    internals.check_versions({"triton": triton.__version__, "torch": torch.__version__})
    with pytest.raises(RuntimeError, match=r"^preshuffle's kernels reach private triton internals written for triton "
                                           r"3\.6, and this process has triton 3\.7\.0: install triton 3\.6"):
        internals.check_versions({"triton": "3.7.0"})
    with pytest.raises(RuntimeError, match=r"written for torch 2\.11 to 2\.13, and this process has torch 2\.5\.1"):
        internals.check_versions({"torch": "2.5.1"})
    with pytest.raises(ValueError, match="^versions names 'numpy'"):
        internals.check_versions({"numpy": "2.0"})


def test_pyproject_admits_the_releases_the_internals_were_written_for():
    pins = {}
    for spec in tomllib.loads((PACKAGE.parents[1] / "pyproject.toml").read_text())["project"]["dependencies"]:
        name, bounds = re.match(r"([\w-]+)(.*)", spec).groups()
        pins[name] = bounds
    for name, (lo, hi) in internals.WRITTEN_FOR.items():
        assert pins[name] == f">={lo[0]}.{lo[1]},<{hi[0]}.{hi[1] + 1}", name


def test_only_the_internals_module_and_the_preset_launchs_c_reach_private_internals():
    reaching = {path.relative_to(PACKAGE).as_posix() for path in PACKAGE.rglob("*") if path.suffix in (".py", ".c")
                and PRIVATE.search(path.read_text())}
    assert reaching == {"internals.py", "kernels/preset_launch.c"}


def test_the_pattern_finds_what_it_looks_for():
    assert PRIVATE.search("from torch._C._dynamo.guards import TensorGuards")
    assert PRIVATE.search("    compiled.run(1, 1, 1, stream, compiled.function, meta)")
    assert not PRIVATE.search("from triton.experimental.gluon import language as gl")
