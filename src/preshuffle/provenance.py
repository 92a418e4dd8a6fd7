"""What ties a committed run to the code it timed, and its figures to what was measured.

A run records the sha256 of its kernels' source: every ``@triton.jit``, ``@gluon.jit`` and ``constexpr_function``
function reachable from the kernels it launched (``roots``), each as ``ast.unparse`` of its definition (decorators
kept, comments and layout not), keyed by its name and sorted. The file a function lives in is no part of it, so
moving a kernel between modules keeps the digest; changing its code, or a helper's it calls, does not.

Two ways give the same digest: :func:`runtime_digest` from the functions a process has imported (what a benchmark
records as it runs), and :func:`source_digest` from the package's files as text (what a reader checks a run against,
with neither torch nor Triton; and, over ``git show`` of a commit's files, what a run made before digests were
recorded is given).

A row's measured values are sealed by :func:`seal` at run time: a sha256 over the row's own numbers, so an edited
time no longer matches its row.
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent
ROOT = PACKAGE.parents[1]

# The kernels a run launches, in parts a reader checks apart (a top-k run times the logits kernel too; its top-k
# figures hold while only the logits kernel has changed).
LOGITS = ("_paged_mqa_logits_kernel", "_hopper_kernel")
PARTS = {
    "logits": LOGITS,
    "portable": ("_paged_mqa_logits_kernel",),
    "bench": LOGITS + ("_tl_tma_kernel", "_per_block_grid_kernel", "_chunked_kernel"),
    "page_read": ("_page_read_kernel",),
    "topk": ("_topk_row_kernel", "_topk_hist_kernel", "_topk_reduce_kernel", "_topk_compact_kernel",
             "_topk_final_kernel", "_topk_hopper_kernel"),
    "topk_sm90": ("_topk_hopper_kernel",),  # the default launch on sm90, which the README's top-k column reads
}

_KERNEL_DECORATORS = ("jit", "constexpr_function")


def _is_kernel_def(node) -> bool:
    if not isinstance(node, ast.FunctionDef):
        return False
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if ast.unparse(target).split(".")[-1] in _KERNEL_DECORATORS:
            return True
    return False


def _normal_text(node: ast.FunctionDef) -> str:
    return ast.unparse(node)


def _called_names(node: ast.FunctionDef) -> set[tuple[str, ...]]:
    """Every name and dotted name the function's body reads: ``f`` as ("f",), ``px.f`` as ("px", "f")."""
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            out.add((sub.id,))
        elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name):
            out.add((sub.value.id, sub.attr))
    return out


def _digest(texts: list[tuple[str, str]]) -> str:
    return hashlib.sha256(json.dumps(sorted(texts)).encode()).hexdigest()


def _check_roots(roots) -> tuple[str, ...]:
    if isinstance(roots, str) or not roots or not all(isinstance(r, str) for r in roots):
        raise TypeError(f"roots must be a non-empty sequence of kernel names, got {roots!r}")
    return tuple(roots)


# --- From the package's files as text ---------------------------------------------------------------------------

def _module_name(path: str) -> str:
    parts = Path(path).with_suffix("").parts
    parts = parts[parts.index("preshuffle"):]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    base = module.split(".")
    base = base if is_package else base[:-1]
    base = base[:len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([target] if target else []))


def source_texts(files: dict[str, str], roots) -> list[tuple[str, str]]:
    """``(name, text)`` of the kernel functions reachable from ``roots`` in ``files`` (``{path: source}`` of the
    package's modules, paths ending in ``preshuffle/...py``): a name a kernel reads resolves, as Python would, to
    its module's own definition or to what the module imported under that name."""
    roots = _check_roots(roots)
    defs, names, is_package = {}, {}, {}
    for path, text in files.items():
        module = _module_name(path)
        is_package[module] = path.endswith("__init__.py")
        scope = names.setdefault(module, {})
        for node in ast.parse(text).body:
            if _is_kernel_def(node):
                defs[(module, node.name)] = node
                scope[node.name] = ("def", module, node.name)
            elif isinstance(node, ast.ImportFrom) and node.level:
                source = _resolve(module, is_package[module], node.level, node.module)
                for alias in node.names:
                    scope[alias.asname or alias.name] = ("from", source, alias.name)
    found = [(m, n) for (m, n) in defs if n in roots]
    missing = set(roots) - {n for _, n in found}
    if missing:
        raise ValueError(f"roots {sorted(missing)} are not kernel functions of the package")
    duplicated = sorted({n for _, n in found if sum(1 for _, k in found if k == n) > 1})
    if duplicated:
        raise ValueError(f"roots {duplicated} name kernels of several modules")

    def lookup(module, name, depth=0):
        entry = names.get(module, {}).get(name)
        if entry is None or depth > 8:
            return None
        kind, where, what = entry
        if kind == "def":
            return (where, what)
        if (where, what) in defs:
            return (where, what)
        if where + "." + what in names:  # `from . import smem_ptx`: a module
            return ("module", where + "." + what)
        return lookup(where, what, depth + 1)

    texts, todo, seen = [], list(found), set()
    while todo:
        key = todo.pop()
        if key in seen:
            continue
        seen.add(key)
        module, name = key
        node = defs[key]
        texts.append((name, _normal_text(node)))
        for called in _called_names(node):
            target = lookup(module, called[0])
            if target and target[0] == "module" and len(called) == 2:
                target = lookup(target[1], called[1]) or ((target[1], called[1]) if (target[1], called[1]) in defs
                                                          else None)
            if target and target[0] != "module" and target in defs:
                todo.append(target)
    return texts


