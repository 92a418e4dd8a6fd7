"""The project's own promises: one dependency list in two files, CI runs the README's test command."""

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from preshuffle import provenance, report, vllm_call_report
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


# A whole log of pytest on the GPU (benchmarks/run_hopper.sh, steps tests and nbval): its header, the count
# collected, an outcome line per test (-v; under pytest-xdist each led by its worker) and the final summary.
HEADER = re.compile(r"^# (commit|gpu|torch|triton|python) (\S.*)$", re.M)
COLLECTED = re.compile(r"^(?:collected (\d+) items?(?: / \d+ deselected / (\d+) selected)?|(?:created: \d+/\d+ "
                       r"workers\n)?\d+ workers \[(\d+) items?\])\s*$", re.M)
OUTCOME = re.compile(r"^(?:\[gw\d+\] \[\s*\d+%\] (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS) (\S+(?: \d+)?)$|"
                     r"(\S+::.+?) (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\s+\[\s*\d+%\])", re.M)
SUMMARY = re.compile(r"^=+ ((?:\d+ \w+(?:, )?)+) in [\d.]+s(?: \([\d:]+\))? =+$")


def whole_log(text: str) -> dict:
    """The header, outcome of each test and counts of a pytest log; AssertionError where the log is cut short, a
    test failed or erred, or the counts do not add up to what was collected."""
    header = dict(HEADER.findall(text))
    assert {"commit", "gpu", "torch", "triton"} <= set(header), f"the log's header lacks fields: {header}"
    collected = COLLECTED.findall(text)
    assert len(collected) == 1, f"expected one line of the tests collected, got {collected}"
    total = int(next(n for n in reversed(collected[0]) if n))
    last = text.rstrip().splitlines()[-1] if text.strip() else ""
    summary = SUMMARY.match(last)
    assert summary, f"the log does not end with pytest's summary line: {last[-120:]!r}"
    counts = {word: int(n) for n, word in re.findall(r"(\d+) (\w+)", summary.group(1))}
    bad = {k: v for k, v in counts.items() if k in ("failed", "error", "errors", "xpassed") and v}
    assert not bad, f"the run did not pass whole: {summary.group(1)}"
    ran = sum(counts.get(k, 0) for k in ("passed", "skipped", "xfailed"))
    assert ran == total, f"{ran} tests passed, skipped or xfailed, but {total} were collected"
    outcomes = {m[1] or m[2]: m[0] or m[3] for m in OUTCOME.findall(text)}
    assert len(outcomes) == total, f"{len(outcomes)} tests have an outcome line, {total} were collected"
    return {"header": header, "total": total, "counts": counts, "outcomes": outcomes}


GOOD_LOG = """# commit 0123456789abcdef0123456789abcdef01234567
# gpu NVIDIA H200
# torch 2.11.0+cu130
# triton 3.6.0
============================= test session starts ==============================
created: 16/16 workers
16 workers [3 items]

[gw0] [ 33%] PASSED tests/test_kernels_hopper.py::test_a
[gw1] [ 66%] PASSED tests/test_kernels_hopper.py::test_b
[gw0] [100%] SKIPPED tests/test_x.py::test_c
========================= 2 passed, 1 skipped in 10.00s ========================="""


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.rsplit("\n", 1)[0], "does not end with pytest's summary line"),
    (lambda t: t.replace("2 passed, 1 skipped", "1 failed, 1 passed, 1 skipped"), "did not pass whole"),
    (lambda t: t.replace("2 passed, 1 skipped", "1 passed, 1 skipped"), "2 tests passed, skipped or xfailed, but 3"),
    (lambda t: t.replace("# gpu NVIDIA H200\n", ""), "header lacks fields"),
    (lambda t: t.replace("16 workers [3 items]", ""), "one line of the tests collected"),
    (lambda t: t.replace("[gw1] [ 66%] PASSED tests/test_kernels_hopper.py::test_b\n", ""), "have an outcome line"),
])
def test_a_log_cut_short_failed_or_unheaded_is_no_whole_log(edit, message):
    log = whole_log(GOOD_LOG)
    assert log["total"] == 3 and log["outcomes"]["tests/test_kernels_hopper.py::test_b"] == "PASSED"
    assert whole_log(GOOD_LOG.replace("created: 16/16 workers\n16 workers [3 items]", "collected 3 items")) == log
    nbval = "notebooks/01_a.ipynb::Cell 0 PASSED                                [ 50%]"
    assert OUTCOME.findall(nbval) == [("", "", "notebooks/01_a.ipynb::Cell 0", "PASSED")]
    with pytest.raises(AssertionError, match=message):
        whole_log(edit(GOOD_LOG))


