"""The package's import graph, read from its source with ``ast``: every import anywhere in a module (a lazy one
inside a function closes a circle as surely as one at the top)."""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import preshuffle

PACKAGE = Path(preshuffle.__file__).resolve().parent


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """module -> the modules it imports: preshuffle's by full name, others by their top-level name."""
    files = {module_name(p): p for p in root.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                source = ".".join(base + ([node.module] if node.module else []))
                # `from . import device` imports the module preshuffle.device, not a name of the package
                targets.update(f"{source}.{a.name}" if f"{source}.{a.name}" in files else source for a in node.names)
        graph[name] = {t if t in files else t.split(".")[0] for t in targets}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of ``graph`` as a path that returns to its start, or None."""
    done, path = set(), []

    def visit(node):
        if node in path:
            return path[path.index(node):] + [node]
        if node in done or node not in graph:
            return None
        path.append(node)
        for target in sorted(graph[node]):
            cycle = visit(target)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return None

    return next((c for c in map(visit, sorted(graph)) if c), None)


def test_import_graph_reads_relative_and_lazy_imports():
    graph = import_graph()
    portable = graph["preshuffle.kernels.portable"]
    assert {"preshuffle.device", "preshuffle.contract", "preshuffle.kernels.launch", "triton"} <= portable
    assert "preshuffle.benchmark" in graph["preshuffle.__main__"]          # imported inside a function
    assert {"preshuffle.kernels.launch", "preshuffle.kernels.backends"} <= graph["preshuffle.kernels"]
    assert "torch" in graph["preshuffle.device"]
    assert graph["preshuffle.precision"] == set()  # the names the torch-free report shares with the kernels


def test_find_cycle_finds_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_import_graph_has_no_cycle():
    assert find_cycle(import_graph()) is None


def reached_from(module: str) -> tuple[set[str], set[str]]:
    """The package's modules ``module`` reaches through its imports, and everything those import."""
    graph = import_graph()
    reached, todo = set(), [module]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(t for t in graph.get(name, ()) if t.startswith("preshuffle."))
    return reached, set().union(*(graph[m] for m in reached))


def harness(modules: set[str]) -> set[str]:
    forbidden = {"torch", "triton", "preshuffle.benchmark", "preshuffle.testing", "preshuffle.kernels"}
    return {m for m in modules if m in forbidden or m.startswith(("preshuffle.testing.", "preshuffle.kernels."))}


def test_report_imports_no_harness():
    reached, imported = reached_from("preshuffle.report")
    assert not harness(imported | reached)
    assert reached == {"preshuffle.report", "preshuffle.precision", "preshuffle.shapes", "preshuffle.provenance"}


# The package's rooms, lowest first (docs/package.md draws them): a module imports from its own room or from lower
# ones, never from a higher one. A name ending in "." is a subpackage, every module in it.
LAYERS = [
    ("base", {"preshuffle.precision", "preshuffle.arguments", "preshuffle.shapes", "preshuffle.internals",
              "preshuffle.device"}),
    ("model", {"preshuffle.layout", "preshuffle.paging", "preshuffle.negotiation", "preshuffle.cache",
               "preshuffle.contract", "preshuffle.problem", "preshuffle.reference", "preshuffle.access",
               "preshuffle.decode_model"}),
    ("product", {"preshuffle.kernels", "preshuffle.kernels.", "preshuffle.topk", "preshuffle.topk.selection",
                 "preshuffle.topk.backends",
                 "preshuffle.topk.portable", "preshuffle.topk.hopper", "preshuffle.topk.smem_ptx",
                 "preshuffle.deepgemm_compat"}),
    ("checks and measuring tools", {"preshuffle.testing", "preshuffle.testing.", "preshuffle.measure",
                                    "preshuffle.measure."}),
    ("teaching", {"preshuffle.teaching", "preshuffle.teaching.", "preshuffle.source", "preshuffle.topk.steps",
                  "preshuffle.topk.radix"}),
    ("runs and their reading", {"preshuffle.benchmark", "preshuffle.deepgemm", "preshuffle.report",
                                "preshuffle.vllm_call_report", "preshuffle.topk.report", "preshuffle.provenance"}),
    ("workbook and command line", {"preshuffle", "preshuffle.plots", "preshuffle.widgets", "preshuffle.__main__"}),
]


def layer_of(module: str, layers=LAYERS) -> int:
    """The index of ``module``'s room; KeyError for a module no room holds."""
    found = [i for i, (_, names) in enumerate(layers)
             if module in names or any(n.endswith(".") and module.startswith(n) for n in names)]
    if len(found) != 1:
        raise KeyError(f"{module} is in {len(found)} rooms of LAYERS: give it one")
    return found[0]


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Each import of ``graph`` from a module to one of the package's in a higher room."""
    return sorted(f"{m} ({layers[layer_of(m, layers)][0]}) imports {t} ({layers[layer_of(t, layers)][0]})"
                  for m, targets in graph.items() for t in targets
                  if t.startswith("preshuffle") and layer_of(t, layers) > layer_of(m, layers))


def test_every_module_is_in_one_room():
    for module in import_graph():
        layer_of(module)


def test_no_module_imports_from_a_higher_room():
    assert upward_imports(import_graph()) == []


def test_upward_imports_finds_an_arrow_up():
    layers = [("low", {"preshuffle.a"}), ("high", {"preshuffle.b."})]
    graph = {"preshuffle.a": {"preshuffle.b.c", "torch"}, "preshuffle.b.c": {"preshuffle.a"}}
    assert upward_imports(graph, layers) == ["preshuffle.a (low) imports preshuffle.b.c (high)"]
    with pytest.raises(KeyError, match="preshuffle.d is in 0 rooms"):
        layer_of("preshuffle.d", layers)


def test_the_cache_reads_block_tables_without_the_negotiation_model():
    reached, _ = reached_from("preshuffle.cache")
    assert "preshuffle.paging" in reached and "preshuffle.negotiation" not in reached


def test_the_product_imports_no_test_harness_or_teaching_code():
    graph = import_graph()
    product = {m for m in graph if layer_of(m) <= 2}
    assert not {t for m in product for t in graph[m]
                if t.startswith(("preshuffle.testing", "preshuffle.teaching", "preshuffle.measure"))}
    assert {m for m in graph if any(t.startswith("preshuffle.testing") for t in graph[m])} - {
        m for m in graph if m.startswith("preshuffle.testing")} == {
        "preshuffle.benchmark", "preshuffle.widgets", "preshuffle.teaching.exercises"}


CHAPTER = re.compile(r"\bchapters? \d+|\bthe chapter\b", re.I)


def comments_and_docstrings(text: str) -> list[str]:
    """A module's comments and its module, class and function docstrings."""
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    nodes = [n for n in ast.walk(ast.parse(text))
             if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    return comments + [doc for doc in map(ast.get_docstring, nodes) if doc]


def test_modules_speak_of_what_they_do_not_of_chapters():
    """The notebooks name modules; the modules do not name the notebooks' chapters."""
    hits = [f"{path.relative_to(PACKAGE)}: {m.group(0)!r}" for path in PACKAGE.rglob("*.py")
            for text in comments_and_docstrings(path.read_text()) for m in CHAPTER.finditer(text)]
    assert not hits, hits


def test_the_chapter_check_reads_comments_and_docstrings():
    text = "\"\"\"Chapter 3's steps.\"\"\"\nx = \"chapter 3\"  # as chapter 5 shows\n"
    assert [m.group(0) for t in comments_and_docstrings(text) for m in CHAPTER.finditer(t)] == ["chapter 5",
                                                                                              "Chapter 3"]
