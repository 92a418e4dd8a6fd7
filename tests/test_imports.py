"""The package's import graph, read from its source with ``ast``: every import anywhere in a module (a lazy one
inside a function closes a circle as surely as one at the top)."""

import ast
from pathlib import Path

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
    assert {"preshuffle.kernels.launch", "preshuffle.kernels.portable"} <= graph["preshuffle.kernels"]
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
