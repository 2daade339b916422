"""What the benchmarks share in reporting beyond toposerve.localcluster.results (the
tables, JSON and plots): medians over repeats, and the table of latencies
summed up by toposerve.localcluster.scale.measure.latency_ms."""

from __future__ import annotations

import statistics
from dataclasses import fields
from typing import Any, TypeVar

from toposerve.localcluster.results import table
from toposerve.localcluster.scale.measure import percentile

T = TypeVar("T")


def pct(values: list[float], q: float) -> float:
    """The observed value at quantile ``q`` (so a p99 is a request that happened)."""
    return percentile(values, q, nearest=True)


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


def latency_table(rows: dict[str, dict[str, Any]], what: str = "what") -> str:
    """A row of n, p50, p99 and max (ms) for each ``latency_ms`` summary, by its name."""
    return table([what, "n", "p50 (ms)", "p99 (ms)", "max (ms)"],
                 ([k, v["n"], v["p50_ms"], v["p99_ms"], v["max_ms"]] for k, v in rows.items()),
                 "lrrrr")
