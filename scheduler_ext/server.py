"""The extender's HTTP face (aiohttp): ``filter``, ``prioritize`` and
``preempt`` as kube-scheduler calls them (``toposerve.scheduler_ext.protocol``: JSON keys
are Go field names; names-only ``NodeNames`` or full ``Nodes``; a request of
the wrong shape is a 400 naming the field), ``/health``, ``/ready``
and ``/metrics``. Every answer is computed from the watched state; no call
reads the API."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from toposerve.kubeapi import connect
from toposerve.scheduler_ext.config import ExtenderConfig
from toposerve.scheduler_ext.metrics import Metrics
from toposerve.scheduler_ext.placement.decide import (
    FilterResult,
    Outcome,
    filter_member,
    filter_ungrouped,
    neutral,
    prioritize_member,
    prioritize_ungrouped,
    top,
)
from toposerve.scheduler_ext.placement.levels import contains
from toposerve.scheduler_ext.placement.model import Decision, Group
from toposerve.scheduler_ext.protocol import (
    BadRequest,
    ExtenderArgs,
    ExtenderFilterResult,
    ExtenderPreemptionArgs,
    ExtenderPreemptionResult,
    HostPriority,
    HostPriorityList,
    NodeList,
    decode,
    encode,
)
from toposerve.scheduler_ext.state.cache import ClusterState
from toposerve.scheduler_ext.state.facts import PodFacts
from toposerve.serving.http import run_app
from toposerve.topology.model import Tier

log = structlog.get_logger("toposerve.extender")

Persist = Callable[[str, str, Decision], None]


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


@dataclass
class Filtered:
    """A filter call's answer, and the decision it made to write on its pod."""

    result: ExtenderFilterResult
    changed: Decision | None
    facts: PodFacts


# the largest body taken: full ``Nodes`` at 5,000 nodes fit
MAX_BODY = 64 * 2**20


