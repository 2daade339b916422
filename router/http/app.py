"""The router's wiring: the parts built from its config (``Router``), their
lifecycle with the app (start, drain, stop), the routes (``build_app``)
and the server (``serve``). A request's path through them is the
director's (``toposerve.router.http.director``), over the exchange the
edge makes (``toposerve.router.http.edge``)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from typing import Any

import aiohttp
import structlog
from aiohttp import web

from toposerve.router.admission.budget import Budget
from toposerve.router.admission.flow_control import Admission
from toposerve.router.admission.tenants import OPEN_PATHS
from toposerve.router.config import RouterConfig
from toposerve.router.disaggregation.pairing import Disaggregation
from toposerve.router.ha.bus import Bus, RedisBus
from toposerve.router.ha.elector import default_identity
from toposerve.router.ha.local_bus import LocalBus, max_frame
from toposerve.router.ha.replica import Replica, channel
from toposerve.router.ha.replication import Replication
from toposerve.router.http.director import Director
from toposerve.router.http.edge import Edge, errors
from toposerve.router.http.handlers import Handlers
from toposerve.router.metrics import RouterMetrics
from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.pool.inference_pool import InferencePoolWatcher
from toposerve.router.pool.kubernetes import KubernetesWatcher
from toposerve.router.pool.revisions import Revisions
from toposerve.router.pool.scrape import scrape_loop
from toposerve.router.pool.static import load_static
from toposerve.router.prefix.kv_index import KVIndex
from toposerve.router.relay.proxy import Proxy
from toposerve.router.responses.store import ResponsesStore, make_store
from toposerve.router.scheduling.filters import RevisionFilter
from toposerve.router.scheduling.profile import Scheduler
from toposerve.router.state import RouterState
from toposerve.router.supervise import Streak, supervise
from toposerve.serving.http import run_app
from toposerve.wire.chat_template import load_chat_template
from toposerve.wire.errors import error_response
from toposerve.wire.tokens import load_tokenizer

log = structlog.get_logger("router")
DRAIN_GRACE_S = 1.0
# aiohttp's own line limits, this many times server.maxHeaderBytes: lines
# between the two get the router's JSON error, longer ones aiohttp's 400
PARSER_SLACK = 8
GC_THRESHOLDS = (50_000, 20, 100)


def _bus(cfg: RouterConfig, local_bus: str | None) -> Bus | None:
    """Where this process shares its view: the replicas' Redis with ha,
    else its pod's local bus when it is one of several workers."""
    if cfg.ha.enabled:
        assert cfg.responses.redis_url is not None  # RouterConfig guarantees it with ha
        return RedisBus(cfg.responses.redis_url, channel(cfg.ha), cfg.responses.redis_options())
    if local_bus is not None:
        return LocalBus(local_bus, max_frame(cfg.ha.snapshot.max_bytes))
    return None


