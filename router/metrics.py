"""The router's own Prometheus metrics. With ``server.workers`` each worker
writes its counters, histograms and gauges to files in a directory its
parent gives it (prometheus_client's multiprocess mode, switched on by
PROMETHEUS_MULTIPROC_DIR in the worker's environment), and whichever
worker a scrape reaches answers for them all."""

from __future__ import annotations

import os
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from toposerve.router.state import RouterState
from toposerve.router.supervise import ERRORS

# set by the workers' parent (router/http/workers.py) to their metrics' directory
MULTIPROCESS_ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0, 30.0, 60.0, 120.0)


class _PoolCollector(Collector):
    def __init__(self, state: RouterState) -> None:
        self.state = state

    def collect(self) -> Iterator[GaugeMetricFamily]:
        inflight = GaugeMetricFamily("toposerve_router_endpoint_inflight",
                                     "Requests this router process has in flight per "
                                     "endpoint.", labels=["endpoint"])
        tokens = GaugeMetricFamily("toposerve_router_endpoint_inflight_tokens",
                                   "Prompt tokens this router process has in flight per "
                                   "endpoint.", labels=["endpoint"])
        peers = GaugeMetricFamily("toposerve_router_endpoint_peer_inflight",
                                  "Requests in flight per endpoint from the other router "
                                  "processes sharing this one's view (replicas, workers), as "
                                  "they last reported; routing counts them with its own.",
                                  labels=["endpoint"])
        waiting = GaugeMetricFamily("toposerve_router_endpoint_waiting",
                                    "Waiting requests per endpoint, as last scraped.",
                                    labels=["endpoint"])
        usage = GaugeMetricFamily("toposerve_router_endpoint_kv_usage",
                                  "KV-cache usage per endpoint, as last scraped.",
                                  labels=["endpoint"])
        healthy = GaugeMetricFamily("toposerve_router_endpoint_healthy",
                                    "1 when the endpoint takes requests.", labels=["endpoint"])
        tainted = GaugeMetricFamily(
            "toposerve_router_endpoint_device_tainted",
            "1 for each NoSchedule or NoExecute taint on a device an endpoint's pod holds "
            "(discovery claimDevices): the endpoint takes no new requests until it goes.",
            labels=["endpoint", "device", "key", "effect"])
        speed = GaugeMetricFamily(
            "toposerve_router_endpoint_prefill_seconds_per_token",
            "Seconds a token of prefill holds back a first byte, learned from streamed answers "
            "sent while no other prefill was in flight there (0: not learned yet); "
            "prefill-cost and conversations weigh an endpoint 1.5x or more from the median "
            "by it.",
            labels=["endpoint"])
        for e in self.state.pool:
            inflight.add_metric([e.name], e.own_inflight)
            tokens.add_metric([e.name], e.own_inflight_tokens)
            peers.add_metric([e.name], e.peer_inflight)
            waiting.add_metric([e.name], e.load.waiting)
            usage.add_metric([e.name], e.load.kv_usage)
            healthy.add_metric([e.name], 1.0 if e.healthy and not e.draining and not e.taints
                               else 0.0)
            for t in e.taints:
                tainted.add_metric([e.name, t.device, t.key, t.effect], 1.0)
            speed.add_metric([e.name], e.prefill_s_per_token)
        held = GaugeMetricFamily(
            "toposerve_router_endpoint_prefix_blocks",
            "Blocks the prefix indexes hold for each endpoint: approx, where prompts were "
            "sent; precise, what its KV events say it stored and has not removed.",
            labels=["endpoint", "index"])
        for e in self.state.pool:
            held.add_metric([e.name, "approx"], self.state.approx.held(e.url))
            held.add_metric([e.name, "precise"], self.state.precise.held(e.url))
        index = GaugeMetricFamily("toposerve_router_prefix_index_blocks",
                                  "Blocks held in the prefix indexes.", labels=["index"])
        index.add_metric(["approx"], len(self.state.approx))
        index.add_metric(["precise"], len(self.state.precise))
        yield from (inflight, tokens, peers, waiting, usage, healthy, tainted, speed, held,
                    index)


