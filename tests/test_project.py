"""The project's own promises: one dependency list in two files, CI runs the README's test command."""

import json
import re
import subprocess
import tomllib
from pathlib import Path

from preshuffle import report, vllm_call_report
from preshuffle.__main__ import committed_results

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


def tracked_files() -> list[Path]:
    listing = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [ROOT / name for name in listing.splitlines() if (ROOT / name).is_file()]


def tracked_text() -> dict[Path, str]:
    texts = {}
    for path in tracked_files():
        try:
            texts[path] = path.read_text()
        except UnicodeDecodeError:  # images
            continue
    return texts


def test_readme_table_is_the_generated_one():
    readme = (ROOT / "README.md").read_text()
    table = re.search(r"<!-- results table: generated -->\n(.*)\n<!-- end of results table -->", readme, re.S)
    assert table, "README.md has no generated results table"
    assert table.group(1) == vllm_call_report.results_table(*committed_results()), \
        "README.md's table is stale: paste the output of `python -m preshuffle results`"


def test_readme_is_a_front_page():
    assert len((ROOT / "README.md").read_text().split()) <= 900


# Words a reader's clone cannot make sense of: how the tree was made, and places outside it. The character classes
# keep this file from matching its own patterns.
PROCESS_WORDS = re.compile(
    r"\b(first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|later|earlier|this|"
    r"next|previous|same|each|every) sessio[n]s?\b|\ble[n]t\b|\.\./shar[e]d|/wor[k]/|device (tim[e]|minute[s])|"
    r"\bissu[e] #?[0-9]+|\bnotes,? par[t] [0-9]+", re.I)


def test_no_tracked_file_speaks_of_how_it_was_made():
    hits = [f"{path.relative_to(ROOT)}: {m.group(0)!r}" for path, text in tracked_text().items()
            for m in PROCESS_WORDS.finditer(text)]
    assert not hits, hits[:20]


def test_every_results_file_is_read_by_code_a_notebook_or_a_test():
    readers = {path: text for path, text in tracked_text().items()
               if path.suffix in (".py", ".ipynb") and path.parts[len(ROOT.parts)] in ("src", "tests", "notebooks")}
    unread = [path.name for path in (ROOT / "results").iterdir()
              if not any(path.name in text for reader, text in readers.items() if reader != path)]
    assert not unread, f"results files nothing reads: {unread}"


# A path into the tree named in backquotes or a link: it must exist (a reader follows it). (tests/ is left out:
# other projects' test files are named the same way.)
TREE_PATH = re.compile(r"[`(]((?:src|docs|results|benchmarks|notebooks|tools)/[\w./-]+?)[`)#]")


def test_every_path_a_file_names_exists():
    missing = sorted({f"{path.relative_to(ROOT)}: {m.group(1)}" for path, text in tracked_text().items()
                      for m in TREE_PATH.finditer(text) if not (ROOT / m.group(1).rstrip(".")).exists()})
    assert not missing, missing


def test_h200_logs_ran_every_notebook_and_the_compiled_kernels_tests():
    """results/h200-nbval.log and results/h200-pytest.log, from the H200: every notebook ran there, and so did every
    test of the Hopper kernel, which has no interpreter."""
    nbval = (ROOT / "results" / "h200-nbval.log").read_text()
    notebooks = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert {name for name in notebooks if f"notebooks/{name} " in nbval} == notebooks
    # One cell failed there: it printed the kernel's error, whose last digit differs from the CPU's. It now prints
    # the bound it asserts.
    assert re.findall(r"^FAILED (\S+)", nbval, re.M) == ["notebooks/06_logits_to_tokens.ipynb::Cell"]
    chapter_6 = "".join("".join(c["source"]) for c in notebook_cells("06_logits_to_tokens.ipynb"))
    assert "{verdict['max_rel_error']:.1e} of each logit" not in chapter_6
    pytest_log = (ROOT / "results" / "h200-pytest.log").read_text()
    hopper = re.search(r"^tests/test_kernels_hopper\.py ([.FEsx]+)\s+\[.*?\]\n([.FEsx]+)\s+\[", pytest_log, re.M)
    results = hopper.group(1) + hopper.group(2)
    assert set(results) == {"."} and len(results) > 50


def notebook_cells(name: str) -> list[dict]:
    return json.loads((ROOT / "notebooks" / name).read_text())["cells"]


def markdown_words(cells: list[dict]) -> int:
    return sum(len("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")


def test_chapter_5_is_a_tutorial_each_step_showing_the_kernels_own_code():
    cells = notebook_cells("05_hopper_kernel.ipynb")
    assert markdown_words(cells) <= 2000
    steps, current = {}, None
    for cell in cells:
        text = "".join(cell["source"])
        heading = re.match(r"## (Step \d+)", text) if cell["cell_type"] == "markdown" else None
        if heading:
            current = heading.group(1)
            steps[current] = False
        elif current and cell["cell_type"] == "code" and "source(" in text:
            steps[current] = True
    assert len(steps) >= 6 and all(steps.values()), steps
    assert any("hopper_kernel_diagram" in "".join(c["source"]) for c in cells)


def test_chapter_3_gives_each_step_its_code_and_its_measured_figure():
    """Every '## Step' section prints code from the package (source, changes or a rung's kernel) and reads its figure
    from the committed run (report.format_step); at least four cells print kernel code."""
    cells = notebook_cells("03_paged_mqa_kernel.ipynb")
    printing = ("source(", "changes(", "print(kernels[")
    steps, current = {}, None
    for cell in cells:
        text = "".join(cell["source"])
        heading = re.match(r"## (Step \d+)", text) if cell["cell_type"] == "markdown" else None
        if heading:
            current = heading.group(1)
            steps[current] = {"code": False, "figure": False}
        elif cell["cell_type"] == "markdown" and text.startswith("## "):
            current = None
        elif current and cell["cell_type"] == "code":
            steps[current]["code"] |= any(p in text for p in printing)
            steps[current]["figure"] |= "report.format_step(" in text
    assert len(steps) == 8 and all(s["code"] and s["figure"] for s in steps.values()), steps
    kernel_cells = [c for c in cells if c["cell_type"] == "code" and any(p in "".join(c["source"]) for p in printing)
                    and any("@triton.jit" in "".join(o.get("text", "")) or "tl." in "".join(o.get("text", ""))
                            for o in c.get("outputs", []))]
    assert len(kernel_cells) >= 4
    assert "exercises.CHECKERS" in "".join("".join(c["source"]) for c in cells)


def _kernel_code_cells(cells: list[dict], marker: str) -> list[dict]:
    """Code cells that print code from the package (source or changes) whose output holds ``marker``."""
    return [c for c in cells if c["cell_type"] == "code"
            and any(p in "".join(c["source"]) for p in ("source(", "changes("))
            and any(marker in "".join(o.get("text", "")) for o in c.get("outputs", []))]


def test_chapters_5_and_6_print_their_kernels_code():
    assert len(_kernel_code_cells(notebook_cells("05_hopper_kernel.ipynb"), "gl.")
               + _kernel_code_cells(notebook_cells("05_hopper_kernel.ipynb"), "tl.dot")) >= 8
    chapter_6 = notebook_cells("06_logits_to_tokens.ipynb")
    assert len(_kernel_code_cells(chapter_6, "gl.")) >= 4
    text = "".join("".join(c["source"]) for c in chapter_6)
    assert all(name in text for name in ("topk_radix.pass_checks", "plots.topk_passes_plot", "topk_report.variants"))