class Extender:
    def __init__(self, cfg: ExtenderConfig, state: ClusterState, *,
                 clock: Callable[[], float] = time.time, persist: Persist | None = None,
                 missing: Callable[[], list[str]] = list) -> None:
        self.cfg = cfg
        self.state = state
        self.policy = cfg.policy()
        self.clock = clock
        self.persist = persist if cfg.persist_decisions else None
        self.missing = missing
        self.metrics = Metrics()
        self.warmed = False
        self._writes: set[asyncio.Future[None]] = set()
        self._noted: set[str] = set()  # undecided demand already logged

    # --- the decisions, synchronous and pure over the state ------------------------

    def _group(self, facts: PodFacts) -> Group | None:
        if facts.ref is None:
            return None
        return self.state.snapshot().groups.get(facts.ref.key)

    @contextlib.contextmanager
    def _locked(self, verb: str) -> Iterator[None]:
        """The state's lock for one call, its phases timed: the wait for the
        lock, the view's rebuilds while it is held, and the rest."""
        asked = time.perf_counter()
        with self.state.lock:
            got, rebuilt = time.perf_counter(), self.state.view_seconds
            try:
                yield
            finally:
                view = self.state.view_seconds - rebuilt
                phase = self.metrics.phases
                phase.labels(verb, "lock").observe(got - asked)
                phase.labels(verb, "view").observe(view)
                phase.labels(verb, "placement").observe(time.perf_counter() - got - view)

    def filter(self, args: ExtenderArgs) -> Filtered:
        pod = args.Pod.raw()
        names = args.names()
        with self._locked("filter"), self.state.observing(pod) as facts:
            # asked again: the scheduler did not place it where we scored it
            self.state.unassume(facts.uid)
            group = self._group(facts)
            changed: Decision | None = None
            if facts.ref is not None and facts.ref.problem:
                # the pod's own labels are wrong: preempting pods would not help
                res = FilterResult([], dict.fromkeys(names, f"cannot place the pod's group: "
                                                            f"{facts.ref.problem}"),
                                   outcome=Outcome.BAD_METADATA, unresolvable=True)
            elif group is None:
                whole, shares = self.state.asks(facts)
                res = filter_ungrouped(self.state.snapshot(), whole, names, self.clock(),
                                       shares)
            else:
                res = filter_member(self.state.view, group, facts.uid, names,
                                    self.policy, self.clock())
                if res.decision is not None and self.state.decide(res.decision):
                    changed = res.decision
            self.metrics.decisions.labels(res.outcome.value).inc()
            if notes := self.state.demand_notes(facts):
                self._note(facts, notes)
                # one wording for every node, so the scheduler's event still aggregates
                res.failed = {n: f"{r} (demand: {'; '.join(notes)})"
                              for n, r in res.failed.items()}
        if res.outcome in (Outcome.DECIDED, Outcome.CLIMBED, Outcome.NO_FIT,
                           Outcome.BAD_METADATA, Outcome.SIZE_UNKNOWN):
            d = res.decision
            log.info("group placement", pod=f"{facts.namespace}/{facts.name}",
                     group=facts.ref.key if facts.ref else None, outcome=res.outcome.value,
                     level=d.tier.name.lower() if d else None,
                     domain="/".join(str(x) for x in d.domain) if d else None,
                     reason=next(iter(res.failed.values()), None) if not res.passed else None)
        # built from the extender's own values: not validated again (5,000 entries)
        out = ExtenderFilterResult.model_construct(
            FailedNodes={} if res.unresolvable else res.failed,
            # the scheduler then tries no preemption for it
            FailedAndUnresolvableNodes=res.failed if res.unresolvable else None)
        if args.NodeNames is not None:
            out.NodeNames = res.passed
        else:
            assert args.Nodes is not None
            by_name = {n.metadata.name: n for n in args.Nodes.items}
            out.Nodes = NodeList(metadata={}, items=[by_name[n] for n in res.passed])
        return Filtered(out, changed, facts)

    def _note(self, facts: PodFacts, notes: tuple[str, ...]) -> None:
        """Log what of a pod's device requests could not be decided, once
        per wording (it recurs on every call of the pod and its likes)."""
        fresh = [n for n in notes if n not in self._noted]
        if fresh:
            if len(self._noted) > 1024:
                self._noted.clear()
            self._noted.update(fresh)
            log.warning("device requests not decided; counted conservatively",
                        pod=f"{facts.namespace}/{facts.name}", notes=fresh)

    def prioritize(self, args: ExtenderArgs) -> list[HostPriority]:
        names = args.names()
        with self._locked("prioritize"), self.state.observing(args.Pod.raw()) as facts:
            group = self._group(facts)
            if facts.ref is not None and facts.ref.problem:
                scores = neutral()
            elif group is None:
                whole, shares = self.state.asks(facts)
                scores = prioritize_ungrouped(self.state.snapshot(), whole, names,
                                              self.policy, self.clock(), shares)
            else:
                scores = prioritize_member(self.state.view, group, facts.uid, names,
                                           self.policy, self.clock())
            if (best := top(scores)) is not None:
                self.state.assume(facts.uid, best)
        # a node left out scores 0, as neutral as it gets (and 5,000 entries less)
        return [HostPriority(Host=n, Score=s) for n, s in scores.items() if s]

    def preempt(self, args: ExtenderPreemptionArgs) -> ExtenderPreemptionResult:
        """Keep the candidate nodes that the pod's group may use at all
        (inside its decided domain); victims are the scheduler's."""
        meta = args.meta_victims()
        with self._locked("preempt"), self.state.observing(args.Pod.raw()) as facts:
            group = self._group(facts)
            decision = self.state.view.decisions.get(group.key) if group else None
            if decision is not None and decision.holds(group, self.clock()):
                view = self.state.view
                meta = {n: v for n, v in meta.items() if n in view.nodes and
                        (d := view.nodes[n].domain(decision.tier)) is not None and
                        contains(decision.domain, d)}
        return ExtenderPreemptionResult(NodeNameToMetaVictims=meta)

    def answer(self, verb: str, body: bytes) -> tuple[int, bytes, Filtered | None]:
        """One call, from the request's bytes to the answer's: (HTTP status,
        body, the filter's outcome when it made a decision to write)."""
        try:
            if verb == "filter":
                got = self.filter(decode(ExtenderArgs, body))
                return 200, encode(got.result), got if got.changed is not None else None
            if verb == "prioritize":
                return 200, HostPriorityList.dump_json(
                    self.prioritize(decode(ExtenderArgs, body))), None
            return 200, encode(self.preempt(decode(ExtenderPreemptionArgs, body))), None
        except BadRequest as err:
            return 400, orjson.dumps({"Error": f"bad {verb} request: {err}"}), None

    def warm(self) -> None:
        """Once every watch has listed: build the view and its domain indexes
        now rather than in the first call (100 ms at 5,000 nodes), then collect once and freeze what
        survives (the cluster's state, ~100,000 objects) out of the
        collector's sight, so a full collection during a call scans only
        what changed since (else an 80 ms pause every few hundred calls)."""
        with self.state.lock:
            view = self.state.snapshot()
            kinds = {(p,) for p in view.of_profile()}
            for tier in Tier:  # each level's domains and their room, as a first decision reads them
                view.place(tier)
                for profiles in kinds:
                    view.room(tier, profiles)
        gc.collect()
        gc.freeze()
        self.warmed = True

    def held(self) -> int:
        now = self.clock()
        with self.state.lock:
            view = self.state.view
            return sum(1 for d in view.decisions.values() if d.holds(view.groups.get(d.group), now))

    # --- HTTP ----------------------------------------------------------------------

    def _remember(self, fut: asyncio.Future[None]) -> None:
        self._writes.add(fut)
        fut.add_done_callback(self._writes.discard)

    def _verb(self, verb: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            started = time.perf_counter()
            try:
                status, body, filtered = self.answer(verb, await request.read())
            except web.HTTPRequestEntityTooLarge:
                status, body, filtered = 413, orjson.dumps(
                    {"Error": f"bad {verb} request: the body is over {MAX_BODY} bytes"}), None
            if filtered is not None and filtered.changed is not None and \
                    self.persist is not None:
                loop = asyncio.get_running_loop()
                self._remember(loop.run_in_executor(
                    None, self.persist, filtered.facts.namespace, filtered.facts.name,
                    filtered.changed))
            resp = web.Response(body=body, status=status, content_type="application/json")
            self.metrics.calls.labels(verb, str(resp.status)).inc()
            self.metrics.latency.labels(verb).observe(time.perf_counter() - started)
            return resp
        return handle

    async def _health(self, _: web.Request) -> web.Response:
        return _json({"status": "ok"})

    async def _ready(self, _: web.Request) -> web.Response:
        missing = self.missing()
        if missing:
            return _json({"status": "syncing", "waitingFor": missing}, status=503)
        if not self.warmed:  # calls before it would pay for building the view
            return _json({"status": "warming"}, status=503)
        return _json({"status": "ready"})

    async def _metrics(self, _: web.Request) -> web.Response:
        self.metrics.groups_held.set(self.held())
        with self.state.lock:
            self.metrics.groups_known.set(len(self.state.snapshot().groups))
            self.metrics.group_pods_elsewhere.set(len(self.state.elsewhere))
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        for verb in ("filter", "prioritize", "preempt"):
            app.router.add_post(f"/{verb}", self._verb(verb))
        app.router.add_get("/health", self._health)
        app.router.add_get("/ready", self._ready)
        app.router.add_get("/metrics", self._metrics)
        return app


def ssl_context(cfg: ExtenderConfig) -> ssl.SSLContext | None:
    if not cfg.server.cert_file:
        return None
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cfg.server.cert_file, cfg.server.key_file)
    return ctx


