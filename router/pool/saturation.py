"""How full an endpoint is, as a number: 1 is full. Pure functions over an
endpoint's load and the config, so the admission maths is tested without a
server.

The metrics detector reads the scraped queue depth and KV-cache use against
their thresholds and counts stale metrics as full (an endpoint we cannot
see must not be flooded). The concurrency detector reads the router's own
count of requests in flight, which is never stale."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from toposerve.router.config import RouterConfig
from toposerve.router.pool.endpoints import Endpoint, fresh_loads


def utilisation(ep: Endpoint, cfg: RouterConfig, now: float | None = None) -> float:
    """Use of the endpoint's capacity: 0 idle, at or above 1 full."""
    fs = cfg.flow_control.saturation
    if fs.detector == "concurrency":
        return ep.inflight / fs.max_concurrency
    if ep.stale(cfg.scrape.stale_after_s, now):
        return 1.0  # fail closed
    s = cfg.saturation
    queue = ep.load.waiting / s.queue_threshold if s.queue_threshold else 1.0
    return max(queue, ep.load.kv_usage / s.kv_usage_threshold)


def saturated(ep: Endpoint, cfg: RouterConfig, now: float | None = None) -> bool:
    """``utilisation(...) >= 1``, without the divisions: the filters ask it
    of every endpoint for every request."""
    fs = cfg.flow_control.saturation
    if fs.detector == "concurrency":
        return ep.inflight >= fs.max_concurrency
    if ep.stale(cfg.scrape.stale_after_s, now):
        return True
    s = cfg.saturation
    return ep.load.waiting >= s.queue_threshold or ep.load.kv_usage >= s.kv_usage_threshold


def unsaturated(eps: Sequence[Endpoint], cfg: RouterConfig,
                now: float | None = None) -> list[Endpoint]:
    """The endpoints of ``eps`` that ``saturated`` passes, in one pass with
    no call an endpoint: the filters ask it of every candidate of every
    request, and the calls cost more than the comparisons."""
    fs = cfg.flow_control.saturation
    if fs.detector == "concurrency":
        cap = fs.max_concurrency
        return [e for e in eps if e.inflight < cap]
    now = time.monotonic() if now is None else now
    stale_after = cfg.scrape.stale_after_s
    q, kv = cfg.saturation.queue_threshold, cfg.saturation.kv_usage_threshold
    return [e for e, s in zip(eps, fresh_loads(eps, stale_after, now), strict=True)
            if s is not None and s.waiting < q and s.kv_usage < kv]


def pool_saturation(eps: Iterable[Endpoint], cfg: RouterConfig,
                    now: float | None = None) -> float:
    """The candidates' mean use, each capped at full: how close the set as a
    whole is to refusing work (1 also when there is none). ``utilisation``
    of each, inlined: admission asks it for every request."""
    fs = cfg.flow_control.saturation
    if fs.detector == "concurrency":
        cap = fs.max_concurrency
        us = [min(1.0, e.inflight / cap) for e in eps]
        return sum(us) / len(us) if us else 1.0
    now = time.monotonic() if now is None else now
    stale_after = cfg.scrape.stale_after_s
    q, kv = cfg.saturation.queue_threshold, cfg.saturation.kv_usage_threshold
    total = 0.0
    loads = fresh_loads(eps, stale_after, now)
    for s in loads:
        if s is None:
            total += 1.0
        else:
            total += min(1.0, max(s.waiting / q if q else 1.0, s.kv_usage / kv))
    return total / len(loads) if loads else 1.0


def shed_probability(saturation: float, start: float, end: float = 1.0) -> float:
    """The chance a sheddable request is refused: 0 up to ``start``, rising
    linearly to 1 at ``end``, so sheddable load backs off before queues
    fill and the last room is left to traffic that may not be shed."""
    if saturation >= end:
        return 1.0
    if saturation <= start:
        return 0.0
    return (saturation - start) / (end - start)


def free_slots(eps: Iterable[Endpoint], cfg: RouterConfig, now: float | None = None) -> int:
    """How many more requests the endpoints take before they are full: the
    concurrency detector's free slots, or the metrics detector's room left
    in each queue (an estimate until the next scrape)."""
    fc, s = cfg.flow_control.saturation, cfg.saturation
    total = 0
    for e in eps:
        if fc.detector == "concurrency":
            total += max(0, fc.max_concurrency - e.inflight)
        elif not saturated(e, cfg, now):
            total += max(1, s.queue_threshold - int(e.load.waiting))
    return total