class Router:
    def __init__(self, cfg: RouterConfig, local_bus: str | None = None,
                 worker: int | None = None) -> None:
        """``worker``: this process's index among its pod's workers (their
        ``local_bus``: the parent's socket, when they share no Redis)."""
        self.cfg = cfg
        self.state = RouterState(cfg)
        self.metrics = RouterMetrics(self.state)
        self.kv: KVIndex | None = None
        if any(s.type == "prefix-precise" for s in cfg.profile.scorers) and (
                cfg.kv_events.tokenizer is not None):
            path = None if cfg.kv_events.tokenizer == "bytes" else cfg.kv_events.tokenizer
            self.kv = KVIndex(self.state.precise, load_tokenizer(path), cfg.kv_events.block_size,
                              load_chat_template(path, cfg.kv_events.chat_template),
                              lambda why: self.metrics.chat_template_fallbacks.labels(why).inc())
        self.revisions = Revisions(cfg.revisions.weights)
        self.scheduler = Scheduler(self.state, cfg.profile, self.kv, "profile",
                                   [RevisionFilter(self.revisions)])
        self.pd = (Disaggregation(self.state, cfg, self.kv, self.revisions)
                   if cfg.disaggregation.enabled else None)
        self.admission = Admission(cfg.flow_control, self.state, self.metrics)
        self.budget = Budget(cfg.server)
        self.store: ResponsesStore = make_store(cfg.responses)
        self.replication: Replication | None = None
        self.ha: Replica | None = None
        if (bus := _bus(cfg, local_bus)) is not None:
            stages = {"profile": self.scheduler} | (
                {"prefill": self.pd.prefill, "decode": self.pd.decode} if self.pd else {})
            identity = cfg.ha.lease.identity or default_identity()
            self.replication = Replication(
                bus, identity if worker is None else f"{identity}/w{worker}", stages,
                self.state.pool, lambda outcome, n: self.metrics.replication.labels(outcome).inc(n),
                cfg.ha.snapshot, lambda outcome: self.metrics.snapshots.labels(outcome).inc(),
                cfg.ha.inflight, room=self.admission.request_done,
                spending=self.admission.tenants)
        if cfg.ha.enabled:
            assert self.replication is not None
            self.ha = Replica(cfg.ha, self.replication, self.state.pool,
                              leading=lambda on: self.metrics.leader.set(1 if on else 0),
                              # read after start(): discovery's own by then
                              warm=lambda: self.handlers.warm())
            self.metrics.leader.set(0)
        self.director = Director(self.metrics, self.admission, self.scheduler, self.replication)
        self.handlers = Handlers(cfg, self.state, self.metrics, self.budget, self.store,
                                 self.director, self.ha)
        self.edge = Edge(self.budget, self.admission.tenants, self.director)
        self.session: aiohttp.ClientSession | None = None
        self.proxy: Proxy | None = None
        self.watcher: KubernetesWatcher | InferencePoolWatcher | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    # --- lifecycle ---------------------------------------------------------
    def _watch_events(self, ep: Endpoint) -> None:
        if self.kv is not None and ep.kv_events:
            self.kv.watch(ep.url, ep.kv_events, ep.kv_events_replay)

    def _restarted(self, ep: Endpoint) -> None:
        # a new engine process holds nothing of what was sent to the old one;
        # the precise index learns it from the engine's own events
        self.state.approx.clear(ep.url)

    def _forget(self, url: str) -> None:
        self.state.forget_endpoint(url)
        if self.kv is not None:
            t = asyncio.ensure_future(self.kv.unwatch(url))
            self._tasks.append(t)

    async def start(self, app: web.Application) -> None:
        s = self.cfg.server
        # one session serves every client: a cookie jar would hand one
        # client's upstream cookies to the next. Bodies pass through as they
        # come (no decompression), so the router asks for them uncompressed:
        # aiohttp's default Accept-Encoding would get a gzipped /metrics from
        # vLLM (prometheus_client compresses when asked)
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, ttl_dns_cache=300),
            auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
            headers={"Accept-Encoding": "identity"})
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=s.connect_timeout_s,
                                        sock_read=s.upstream_timeout_s)
        self.proxy = Proxy(self.session, self.metrics, s.max_attempts, timeout,
                           self.admission.request_done, self.budget, s.client_timeout_s,
                           s.max_answer_bytes)
        self.director.bind(self.proxy, self.pd)
        for ep in load_static(self.state.pool, self.cfg.discovery.static):
            self._watch_events(ep)
        d, pool = self.cfg.discovery, self.state.pool
        hooks: dict[str, Any] = {"on_add": self._watch_events, "on_remove": self._forget,
                                 "requests": lambda verb: self.metrics.discovery
                                 .labels(verb).inc()}
        if d.kubernetes is not None:
            self.watcher = KubernetesWatcher(d.kubernetes, pool, s.drain_timeout_s, **hooks)
        elif d.inference_pool is not None:
            self.watcher = InferencePoolWatcher(d.inference_pool, pool, s.drain_timeout_s,
                                                **hooks)
        if self.watcher is not None:
            self.watcher.start()
            self.handlers.discovered = self.watcher.synced.is_set
        sc = self.cfg.scrape
        self._tasks.append(asyncio.create_task(
            scrape_loop(self.session, self.state.pool, sc.interval_s, sc.timeout_s,
                        sc.health_interval_s, self._restarted)))
        self._tasks.append(asyncio.create_task(self.admission.run(sc.interval_s)))
        self._tasks.append(asyncio.create_task(supervise(Streak("responses-store"),
                                                         self.store.run)))
        if self.ha is not None:
            self.ha.start()
        elif self.replication is not None:
            self.replication.start()
        if self.replication is not None:
            await self.replication.ready()  # it listens once it has the others' view

    async def draining(self, app: web.Application) -> None:
        """On SIGTERM the listener is closed; in-flight requests get
        server.drainTimeoutSeconds to finish, then end with an error saying
        why (aiohttp waits DRAIN_GRACE_S longer, for those last writes)."""
        drain = self.cfg.server.drain_timeout_s
        log.info("stopping: in-flight requests finish first",
                 inflight=sum(ep.own_inflight for ep in self.state.pool), timeout_s=drain)
        assert self.proxy is not None
        asyncio.get_running_loop().call_later(
            drain, self.proxy.cut, "the router stopped before the answer was complete "
                                   "(server.drainTimeoutSeconds)")

    async def stop(self, app: web.Application) -> None:
        if self.watcher:
            self.watcher.stop()
        if self.ha is not None:
            await self.ha.close()
        elif self.replication is not None:
            await self.replication.close()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self.kv:
            await self.kv.close()
        await self.store.close()
        await self.handlers.bodies.close()
        if self.proxy:
            self.proxy.close()
        if self.session:
            await self.session.close()