def api_client(kubeconfig: str | None) -> Any:
    """The extender's client (six long watches and the odd patch)."""
    return connect(kubeconfig, pool_size=16)


def serve(cfg: ExtenderConfig, api: Any, listening: Callable[[], None] = lambda: None,
          sock: socket.socket | None = None) -> None:
    """Serve until stopped; ``listening`` is called once the socket listens
    (an address that cannot be had raises ``OSError`` before). On ``sock``
    when given: bound already, so a taken address fails before the watches
    start."""
    import uvloop

    from toposerve.scheduler_ext.state.watch import Watches

    state = ClusterState(cfg)
    watches = Watches(api, state)
    ext = Extender(cfg, state, persist=watches.persist, missing=watches.missing)

    async def start(_: web.Application) -> None:
        watches.start()

    async def stop(_: web.Application) -> None:
        await asyncio.get_running_loop().run_in_executor(None, watches.stop)

    app = ext.app()
    app.on_startup.append(start)
    app.on_cleanup.append(stop)

    async def errors() -> None:
        while True:
            if not ext.warmed and not watches.missing():
                ext.warm()
            for kind, n in watches.errors.items():
                ext.metrics.watch_errors.labels(kind).set(n)
            await asyncio.sleep(5 if ext.warmed else 0.1)

    async def metrics_loop(app: web.Application) -> Any:
        task = asyncio.ensure_future(errors())
        yield
        task.cancel()

    app.cleanup_ctx.append(metrics_loop)
    uvloop.install()
    where: dict[str, Any] = ({"sock": sock} if sock else
                             {"host": cfg.server.host, "port": cfg.server.port})
    run_app(app, error_factory=lambda status, msg: _json({"Error": msg}, status), **where,
            ssl_context=ssl_context(cfg), access_log=None, on_listening=listening,
            shutdown_timeout=5)
