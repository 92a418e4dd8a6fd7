"""The project's own promises: one dependency list in two files, CI runs the README's test command."""

import re
import tomllib
from pathlib import Path

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
