"""The figures of a scale run: when each pod was bound and each claim
allocated (from watches), pods/s over time, latency percentiles, the
extender's call latency and the apiserver's request rates (from their
/metrics), CPU and memory of every process (from /proc, via psutil)."""

from __future__ import annotations

import math
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psutil
import urllib3
from prometheus_client.parser import text_string_to_metric_families

from toposerve.kubeapi import JsonApi, Reflector

K = TypeVar("K")

# -- pure ---------------------------------------------------------------------


def percentile(values: Iterable[float], q: float, nearest: bool = False) -> float:
    """Linear interpolation between closest ranks, or with ``nearest`` the
    value at rank ``q * n`` (always one observed: the benchmarks' tables);
    NaN for no values."""
    s = sorted(values)
    if not s:
        return math.nan
    if nearest:
        return s[min(len(s) - 1, int(q * len(s)))]
    k = (len(s) - 1) * q
    lo = math.floor(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def latency_ms(seconds: list[float]) -> dict[str, Any]:
    """How many, and p50, p99 (observed values) and the longest in ms to 0.1 ms
    (None without any)."""
    def ms(x: float) -> float | None:
        return None if x != x else round(1000 * x, 1)  # NaN: no values
    return {"n": len(seconds), "p50_ms": ms(percentile(seconds, 0.5, nearest=True)),
            "p99_ms": ms(percentile(seconds, 0.99, nearest=True)),
            "max_ms": ms(max(seconds, default=math.nan))}


def timeline(times: Iterable[float], start: float, step: float = 1.0) -> list[tuple[float, float]]:
    """(seconds since ``start``, events a second) in bins of ``step``."""
    bins: dict[int, int] = defaultdict(int)
    for t in times:
        bins[int((t - start) // step)] += 1
    if not bins:
        return []
    return [(i * step, bins.get(i, 0) / step) for i in range(min(0, *bins), max(bins) + 1)]


def histogram_quantile(buckets: list[tuple[float, float]], q: float) -> float:
    """Prometheus' estimate from cumulative (upper bound, count) buckets:
    linear within the bucket the rank falls in."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return prev_le
            width = count - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / width if width else 1.0)
        prev_le, prev_count = le, count
    return prev_le


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(s.labels), s.value) for fam in text_string_to_metric_families(text)
            for s in fam.samples if s.name == name]


def gates_enabled(text: str, gates: Iterable[str]) -> dict[str, bool]:
    """Whether a component's /metrics text reports each gate on (its
    ``kubernetes_feature_enabled``): what it runs with, not what it was asked."""
    seen = {labels.get("name"): value == 1
            for labels, value in samples(text, "kubernetes_feature_enabled")}
    return {g: seen.get(g, False) for g in sorted(set(gates))}


def call_latency(before: str, after: str, metric: str = "toposerve_extender_call_seconds",
                 by: tuple[str, ...] = ("verb",)) -> dict[str, dict[str, float]]:
    """The ``by`` labels' values (joined by "/": a verb, or verb/phase) ->
    {calls, p50_ms, p99_ms} over the calls made between two scrapes."""
    def buckets(text: str) -> dict[str, dict[float, float]]:
        out: dict[str, dict[float, float]] = defaultdict(dict)
        for labels, v in samples(text, metric + "_bucket"):
            out["/".join(labels.get(k, "") for k in by)][float(labels["le"])] = v
        return out
    b0, b1 = buckets(before), buckets(after)
    result = {}
    for verb, bs in b1.items():
        delta = [(le, c - b0.get(verb, {}).get(le, 0.0)) for le, c in bs.items()]
        calls = max(c for _, c in delta) if delta else 0
        result[verb] = {"calls": calls, "p50_ms": 1000 * histogram_quantile(delta, 0.5),
                        "p99_ms": 1000 * histogram_quantile(delta, 0.99)}
    return result


def totals(text: str, name: str, key: Callable[[dict[str, str]], K]) -> dict[K, float]:
    """A metric's samples summed by ``key`` of their labels."""
    out: dict[K, float] = defaultdict(float)
    for labels, v in samples(text, name):
        out[key(labels)] += v
    return out


def _deltas(before: str, after: str, name: str,
            key: Callable[[dict[str, str]], K]) -> dict[K, float]:
    """What grew between two scrapes, summed by ``key`` of the labels."""
    t0, t1 = totals(before, name, key), totals(after, name, key)
    return {k: v - t0.get(k, 0.0) for k, v in t1.items() if v - t0.get(k, 0.0) > 0}


def _verb_resource(labels: dict[str, str]) -> tuple[str, str]:
    res = labels.get("resource", "")
    if labels.get("subresource"):
        res += "/" + labels["subresource"]
    return labels.get("verb", ""), res or "(none)"


def request_rates(before: str, after: str, seconds: float, top: int = 15
                  ) -> list[dict[str, Any]]:
    """The apiserver's requests a second by verb and resource between two
    scrapes of its ``apiserver_request_total``, busiest first."""
    grown = _deltas(before, after, "apiserver_request_total", _verb_resource)
    rows: list[dict[str, Any]] = [{"verb": verb, "resource": res, "per_s": d / seconds,
                                   "requests": d}
                                  for (verb, res), d in grown.items()]
    rows.sort(key=lambda r: -r["requests"])
    return rows[:top]


def by_label(name: str) -> Callable[[dict[str, str]], str]:
    """A key for ``totals``: one label's value."""
    return lambda labels: labels.get(name, "")


def scheduler_work(before: str, after: str) -> dict[str, Any]:
    """Between two scrapes of kube-scheduler's /metrics: its attempts by
    result, and the seconds spent per extension point (a pod tried again and
    again shows as unschedulable attempts; a slow plugin as its point's seconds)."""
    return {"attempts": _deltas(before, after, "scheduler_schedule_attempts_total",
                                by_label("result")),
            "attempt_s": _deltas(before, after,
                                 "scheduler_scheduling_attempt_duration_seconds_sum",
                                 by_label("result")),
            "point_s": _deltas(before, after,
                               "scheduler_framework_extension_point_duration_seconds_sum",
                               by_label("extension_point"))}


# -- I/O ----------------------------------------------------------------------


def scrape(api: Any, path: str = "/metrics") -> str:
    """The apiserver's own metrics text, with the cluster's credentials."""
    return JsonApi(api).text(path)


def scrape_url(url: str) -> str:
    r = urllib3.PoolManager().request("GET", url, timeout=10, retries=False)
    return str(r.data.decode())


class Watched:
    """When each object of a path was first seen in each of some states
    (each ``when`` returns the object's key once it is in its state), from
    one LIST+WATCH: one stream however many states are timed."""

    def __init__(self, rest: JsonApi, path: str, selector: str,
                 when: Callable[[dict[str, Any]], str | None],
                 **more: Callable[[dict[str, Any]], str | None]) -> None:
        self._whens = {"": when, **more}
        self._at: dict[str, dict[str, float]] = {k: {} for k in self._whens}
        self.deleted: set[str] = set()
        self.errors = 0
        self._lock = threading.Lock()
        query = [("labelSelector", selector)] if selector else []
        self._r = Reflector(rest, path, query, self._list, self._event, self._error)
        self._t = threading.Thread(target=self._r.run, name=f"watch{path}", daemon=True)

    def start(self) -> Watched:
        self._t.start()
        return self

    def _seen(self, obj: dict[str, Any]) -> None:
        now = time.monotonic()
        for state, when in self._whens.items():
            key = when(obj)
            if key is not None:
                with self._lock:
                    self._at[state].setdefault(key, now)

    def _list(self, items: list[dict[str, Any]], rv: int) -> None:
        for o in items:
            self._seen(o)

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            with self._lock:
                self.deleted.add(obj["metadata"]["name"])
        else:
            self._seen(obj)

    def _error(self, err: Exception) -> None:
        self.errors += 1

    def snapshot(self, state: str = "") -> dict[str, float]:
        """Key -> first seen, for ``when`` (``""``) or one of ``more`` by name."""
        with self._lock:
            return dict(self._at[state])

    def stop(self) -> None:
        self._r.stop()
        self._t.join(10)


def bound_pod(obj: dict[str, Any]) -> str | None:
    return obj["metadata"]["name"] if (obj.get("spec") or {}).get("nodeName") else None


def claim_pod(obj: dict[str, Any]) -> str | None:
    """The owning pod's name, once the controller-manager made the claim."""
    owners = obj["metadata"].get("ownerReferences") or []
    return next((o["name"] for o in owners if o.get("kind") == "Pod"), None)


def allocated_claim_pod(obj: dict[str, Any]) -> str | None:
    """The owning pod's name, once the claim is allocated."""
    return claim_pod(obj) if (obj.get("status") or {}).get("allocation") else None


@dataclass
class ProcStat:
    name: str
    pid: int
    cpu_s: float = 0.0
    peak_rss_mib: float = 0.0
    first_cpu: float | None = None


@dataclass
class ProcSampler:
    """CPU seconds used and peak RSS of each named process while it runs."""

    interval: float = 1.0
    procs: dict[int, ProcStat] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _thread: threading.Thread | None = None

    def watch(self, pids: dict[int, str]) -> None:
        with self._lock:
            for pid, name in pids.items():
                self.procs.setdefault(pid, ProcStat(name, pid))
        self.sample()

    def sample(self) -> None:
        with self._lock:
            stats = list(self.procs.values())
        for st in stats:
            try:
                p = psutil.Process(st.pid)
                t = p.cpu_times()
                cpu = t.user + t.system
                rss = p.memory_info().rss / 2**20
            except psutil.Error:
                continue
            if st.first_cpu is None:
                st.first_cpu = cpu
            st.cpu_s = cpu - st.first_cpu
            st.peak_rss_mib = max(st.peak_rss_mib, rss)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def start(self) -> ProcSampler:
        self._thread = threading.Thread(target=self._run, name="proc-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.sample()
        return [{"process": s.name, "pid": s.pid, "cpu_s": round(s.cpu_s, 1),
                 "peak_rss_mib": round(s.peak_rss_mib, 1)}
                for s in sorted(self.procs.values(), key=lambda s: s.name)]
