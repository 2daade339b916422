"""Where measurements go, for the scale report and the benchmarks alike: a
Markdown table from rows (printed, it is the terminal's table too), the JSON
file, and PNG plots. matplotlib is an optional extra, imported only when a
plot is drawn."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

NO_MATPLOTLIB = "error: the plots need matplotlib: pip install 'toposerve[scale]'"


def row(cells: Iterable[object]) -> str:
    """One Markdown table line; an empty cell stays one space wide."""
    return "|" + "|".join(f" {c} " if str(c) else " " for c in cells) + "|"


def table(head: Sequence[object], rows: Iterable[Iterable[object]], align: str = "") -> str:
    """A Markdown table: ``head`` and a line per row. ``align`` has a letter
    a column, ``r`` right-aligned (numbers) or ``l``; without it, all left."""
    rule = "|" + "".join("---:|" if a == "r" else "---|" for a in align or "l" * len(head))
    return "\n".join([row(head), rule, *(row(r) for r in rows)])


def pyplot() -> ModuleType:
    """matplotlib.pyplot drawing to files (the Agg backend); without the
    extra installed, one line that says how to get it."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit(NO_MATPLOTLIB) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, path: Path, dpi: int = 110, **layout: Any) -> None:
    """``fig`` laid out (``layout``: tight_layout's arguments) to a PNG, then closed."""
    fig.tight_layout(**layout)
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def landed_bars(ax: Any, by_rack: dict[str, dict[str, float]], groups: list[str],
                **bar: Any) -> list[str]:
    """Where groups landed: a stacked bar a rack of each group's GPUs there,
    one colour a group (the same group, the same colour on every axis given
    the same ``groups``); the racks, in the bars' order."""
    cmap = pyplot().get_cmap("tab20")
    racks = sorted(by_rack)
    bottom = [0.0] * len(racks)
    for i, g in enumerate(groups):
        vals = [by_rack[r].get(g, 0) for r in racks]
        ax.bar(range(len(racks)), vals, bottom=bottom, color=cmap(i % 20), label=g,
               edgecolor="white", **bar)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    return racks


def write_json(path: Path, doc: Any, indent: int = 2) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=indent))


def write(out: Path, name: str, md: str, doc: dict[str, Any],
          plot: Callable[[Path], None] | None = None) -> None:
    """Prints ``md`` and writes ``name``.md, .json (``doc`` with a time
    stamp) and, given a ``plot``, .png into ``out``."""
    print(md)
    write_json(out / f"{name}.json", {"when": time.strftime("%Y%m%dT%H%M%S"), **doc})
    (out / f"{name}.md").write_text(md + "\n")
    if plot is not None:
        plot(out / f"{name}.png")
    print(f"wrote {out / name}.json, .md" + (" and .png" if plot else ""), file=sys.stderr)