def committed_log(name: str) -> dict:
    log = whole_log((ROOT / "results" / name).read_text())
    assert "H200" in log["header"]["gpu"], log["header"]
    ancestor = provenance.is_ancestor(log["header"]["commit"])
    assert ancestor in (True, None), f"{name}: commit {log['header']['commit']} is not an ancestor of HEAD"
    return log


def test_h200_logs_ran_every_notebook_and_every_test_whole():
    """results/h200-nbval.log and results/h200-pytest.log, from the H200: each a whole run that passed, every
    notebook ran there, and so did every test of the Hopper kernel, which has no interpreter. A tree with neither
    log claims no H200 run of the suite; one log without the other is a run cut short."""
    present = [name for name in ("h200-nbval.log", "h200-pytest.log") if (ROOT / "results" / name).exists()]
    if not present:
        pytest.skip("no H200 log of the suite is committed (`bash benchmarks/run_hopper.sh OUT tests nbval` on an "
                    "H200 writes both)")
    assert len(present) == 2, f"only {present} is committed: the logs come as a pair"
    nbval = committed_log("h200-nbval.log")
    notebooks = {p.name for p in (ROOT / "notebooks").glob("*.ipynb")}
    assert {name.split("::")[0].removeprefix("notebooks/") for name in nbval["outcomes"]} == notebooks
    tests = committed_log("h200-pytest.log")
    hopper = [outcome for name, outcome in tests["outcomes"].items() if name.startswith("tests/test_kernels_hopper.py")]
    assert set(hopper) == {"PASSED"} and len(hopper) > 50


def test_chapter_6_prints_the_bound_it_asserts_not_a_last_digit_the_gpu_changes():
    chapter_6 = "".join("".join(c["source"]) for c in notebook_cells("06_logits_to_tokens.ipynb"))
    assert "{verdict['max_rel_error']:.1e} of each logit" not in chapter_6


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


def test_run_hopper_heads_each_test_log_with_its_commit_gpu_and_versions(tmp_path):
    """benchmarks/run_hopper.sh's log_header and parallel, run alone (a stand-in nvidia-smi): a header whole_log
    reads, and -n only where pytest-xdist imports."""
    import sys

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H200'\n")
    fake.chmod(0o755)
    script = (ROOT / "benchmarks" / "run_hopper.sh").read_text()
    functions = "\n".join(re.search(rf"^{name}\(\) {{.*?^}}$|^{name}\(\) {{.*?}}$", script, re.M | re.S).group(0)
                          for name in ("log_header", "parallel"))
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin", "PRESHUFFLE_GIT_COMMIT": "0123abc"}
    out = subprocess.run(["bash", "-c", f"python={sys.executable}\n{functions}\nlog_header; echo \"[$(parallel)]\""],
                         capture_output=True, text=True, env=env, cwd=ROOT, check=True).stdout
    header = dict(HEADER.findall(out))
    import torch
    import triton

    assert header == {"commit": "0123abc", "gpu": "NVIDIA H200", "torch": torch.__version__,
                      "triton": triton.__version__, "python": header["python"]}
    try:
        import xdist  # noqa: F401
        assert out.rstrip().endswith("[-n 16]")
    except ImportError:
        assert out.rstrip().endswith("[]")
    assert "PRESHUFFLE_HYPOTHESIS_PROFILE=gpu" in script and "-v $(parallel)" in script


def test_the_gpu_profile_caps_every_hypothesis_test_its_own_settings_too():
    import types

    from hypothesis import given, settings, strategies

    from tests.conftest import cap_examples

    seen = []

    @settings(max_examples=40, database=None)
    @given(strategies.integers())
    def many(x):
        seen.append(x)

    @settings(max_examples=3, database=None)
    @given(strategies.integers())
    def few(x):
        seen.append(x)

    cap_examples([types.SimpleNamespace(obj=many), types.SimpleNamespace(obj=few), types.SimpleNamespace()], 10)
    many()
    assert 0 < len(seen) <= 10
    seen.clear()
    few()
    assert 0 < len(seen) <= 3