def package_files(root: Path = PACKAGE) -> dict[str, str]:
    """``{path: source}`` of the package's modules on disk."""
    return {str(p.relative_to(root.parent)): p.read_text() for p in sorted(root.rglob("*.py"))}


def commit_files(commit: str, repo: Path = ROOT) -> dict[str, str]:
    """``{path: source}`` of the package's modules at ``commit`` of the repository ``repo``."""
    listing = subprocess.run(["git", "ls-tree", "-r", "--name-only", commit, "src/preshuffle"], cwd=repo,
                             capture_output=True, text=True, check=True).stdout.split()
    return {path: subprocess.run(["git", "show", f"{commit}:{path}"], cwd=repo, capture_output=True, text=True,
                                 check=True).stdout for path in listing if path.endswith(".py")}


def source_digest(roots, files: dict[str, str] | None = None) -> str:
    """The digest of the kernels reachable from ``roots`` in ``files`` (default: the package on disk)."""
    return _digest(source_texts(package_files() if files is None else files, roots))


# --- From the functions a process has imported ------------------------------------------------------------------

def _python_function(obj):
    """The Python function under one of the package's Triton or Gluon kernel functions (``fn``), or None for
    anything else (Triton's own, such as ``tl.sum``, are Triton's version's, which the run records)."""
    fn = getattr(obj, "fn", None)
    if (inspect.isfunction(fn) and type(obj).__module__.startswith("triton")
            and fn.__module__.split(".")[0] == "preshuffle"):
        return fn
    return None


def _import_defining(roots) -> None:
    """Import the package's modules that define ``roots`` (a kernel a run did not launch, such as the Hopper kernel
    off an sm90 GPU, may not be imported yet)."""
    import importlib

    for path, text in package_files().items():
        if any(isinstance(n, ast.FunctionDef) and n.name in roots for n in ast.parse(text).body):
            importlib.import_module(_module_name(path))


def runtime_texts(roots) -> list[tuple[str, str]]:
    """:func:`source_texts` from the kernels this process has imported (``inspect.getsource`` of each), following
    the names each one reads through its module's globals."""
    roots = _check_roots(roots)
    _import_defining(roots)
    by_name: dict[str, list] = {}
    for name, module in list(sys.modules.items()):
        if not (name == "preshuffle" or name.startswith("preshuffle.")) or module is None:
            continue
        for attr, value in list(vars(module).items()):
            fn = _python_function(value)
            if fn is not None and fn.__module__ == name and fn.__name__ == attr and attr in roots:
                by_name.setdefault(attr, []).append(value)
    missing = set(roots) - set(by_name)
    if missing:
        raise ValueError(f"roots {sorted(missing)} are not kernel functions this process has imported")
    texts, todo, seen = [], [v[0] for v in by_name.values()], set()
    while todo:
        obj = todo.pop()
        fn = _python_function(obj)
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
        texts.append((fn.__name__, _normal_text(node)))
        for called in _called_names(node):
            value = fn.__globals__.get(called[0])
            if len(called) == 2 and inspect.ismodule(value):
                value = getattr(value, called[1], None)
            if _python_function(value) is not None:
                todo.append(value)
    return texts


def runtime_digest(roots) -> str:
    return _digest(runtime_texts(roots))


def kernels_record(*parts: str) -> dict:
    """What a run records of its kernels: ``{part: {"roots": [...], "sha256": ...}}`` for parts of :data:`PARTS`."""
    unknown = [p for p in parts if p not in PARTS]
    if not parts or unknown:
        raise ValueError(f"parts must be names of {sorted(PARTS)}, got {list(parts)}")
    return {p: {"roots": list(PARTS[p]), "sha256": runtime_digest(PARTS[p])} for p in parts}


# --- Reading a committed run ------------------------------------------------------------------------------------

