"""The package's own code as a chapter shows it: read from the module, so the page cannot drift from what runs."""

from __future__ import annotations

import inspect
import textwrap


def source(obj, start: str | None = None, stop: str | None = None) -> str:
    """The source of a function or class of the package (a Triton or Gluon kernel's Python function too), dedented.

    ``start``: begin at the first line that contains it; ``stop``: end before the first line after that which
    contains it. Either missing from the code raises ValueError, so a chapter that names a block of code notices when
    the block is gone."""
    fn = getattr(obj, "fn", obj)  # @triton.jit and @gluon.jit wrap the function they compile
    try:
        lines = inspect.getsource(fn).splitlines()
    except TypeError as exc:
        raise TypeError(f"obj must be a function or class with Python source, got {type(obj).__name__}") from exc
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
