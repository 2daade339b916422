"""The extender's HTTP face (aiohttp): ``filter``, ``prioritize`` and
``preempt`` as kube-scheduler calls them (DESIGN §6: JSON keys are Go field
names; names-only ``NodeNames`` or full ``Nodes``), ``/health``, ``/ready``
and ``/metrics``. Every answer is computed from the watched state; no call
reads the API."""

from __future__ import annotations

import asyncio
import gc
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from kubeapi import connect
from scheduler_ext.config import ExtenderConfig
from scheduler_ext.metrics import Metrics
from scheduler_ext.placement.decide import (
    FilterResult,
    Outcome,
    filter_member,
    filter_ungrouped,
    neutral,
    prioritize_member,
    prioritize_ungrouped,
    top,
)
from scheduler_ext.placement.levels import contains
from scheduler_ext.placement.model import Decision, Group
from scheduler_ext.state.cache import ClusterState
from scheduler_ext.state.facts import PodFacts
from topology.model import Tier

log = structlog.get_logger("toposerve.extender")

Persist = Callable[[str, str, Decision], None]


class BadRequest(ValueError):
    """The scheduler's request is not what the extender protocol says."""


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


@dataclass
class Candidates:
    names: list[str]
    nodes: dict[str, Any] | None  # full mode: name -> Node object, to send back


def _candidates(args: dict[str, Any]) -> Candidates:
    if isinstance(args.get("NodeNames"), list):
        return Candidates(args["NodeNames"], None)
    nodes = args.get("Nodes")
    if isinstance(nodes, dict) and isinstance(nodes.get("items"), list):
        by_name = {str((n.get("metadata") or {}).get("name")): n for n in nodes["items"]
                   if isinstance(n, dict)}
        return Candidates(list(by_name), by_name)
    raise BadRequest("expected NodeNames (a list of node names) or Nodes (a NodeList)")