# the Router an app serves, for tests that reach in
ROUTER = web.AppKey("router", Router)


async def _expect(request: web.Request) -> web.StreamResponse | None:
    """Expect: 100-continue answered as aiohttp answers it; any other
    expectation a JSON 417, as every refusal of the router is (aiohttp's
    own is plain text, sent before the middlewares run)."""
    expect = request.headers.get("Expect", "")
    if expect.lower() != "100-continue":
        return error_response(417, f"unknown Expect: {expect[:100]!r}; only 100-continue",
                              "Expect")
    if request.version == aiohttp.HttpVersion11:
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the body's bytes start after it
    return None


def build_app(cfg: RouterConfig, local_bus: str | None = None,
              worker: int | None = None) -> web.Application:
    router = Router(cfg, local_bus, worker)
    h, take = router.handlers, router.edge.take
    app = web.Application(middlewares=[errors(router.metrics, cfg.server.max_header_bytes)],
                          client_max_size=cfg.server.max_body_bytes)
    app[ROUTER] = router
    for path, handler in (("/v1/chat/completions", h.chat), ("/v1/completions", h.completions),
                          ("/v1/responses", h.create_response)):
        app.router.add_post(path, take(handler), expect_handler=_expect)
    app.router.add_get("/v1/responses/{id}", take(h.get_response))
    app.router.add_delete("/v1/responses/{id}", take(h.delete_response))
    app.router.add_get("/v1/responses/{id}/input_items", take(h.input_items))
    app.router.add_get("/v1/models", take(h.models))
    app.router.add_get("/v1/models/{model:.+}", take(h.model))  # names hold slashes
    # probes and scrapes: no key, no budget (OPEN_PATHS)
    for path, probe in (("/health", h.health), ("/ready", h.ready),
                        ("/metrics", h.metrics_endpoint)):
        assert path in OPEN_PATHS
        app.router.add_get(path, probe)
    app.on_startup.append(router.start)
    app.on_shutdown.append(router.draining)
    app.on_cleanup.append(router.stop)
    return app


def serve(cfg: RouterConfig, sock: socket.socket | None = None, local_bus: str | None = None,
          worker: int | None = None) -> None:
    """Serve until stopped, on ``sock`` when given (bound already, so that a
    taken address fails before the router starts), else on the configured
    address; ``local_bus`` and ``worker`` as for ``Router``."""
    import uvloop

    uvloop.install()
    # what exists by now (modules, config, the models) lives as long as the
    # process: frozen, a full collection no longer walks it (a full one took
    # up to 0.3 s under load); young collections every 50,000 allocations,
    # not 700 (docs/benchmarks.md, "Router overhead")
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    where: dict[str, Any] = ({"sock": sock} if sock else
                             {"host": cfg.server.host, "port": cfg.server.port})
    run_app(build_app(cfg, local_bus, worker), error_factory=error_response, **where,
            access_log=None,
            max_line_size=PARSER_SLACK * cfg.server.max_header_bytes,
            max_field_size=PARSER_SLACK * cfg.server.max_header_bytes,
            shutdown_timeout=cfg.server.drain_timeout_s + DRAIN_GRACE_S,
            # aiohttp closes a connection whose handler waits for a request
            # head this long after it opened or last answered: idle ones and
            # those sending a head a byte at a time alike
            keepalive_timeout=cfg.server.client_timeout_s,
            # a client that goes away cancels its handler, which closes the
            # upstream connection: the model server aborts the generation
            # instead of running on for nobody (non-streamed requests too)
            handler_cancellation=True)
