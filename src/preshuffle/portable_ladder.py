"""The ladder the portable kernel climbed on the H200: each version of benchmarks/NOTES.md, the ideas it added and
its recorded share of the copy ceiling, read from ``results/h200-ladder-portable.json``; the last version's
figures are read from the portable kernel's final sweep, ``results/h200-portable-703f0c9.json``. Torch-free, like
:mod:`preshuffle.report`.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import dataclass
from pathlib import Path

from . import report
from .shapes import Shape

LADDER = report.RESULTS / "h200-ladder-portable.json"


@dataclass(frozen=True)
class Figure:
    """One recorded measurement; ``us`` or ``pct_copy`` is None where the notes did not record it."""

    shape: Shape
    us: float | None = None
    pct_copy: float | None = None

    def __str__(self) -> str:
        time = f"{self.us:.0f} us" if self.us is not None else "time not recorded"
        share = f", {self.pct_copy:.0f}% of the copy ceiling" if self.pct_copy is not None else ""
        return f"{self.shape.label}: {time}{share}"


@dataclass(frozen=True)
class Rung:
    version: int
    change: str
    ideas: dict[str, str]   # key -> a few words; one per step of chapter 3
    figures: tuple[Figure, ...]
    source: str             # where the figures come from
    note: str = ""
    dropped: bool = False

    def figure(self, shape: Shape) -> Figure | None:
        return next((f for f in self.figures if f.shape == shape), None)


@dataclass(frozen=True)
class Ladder:
    provenance: dict
    rungs: tuple[Rung, ...]

    def rung(self, idea: str) -> Rung:
        """The version that added ``idea``."""
        for r in self.rungs:
            if idea in r.ideas:
                return r
        known = [i for r in self.rungs for i in r.ideas]
        raise ValueError(f"idea must be one of {known}, got {idea!r}")

    def describe(self, idea: str) -> str:
        """What the H200 measured for ``idea``, with its source: its version's figures (said to be shared when
        that version added other ideas too) and the version's note."""
        r = self.rung(idea)
        others = [words for key, words in r.ideas.items() if key != idea]
        if r.dropped:
            head = f"version {r.version}, tried and dropped"
        elif others:
            head = f"version {r.version}; not measured separately: added together with {' and '.join(others)}"
        else:
            head = f"version {r.version}"
        note = textwrap.fill(r.note, 116, initial_indent="  ", subsequent_indent="  ")
        return "\n".join([f"H200 ({r.source}), {head}", *(f"  {f}" for f in r.figures), note])

    def provenance_line(self) -> str:
        p = self.provenance
        return (f"{p['gpu']} ({p['sms']} SMs, driver {p['driver']}), torch {p['torch']}, Triton {p['triton']}, "
                f"{p['date']}; copy ceiling {p['copy_ceiling']}")

    @property
    def shapes(self) -> tuple[Shape, ...]:
        """Every shape a figure was recorded at, in order of appearance."""
        return tuple(dict.fromkeys(f.shape for r in self.rungs for f in r.figures))

    def format(self) -> str:
        """One line per version: its figures at every recorded shape ('-' where none) and the ideas it added."""
        header = f"{'version':7s}" + "".join(f" {s.label:>26s}" for s in self.shapes) + "  ideas"
        lines = [header, "-" * (len(header) + 60)]
        for r in self.rungs:
            cells = []
            for s in self.shapes:
                f = r.figure(s)
                us = f"{f.us:.0f} us" if f and f.us is not None else "-"
                pct = f"{f.pct_copy:.0f}%" if f and f.pct_copy is not None else "-"
                cells.append(f" {us:>18s} {pct:>7s}")
            ideas = ", ".join(r.ideas.values()) + (" (dropped)" if r.dropped else "")
            lines.append(f"{r.version:<7d}" + "".join(cells) + f"  {ideas}")
        return "\n".join(lines)


def _recorded(entry: dict) -> tuple[Figure, ...]:
    return tuple(Figure(Shape(**f["shape"]), f.get("us"), f.get("pct_copy")) for f in entry["figures"])


def _measured(entry: dict, record: dict) -> tuple[Figure, ...]:
    """The figures of ``entry["variant"]`` at ``entry["shapes"]`` in a sweep of the portable kernel (the format of
    results/h200-portable-703f0c9.json): the kernel rows of the launch rule's split."""
    rows = {Shape(**r["shape"]): r for r in record["rows"]
            if r["kind"] == "kernel" and r["variant"] == entry["variant"] and r.get("rule")}
    return tuple(Figure(shape, rows[shape]["us"], rows[shape]["pct_copy"]) for shape in
                 (Shape(**s) for s in entry["shapes"]))


def load(path: str | Path = LADDER) -> Ladder:
    """The ladder of ``path``; a version with ``figures_from`` reads them from that results file (a path from the
    repository's root), at its ``shapes``, from the rows of its ``variant`` with the package's launch rule."""
    with open(path) as f:
        data = json.load(f)
    rungs = []
    for entry in data["versions"]:
        if "figures_from" in entry:
            record = report.load(report.RESULTS.parent / entry["figures_from"])
            figures = _measured(entry, record)
            source = (f"{entry['figures_from']}, commit {record['provenance']['git_commit'][:7]}, "
                      f"{record['provenance']['date'][:10]}, {entry['variant']}")
        else:
            figures, source = _recorded(entry), f"benchmarks/NOTES.md, {data['provenance']['date']}"
        rungs.append(Rung(entry["version"], entry["change"], entry["ideas"], figures, source, entry.get("note", ""),
                          entry.get("dropped", False)))
    return Ladder(data["provenance"], tuple(rungs))
