"""The package's own code as a notebook shows it: read from the module, so the page cannot drift from what runs."""

from __future__ import annotations

import ast
import difflib
import inspect
import textwrap


def _function(obj):
    fn = getattr(obj, "fn", obj)  # @triton.jit and @gluon.jit wrap the function they compile
    try:
        return fn, inspect.getsource(fn)
    except TypeError as exc:
        raise TypeError(f"obj must be a function or class with Python source, got {type(obj).__name__}") from exc


def source(obj, start: str | None = None, stop: str | None = None) -> str:
    """The source of a function or class of the package (a Triton or Gluon kernel's Python function too), dedented.

    ``start``: begin at the first line that contains it; ``stop``: end before the first line after that which
    contains it. Either missing from the code raises ValueError, so a page that names a block of code notices when
    the block is gone."""
    fn, text = _function(obj)
    lines = text.splitlines()
    name = getattr(fn, "__qualname__", repr(fn))
    first = 0
    if start is not None:
        first = next((i for i, line in enumerate(lines) if start in line), None)
        if first is None:
            raise ValueError(f"start {start!r} is not in the source of {name}")
    last = len(lines)
    if stop is not None:
        last = next((i for i, line in enumerate(lines) if i > first and stop in line), None)
        if last is None:
            raise ValueError(f"stop {stop!r} is not in the source of {name} after {start!r}")
    return textwrap.dedent("\n".join(lines[first:last])).rstrip()


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _trailing_comment(line: str) -> str | None:
    """The ``# ...`` that ends a line of code, if any (a ``#`` inside a string literal is not one)."""
    code = line.split("#", 1)[0]
    if "#" not in line or code.count('"') % 2 or code.count("'") % 2:
        return None
    return "#" + line.split("#", 1)[1]


def specialize(obj, **constexprs: bool) -> str:
    """The source of a kernel with some of its ``tl.constexpr`` switches fixed, as Triton compiles it: every
    ``if SWITCH:`` on one of ``constexprs`` replaced by the branch it takes (its comment kept above it), and the
    switches dropped from the signature. Triton resolves such an ``if`` when it compiles, so the text is the kernel
    that runs with those values.

    ValueError names a switch the kernel has no parameter for, one it uses other than as an ``if``'s whole test
    (the text would still need it), and an ``elif`` on a switch; TypeError a value that is not a bool."""
    fn, text = _function(obj)
    name = getattr(fn, "__qualname__", repr(fn))
    for switch, value in constexprs.items():
        if not isinstance(value, bool):
            raise TypeError(f"{switch} must be a bool, got {type(value).__name__} {value!r}")
    text = textwrap.dedent(text)
    tree = ast.parse(text)
    function = tree.body[0]
    params = {a.arg: a for a in function.args.args}
    unknown = sorted(set(constexprs) - set(params))
    if unknown:
        raise ValueError(f"{name} has no parameter {unknown[0]!r}")
    lines = text.splitlines()

    switched = []  # (node, the branch taken)
    for node in ast.walk(function):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id in constexprs:
            if lines[node.lineno - 1].lstrip().startswith("elif") or (
                    len(node.orelse) == 1 and isinstance(node.orelse[0], ast.If)
                    and lines[node.orelse[0].lineno - 1].lstrip().startswith("elif")):
                raise ValueError(f"{name}: an elif on {node.test.id} is not taken by specialize")
            switched.append((node, constexprs[node.test.id]))
    tests = {id(node.test) for node, _ in switched}
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and node.id in constexprs and id(node) not in tests:
            raise ValueError(f"{name} uses {node.id} at line {node.lineno} other than as an if's test")

    # Line edits from the bottom up, so that the line numbers above stay valid.
    for node, value in sorted(switched, key=lambda item: item[0].lineno, reverse=True):
        head = node.lineno - 1                          # the `if` line
        end = node.end_lineno                           # one past the node's last line
        if node.orelse:
            else_line = next(i for i in range(node.body[-1].end_lineno, node.orelse[0].lineno)
                             if lines[i].lstrip().startswith("else"))
        if value:
            first, last, header = head + 1, else_line if node.orelse else end, lines[head]
        elif node.orelse:
            first, last, header = else_line + 1, end, lines[else_line]
        else:
            first, last, header = end, end, lines[head]
        kept = lines[first:last]
        depth = min((_indent(line) for line in kept if line.strip()), default=0) - _indent(lines[head])
        kept = [line[depth:] if line.strip() else line for line in kept]
        comment = _trailing_comment(header)
        if comment and kept:
            kept.insert(0, " " * _indent(lines[head]) + comment)
        lines[head:end] = kept

    # The switches leave the signature; a line they leave with only a comment goes too.
    signature_lines = set()
    for switch in sorted(constexprs, key=lambda s: (params[s].lineno, params[s].col_offset), reverse=True):
        arg = params[switch]
        row = arg.lineno - 1
        line = lines[row]
        before, rest = line[:arg.col_offset], line[arg.end_col_offset:]
        if rest.lstrip().startswith(","):  # its comma goes with it
            rest = rest.lstrip()[1:].lstrip(" ")
        elif before.rstrip().endswith(","):  # the last parameter: the comma before it goes
            before = before.rstrip()[:-1]
        lines[row] = before + rest
        signature_lines.add(row)
    for row in sorted(signature_lines, reverse=True):
        if lines[row].strip().startswith("#") or not lines[row].strip():
            del lines[row]
    return "\n".join(lines).rstrip()


def changes(before: str, after: str, context: int = 1) -> str:
    """What changed from one listing to the next, as a diff a page can print: removed lines ``- ``, added ``+ ``,
    ``context`` unchanged lines around each change, ``...`` between the pieces. Empty when nothing changed."""
    if not isinstance(before, str) or not isinstance(after, str):
        raise TypeError(f"before and after must be str, got {type(before).__name__} and {type(after).__name__}")
    if isinstance(context, bool) or not isinstance(context, int) or context < 0:
        raise ValueError(f"context must be a non-negative int, got {context!r}")
    out = []
    for line in difflib.unified_diff(before.splitlines(), after.splitlines(), n=context, lineterm=""):
        if line.startswith(("---", "+++")):
            continue
        if line.startswith("@@"):
            if out:
                out.append("...")
            continue
        out.append(f"{line[0]} {line[1:]}" if line[0] in "+-" else f"  {line[1:]}")
    return "\n".join(out)
