"""What the benchmarks share in reporting: percentiles, medians over
repeats, and their outputs (a Markdown table printed and written, JSON, a
PNG plot)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def medians(runs: list[T], keys: tuple[str, ...],
            summed: tuple[str, ...] = ("requests", "failed")) -> list[T]:
    """One row per distinct ``keys``, in first-seen order: the median of each
    measure over repeats, and the sum of the ``summed`` counts."""
    groups: dict[tuple[Any, ...], list[T]] = {}
    for r in runs:
        groups.setdefault(tuple(getattr(r, k) for k in keys), []).append(r)
    out = []
    for key, rs in groups.items():
        vals: dict[str, Any] = dict(zip(keys, key, strict=True))
        vals.update({s: sum(getattr(r, s) for r in rs) for s in summed})
        for f in fields(rs[0]):  # type: ignore[arg-type]
            if f.name not in vals:
                vals[f.name] = statistics.median(getattr(r, f.name) for r in rs)
        out.append(type(rs[0])(**vals))
    return out


def write(out: Path, name: str, md: str, doc: dict[str, Any],
          plot: Callable[[Path], None] | None = None) -> None:
    """Prints ``md`` and writes ``name``.md, .json (``doc`` with a time
    stamp) and, given a ``plot``, .png into ``out``."""
    print(md)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(
        {"when": time.strftime("%Y%m%dT%H%M%S"), **doc}, indent=2))
    (out / f"{name}.md").write_text(md + "\n")
    if plot is not None:
        plot(out / f"{name}.png")
    print(f"wrote {out / name}.json, .md" + (" and .png" if plot else ""), file=sys.stderr)
