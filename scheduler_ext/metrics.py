"""The extender's Prometheus series, in a registry of its own (two
extenders in one test process must not share counters)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# extender calls are meant to take a millisecond or so; fine steps up to the
# 5 ms a call may take at 5,000 nodes, so a p99 read from the buckets says which side it is
BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1,
           0.25, 1.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.calls = Counter("toposerve_extender_calls", "scheduler calls by verb and HTTP status",
                             ["verb", "code"], registry=self.registry)
        self.latency = Histogram("toposerve_extender_call_seconds",
                                 "time to answer a scheduler call, by verb", ["verb"],
                                 buckets=BUCKETS, registry=self.registry)
        self.phases = Histogram(
            "toposerve_extender_call_phase_seconds",
            "a call's time by verb and phase: lock (waiting for the watched state, which the "
            "watches hold while they apply an event), view (rebuilding what changed since the "
            "last call), placement (the rest: deciding, scoring, the answer)",
            ["verb", "phase"], buckets=BUCKETS, registry=self.registry)
        self.decisions = Counter("toposerve_extender_decisions",
                                 "filter outcomes by reason (pass-through, kept-off, held, "
                                 "decided, climbed, no-fit, bad-metadata, size-unknown)",
                                 ["reason"],
                                 registry=self.registry)
        self.groups_held = Gauge("toposerve_extender_groups_held",
                                 "groups whose capacity is promised right now",
                                 registry=self.registry)
        self.groups_known = Gauge("toposerve_extender_groups",
                                  "groups among the watched pods", registry=self.registry)
        self.group_pods_elsewhere = Gauge(
            "toposerve_extender_group_pods_elsewhere",
            "pending pods of a group whose spec.schedulerName is not the extender's "
            "schedulerName: another scheduler places them, not as a group",
            registry=self.registry)
        self.watch_errors = Gauge("toposerve_extender_watch_errors",
                                  "watch failures since start, by kind", ["kind"],
                                  registry=self.registry)
