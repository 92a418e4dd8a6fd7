"""The project's own promises: one dependency list in two files, CI runs the README's test command."""

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from preshuffle import device

ROOT = Path(__file__).resolve().parents[1]
CONDA_NAMES = {"pytorch": "torch"}  # conda-forge name -> PyPI name


def requirement(spec: str) -> tuple[str, str]:
    name, rest = re.match(r"\s*([A-Za-z0-9_.-]+)\s*(.*)", spec.split("#")[0]).groups()
    return CONDA_NAMES.get(name.lower(), name.lower()), rest.replace(" ", "")


def pyproject_requirements() -> dict:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = project["dependencies"] + project["optional-dependencies"]["test"]
    return dict(requirement(s) for s in specs)


def conda_requirements() -> dict:
    deps, in_deps = {}, False
    for line in (ROOT / "environment.yml").read_text().splitlines():
        if line.startswith("dependencies:"):
            in_deps = True
        elif in_deps and re.match(r"  - [A-Za-z]", line):
            name, spec = requirement(line[4:])
            if name not in ("python", "pip"):
                deps[name] = spec
    return deps


def test_environment_yml_and_pyproject_list_the_same_dependencies():
    assert conda_requirements() == pyproject_requirements()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and re.search(r"^exec make test$", ci, re.M)


def test_cli_help_lists_every_command():
    out = subprocess.run([sys.executable, "-m", "preshuffle", "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert "negotiate" in out and "bench" in out


def test_cli_negotiate_reports_the_pr():
    run = lambda *a: subprocess.run([sys.executable, "-m", "preshuffle", "negotiate", *a], capture_output=True,
                                    text=True)
    before = run("--block-size", "16", "--platform", "rocm", "--before-pr")
    assert before.returncode == 0 and "kernel block size: 1 (16 kernel blocks" in before.stdout
    after = run("--block-size", "16")
    assert "kernel block size: 16 (1 kernel blocks" in after.stdout and "preshuffled=True" in after.stdout
    sweep = run("--sweep", "--block-size", "16", "48")
    assert "Negotiate after PR #51216 but AITER would reject: [48]" in sweep.stdout
    bad = run("--block-size", "0")
    assert bad.returncode == 2 and "manager_block_size must be a positive int" in bad.stderr


@pytest.mark.skipif(not device.INTERPRETED, reason="a GPU process may time kernels")
def test_cli_bench_refuses_the_interpreter():
    out = subprocess.run([sys.executable, "-m", "preshuffle", "bench", "--shapes", "6"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "refusing to time Triton's interpreter" in out.stderr