def _pod(args: Any) -> dict[str, Any]:
    if not isinstance(args, dict):
        raise BadRequest("expected a JSON object with Pod")
    pod = args.get("Pod")
    if not isinstance(pod, dict) or not isinstance(pod.get("metadata"), dict):
        raise BadRequest("Pod is missing or not a Pod object")
    return pod


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

    # --- the decisions, synchronous and pure over the state ------------------------

    def _member(self, pod: dict[str, Any]) -> tuple[PodFacts, Group | None]:
        facts = self.state.observe(pod)
        if facts.ref is None:
            return facts, None
        view = self.state.snapshot()
        return facts, view.groups.get(facts.ref.key)

    def filter(self, args: Any) -> tuple[dict[str, Any], Decision | None, PodFacts]:
        pod = _pod(args)
        cands = _candidates(args)
        with self.state.lock:
            # asked again: the scheduler did not place it where we scored it
            self.state.unassume(str((pod.get("metadata") or {}).get("uid", "")))
            facts, group = self._member(pod)
            changed: Decision | None = None
            if facts.ref is not None and facts.ref.problem:
                res = FilterResult([], dict.fromkeys(cands.names,
                                                     f"cannot place the pod's group: "
                                                     f"{facts.ref.problem}"),
                                   outcome=Outcome.BAD_METADATA)
            elif group is None:
                res = filter_ungrouped(self.state.snapshot(), self.state.demand(facts),
                                       cands.names, self.clock())
            else:
                res = filter_member(self.state.view, group, facts.uid, cands.names,
                                    self.policy, self.clock())
                if res.decision is not None and self.state.decide(res.decision):
                    changed = res.decision
            self.metrics.decisions.labels(res.outcome.value).inc()
        if res.outcome in (Outcome.DECIDED, Outcome.CLIMBED, Outcome.NO_FIT,
                           Outcome.BAD_METADATA, Outcome.SIZE_UNKNOWN):
            d = res.decision
            log.info("group placement", pod=f"{facts.namespace}/{facts.name}",
                     group=facts.ref.key if facts.ref else None, outcome=res.outcome.value,
                     level=d.tier.name.lower() if d else None,
                     domain="/".join(str(x) for x in d.domain) if d else None,
                     reason=next(iter(res.failed.values()), None) if not res.passed else None)
        out: dict[str, Any] = {"FailedNodes": {} if res.unresolvable else res.failed,
                               "Error": ""}
        if res.unresolvable:  # the scheduler then tries no preemption for it
            out["FailedAndUnresolvableNodes"] = res.failed
        if cands.nodes is None:
            out["NodeNames"] = res.passed
        else:
            out["Nodes"] = {"metadata": {}, "items": [cands.nodes[n] for n in res.passed]}
        return out, changed, facts

    def prioritize(self, args: Any) -> list[dict[str, Any]]:
        pod = _pod(args)
        cands = _candidates(args)
        with self.state.lock:
            facts, group = self._member(pod)
            if facts.ref is not None and facts.ref.problem:
                scores = neutral()
            elif group is None:
                scores = prioritize_ungrouped(self.state.snapshot(), self.state.demand(facts),
                                              cands.names, self.policy, self.clock())
            else:
                scores = prioritize_member(self.state.view, group, facts.uid, cands.names,
                                           self.policy, self.clock())
            if (best := top(scores)) is not None:
                self.state.assume(facts.uid, best)
        # a node left out scores 0, as neutral as it gets (and 5,000 entries less)
        return [{"Host": n, "Score": s} for n, s in scores.items() if s]

    def preempt(self, args: Any) -> dict[str, Any]:
        """Keep the candidate nodes that the pod's group may use at all
        (inside its decided domain); victims are the scheduler's."""
        pod = _pod(args)
        meta = args.get("NodeNameToMetaVictims")
        full = args.get("NodeNameToVictims")
        if not isinstance(meta, dict):
            if full is not None and not isinstance(full, dict):
                raise BadRequest("NodeNameToVictims must be an object")
            meta = {node: {"Pods": [{"UID": (p.get("metadata") or {}).get("uid", "")}
                                    for p in (v or {}).get("Pods") or []],
                           "NumPDBViolations": (v or {}).get("NumPDBViolations", 0)}
                    for node, v in (full or {}).items()}
        with self.state.lock:
            _, group = self._member(pod)
            decision = self.state.view.decisions.get(group.key) if group else None
            if decision is not None and decision.holds(group, self.clock()):
                view = self.state.view
                meta = {n: v for n, v in meta.items() if n in view.nodes and
                        (d := view.nodes[n].domain(decision.tier)) is not None and
                        contains(decision.domain, d)}
        return {"NodeNameToMetaVictims": meta}

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

    def _verb(self, verb: str, fn: Callable[[Any], Any]) -> Callable[
            [web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            started = time.perf_counter()
            try:
                args = orjson.loads(await request.read())
                result = fn(args)
                if verb == "filter":
                    result, changed, facts = result
                    if changed is not None and self.persist is not None:
                        loop = asyncio.get_running_loop()
                        self._remember(loop.run_in_executor(
                            None, self.persist, facts.namespace, facts.name, changed))
                resp = _json(result)
            except (orjson.JSONDecodeError, BadRequest) as err:
                resp = _json({"Error": f"bad {verb} request: {err}"}, status=400)
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
        return web.Response(body=generate_latest(self.metrics.registry),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 2**20)  # full Nodes at 5,000 nodes
        app.router.add_post("/filter", self._verb("filter", self.filter))
        app.router.add_post("/prioritize", self._verb("prioritize", self.prioritize))
        app.router.add_post("/preempt", self._verb("preempt", self.preempt))
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


def serve(cfg: ExtenderConfig, kubeconfig: str | None) -> None:
    import uvloop

    from scheduler_ext.state.watch import Watches

    state = ClusterState(cfg)
    watches = Watches(api_client(kubeconfig), state)
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
    web.run_app(app, host=cfg.server.host, port=cfg.server.port, ssl_context=ssl_context(cfg),
                access_log=None, print=lambda *_: None, shutdown_timeout=5)