def staleness(record: dict, part: str | None = None, files: dict[str, str] | None = None) -> str | None:
    """Why ``record`` (a results file's object) no longer measures the package's kernels (only ``part``'s, if
    given), or None if it does: it records no digest of them, or their source has changed since."""
    if not isinstance(record, dict):
        raise TypeError(f"record must be a results object, got {type(record).__name__}")
    kernels = (record.get("provenance") or {}).get("kernels")
    if not isinstance(kernels, dict) or not kernels:
        return "it records no digest of its kernels' source"
    if part is not None and part not in kernels:
        return f"it records no digest of its {part} kernels' source"
    for name, entry in kernels.items() if part is None else [(part, kernels[part])]:
        if not isinstance(entry, dict) or not entry.get("sha256"):
            return f"it records no digest of its {name} kernels' source" + (
                f" ({entry['why']})" if isinstance(entry, dict) and entry.get("why") else "")
        now = source_digest(entry["roots"], files)
        if now != entry["sha256"]:
            return f"its {name} kernels' source has changed since (digest {entry['sha256'][:12]}, now {now[:12]})"
    return None


def refuse_stale(record: dict, source: str = "record", part: str | None = None) -> dict:
    """``record``, or ValueError naming ``source`` if :func:`staleness` finds it stale."""
    why = staleness(record, part)
    if why:
        raise ValueError(f"{source} is stale: {why}")
    return record


def is_ancestor(commit: str, repo: Path = ROOT) -> bool | None:
    """Whether ``commit`` is an ancestor of ``repo``'s HEAD; None where the history cannot say (no ``.git``, a
    shallow clone, or a copy of the tree committed afresh as a single commit)."""
    if not isinstance(commit, str) or not commit:
        raise TypeError(f"commit must be a commit id, got {commit!r}")
    def git(*args):
        return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    try:
        shallow = git("rev-parse", "--is-shallow-repository")
    except OSError:
        return None
    if shallow.returncode or shallow.stdout.strip() != "false":
        return None
    if git("rev-list", "--count", "HEAD").stdout.strip() == "1":
        return None
    # A copy of the tree committed on another history (its commit named by PRESHUFFLE_GIT_COMMIT, what a run there
    # records) cannot place the project's commits either.
    named = os.environ.get("PRESHUFFLE_GIT_COMMIT")
    if named and not git("rev-parse", "HEAD").stdout.strip().startswith(named):
        return None
    return git("merge-base", "--is-ancestor", commit, "HEAD").returncode == 0


# --- Sealing a row's measurements ---------------------------------------------------------------------------------

SEAL_KEY = "sha256"


def _numbers(value, path=""):
    if isinstance(value, dict):
        for k in sorted(value):
            if k != SEAL_KEY:
                yield from _numbers(value[k], f"{path}.{k}")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _numbers(v, f"{path}[{i}]")
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path, repr(float(value))


def row_checksum(row: dict) -> str:
    """sha256 over every number of ``row`` (its key path and value, at full precision), the seal left out."""
    if not isinstance(row, dict):
        raise TypeError(f"row must be a dict, got {type(row).__name__}")
    return hashlib.sha256("\n".join(f"{p}={v}" for p, v in _numbers(row)).encode()).hexdigest()


def seal(row: dict) -> dict:
    """``row`` with its :func:`row_checksum` under :data:`SEAL_KEY` (in place; returned)."""
    row[SEAL_KEY] = row_checksum(row)
    return row


def broken_seals(rows) -> list[int]:
    """Indices of ``rows`` whose seal is missing or no longer matches their numbers."""
    return [i for i, row in enumerate(rows) if not isinstance(row, dict) or row.get(SEAL_KEY) != row_checksum(row)]


def row_lists(record: dict) -> dict[str, list]:
    """The lists of rows of a results object: its top-level values that are lists of objects (``rows``, a top-k
    run's ``shapes``, ...), each row sealed apart."""
    if not isinstance(record, dict):
        raise TypeError(f"record must be a results object, got {type(record).__name__}")
    return {k: v for k, v in record.items() if isinstance(v, list) and v and all(isinstance(r, dict) for r in v)}


def _rest(record: dict) -> dict:
    lists = row_lists(record)
    return {k: v for k, v in record.items() if k not in lists}


def seal_record(record: dict) -> dict:
    """``record`` with every row of :func:`row_lists` sealed, and the numbers outside them under the record's own
    seal (in place; returned)."""
    for rows in row_lists(record).values():
        for row in rows:
            seal(row)
    record[SEAL_KEY] = row_checksum(_rest(record))
    return record


def broken_record_seals(record: dict) -> list[str]:
    """Where ``record``'s seals are missing or broken: ``"rows[3]"`` for a row, ``"record"`` for the numbers
    outside its rows."""
    out = [f"{key}[{i}]" for key, rows in row_lists(record).items() for i in broken_seals(rows)]
    if record.get(SEAL_KEY) != row_checksum(_rest(record)):
        out.append("record")
    return out