class RouterMetrics:
    def __init__(self, state: RouterState) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter("toposerve_router_requests", "Requests answered.",
                                ["path", "code"], registry=r)
        self.duration = Histogram("toposerve_router_request_seconds",
                                  "Time from request to last byte.", ["path"],
                                  buckets=LATENCY_BUCKETS, registry=r)
        self.ttfb = Histogram("toposerve_router_time_to_first_byte_seconds",
                              "Time from request to the first byte of the upstream answer.",
                              ["path"], buckets=LATENCY_BUCKETS, registry=r)
        self.decisions = Counter("toposerve_router_decisions",
                                 "Routing decisions by the scorer that decided them.",
                                 ["reason"], registry=r)
        self.retries = Counter("toposerve_router_retries",
                               "Upstream attempts that failed before the first byte.",
                               registry=r)
        self.midstream = Counter("toposerve_router_midstream_failures",
                                 "Answers whose upstream broke after it began answering.",
                                 registry=r)
        self.stalled_clients = Counter(
            "toposerve_router_stalled_clients",
            "Answers cut off because their client read nothing of them for "
            "server.clientTimeoutSeconds.", registry=r)
        self.chat_template_fallbacks = Counter(
            "toposerve_router_chat_template_fallbacks",
            "Chat requests the precise prefix index keyed from the approximate prompt, "
            "not the model's chat template (reason: no_template, render_error, unsupported).",
            ["reason"], registry=r)
        self.scheduling = Histogram("toposerve_router_scheduling_seconds",
                                    "Time to pick an endpoint (parse, hash, score).",
                                    buckets=(0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                             0.005, 0.01, 0.025, 0.05), registry=r)
        self.prefix_match = Histogram("toposerve_router_prefix_match_ratio",
                                      "Share of the prompt's blocks the chosen endpoint holds, "
                                      "as the router estimates it.",
                                      buckets=(0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 0.95, 0.99, 1.0),
                                      registry=r)
        self.disaggregation = Counter(
            "toposerve_router_disaggregation",
            "Requests for a prefill/decode split: split, whole (too little to prefill, "
            "minPrefillTokens: run on a decode endpoint), prefill-failed (decoded with a "
            "local prefill instead), refused (the prefill endpoint answered 4xx, passed on).",
            ["outcome"], registry=r)
        self.pd_pairs = Counter(
            "toposerve_router_pd_pairs",
            "Split requests by the topology tier between their prefill endpoint and the "
            "decode endpoint picked: same_node, nvlink, rack, block, zone, beyond, or unknown "
            "(a place not known).", ["tier"], registry=r)
        self.admission = Counter("toposerve_router_admission",
                                 "Admission decisions where an objective or flow control "
                                 "applied: admitted, queued (then sent), shed, expired, "
                                 "queue-full, rate-limited; priority: the request's band "
                                 "(its objective's priority, 0 without one).",
                                 ["outcome", "priority"], registry=r)
        self.tenant_requests = Counter("toposerve_router_tenant_requests",
                                       "Admission decisions per tenant of an API key "
                                       "(outcomes as toposerve_router_admission); beyond "
                                       "flowControl.tenants.metricTenants tenants, 'other'.",
                                       ["tenant", "outcome"], registry=r)
        self.saturation = Gauge("toposerve_router_flow_saturation",
                                "The candidate endpoints' mean use of their capacity at the "
                                "last admission decision (1: full).", registry=r,
                                multiprocess_mode="livemostrecent")
        self.api_keys = Gauge("toposerve_router_api_keys",
                              "API keys loaded (from the key file or Secret).", registry=r,
                              multiprocess_mode="livemax")
        self.api_keys_loaded = Gauge("toposerve_router_api_keys_loaded",
                                     "0 while API keys are configured but none has been read "
                                     "yet (the Secret not reached): every request is answered "
                                     "401 until then; else 1.", registry=r,
                                     multiprocess_mode="livemin")
        self.queue_wait = Histogram("toposerve_router_queue_wait_seconds",
                                    "Time requests waited in the router's queue.",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.queued = Gauge("toposerve_router_queued_requests",
                            "Requests waiting in the router's queue.", registry=r,
                            multiprocess_mode="livesum")
        self.discovery = Counter("toposerve_router_discovery_requests",
                                 "Requests the Kubernetes pod discovery sent to the apiserver: "
                                 "list (at start and after 410 Gone) and watch.", ["verb"],
                                 registry=r)
        self.leader = Gauge("toposerve_router_leader",
                            "1 while this replica takes traffic (/ready answers 200): the "
                            "leader of a hot-standby pair, any active-active replica until it "
                            "stops; 1 without ha.", registry=r, multiprocess_mode="livemax")
        self.leader.set(1)
        self.replication = Counter("toposerve_router_replicated_decisions",
                                   "Routing decisions shared with the other router processes "
                                   "(replicas, workers): sent, received (applied here), "
                                   "dropped (the bus, Redis or local, down or slow).",
                                   ["outcome"], registry=r)
        self.snapshots = Counter("toposerve_router_replication_snapshots",
                                 "Snapshots of the routing state learnt from decisions: written "
                                 "(for a starting or reconnected process that asked this one), "
                                 "loaded, ignored (corrupt, another version, too large), "
                                 "missing (none came in time: the process goes on with what "
                                 "it has).", ["outcome"], registry=r)
        self.responses_unstored = Counter(
            "toposerve_router_responses_unstored",
            "Streamed Responses answers whose turn the store could not keep (Redis down): "
            "they end with response.failed instead of response.completed.", registry=r)
        pool = _PoolCollector(state)
        r.register(pool)
        self.loop_errors = ERRORS.counter  # the process's own, in every registry
        r.register(self.loop_errors)
        self._scraped = r
        if os.environ.get(MULTIPROCESS_ENV):
            # a worker: every worker's metrics from their files, and the
            # endpoints as this one sees them (its own in-flight beside its
            # siblings' peer in-flight; the rest learnt as theirs is)
            self._scraped = CollectorRegistry()
            MultiProcessCollector(self._scraped)  # type: ignore[no-untyped-call]  # untyped upstream
            self._scraped.register(pool)
        # labelled children by their labels: labels() validates and locks on every call
        self._ttfb: dict[str, Histogram] = {}
        self._answered: dict[tuple[str, int], tuple[Counter, Histogram]] = {}
        self._decided: dict[str, Counter] = {}

    def ttfb_of(self, path: str) -> Histogram:
        if (h := self._ttfb.get(path)) is None:
            h = self._ttfb[path] = self.ttfb.labels(path)
        return h

    def answered(self, path: str, status: int, seconds: float) -> None:
        """A request answered: counted by path and status, timed by path."""
        if (pair := self._answered.get((path, status))) is None:
            pair = self._answered[path, status] = (self.requests.labels(path, str(status)),
                                                   self.duration.labels(path))
        pair[0].inc()
        pair[1].observe(seconds)

    def decided(self, reason: str) -> None:
        if (c := self._decided.get(reason)) is None:
            c = self._decided[reason] = self.decisions.labels(reason)
        c.inc()

    def render(self) -> bytes:
        return generate_latest(self._scraped)
