"""Every background loop of the router goes on past bad input: one
endpoint's malformed answer, a pod or a Secret the apiserver gives in a
shape nobody expected, a broken kubeconfig, a KV-event batch or a
replicated decision that is not one. Each error is logged once a streak
(naming the loop and what failed), counted in
``toposerve_router_loop_errors_total{loop}``, backed off, and a later good
answer is picked up. Real servers on loopback (aiohttp model servers and
apiserver, ZMQ sockets, redis-server), the router's own loops."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Coroutine, MutableMapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import msgpack
import orjson
import pytest
import redis.asyncio as aioredis
import structlog
import yaml
import zmq
import zmq.asyncio
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from multidict import CIMultiDict, CIMultiDictProxy
from prometheus_client.parser import text_string_to_metric_families

from toposerve.localcluster.ports import free_port
from toposerve.router.admission.flow_control import Admission
from toposerve.router.config import KubernetesDiscovery, RouterConfig, SnapshotConfig
from toposerve.router.ha.bus import RedisBus
from toposerve.router.ha.replication import Replication
from toposerve.router.http.app import ROUTER, Router, build_app
from toposerve.router.metrics import RouterMetrics
from toposerve.router.pool.endpoints import Endpoint, LoadSample, Pool
from toposerve.router.pool.kubernetes import KubernetesWatcher
from toposerve.router.pool.static import load_static
from toposerve.router.prefix.index import PrefixIndex
from toposerve.router.prefix.kv_index import KVIndex
from toposerve.router.responses.store import MemoryStore
from toposerve.router.scheduling.profile import Scheduler
from toposerve.router.state import RouterState
from toposerve.wire.tokens import ByteTokenizer

Logs = list[MutableMapping[str, Any]]

METRICS = (b"vllm:num_requests_waiting 0\nvllm:num_requests_running 0\n"
           b"vllm:kv_cache_usage_perc 0.1\n")
MODELS = b'{"object": "list", "data": [{"id": "m"}]}'
HUGE = 5 * 2**20  # over the 4 MiB a scrape reads of one answer
GOOD = {"/health": b"", "/metrics": METRICS, "/v1/models": MODELS}


def _config(**doc: Any) -> RouterConfig:
    return RouterConfig.model_validate({
        "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
        "discovery": {"static": [{"url": "http://127.0.0.1:1"}]}, **doc})


def loop_errors(loop: str) -> float:
    """toposerve_router_loop_errors_total{loop} as a router's /metrics says it."""
    text = RouterMetrics(RouterState(_config())).render().decode()
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "toposerve_router_loop_errors_total" and s.labels["loop"] == loop:
                return s.value
    return 0.0


def logged(logs: Logs, loop: str, **what: str) -> list[MutableMapping[str, Any]]:
    """The error lines the loop logged about ``what``."""
    return [e for e in logs if e["log_level"] == "error" and e.get("loop") == loop
            and all(e.get(k) == v for k, v in what.items())]


async def until(what: str, check: Callable[[], object], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(asyncio.wait_for(test(), 60))


class ModelServer:
    """A model server's /health, /metrics and /v1/models; each answer can be
    changed while it runs."""

    def __init__(self) -> None:
        self.answers = dict(GOOD)
        self.served: Counter[str] = Counter()
        app = web.Application()
        app.router.add_get("/{path:.*}", self._answer)
        self.server = TestServer(app, host="127.0.0.1")

    async def _answer(self, request: web.Request) -> web.Response:
        self.served[request.path] += 1
        return web.Response(body=self.answers[request.path], content_type="text/plain")

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    @property
    def port(self) -> int:
        assert self.server.port is not None
        return self.server.port


@asynccontextmanager
async def model_servers(n: int) -> AsyncIterator[list[ModelServer]]:
    servers = [ModelServer() for _ in range(n)]
    for s in servers:
        await s.server.start_server()
    try:
        yield servers
    finally:
        for s in servers:
            await s.server.close()


@asynccontextmanager
async def router_over(urls: list[str], **doc: Any) -> AsyncIterator[Router]:
    app = build_app(_config(**{"scrape": {"intervalSeconds": 0.05},
                               "discovery": {"static": [{"url": u} for u in urls]}, **doc}))
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        yield app[ROUTER]
    finally:
        await client.close()


# --- scrape -------------------------------------------------------------------------
BAD_ANSWERS = {
    "models-data-not-a-list": ("/v1/models", b'{"data": 5}'),
    "models-a-list": ("/v1/models", b"[1, 2]"),
    "models-truncated": ("/v1/models", b'{"data": [{"id": "m"'),
    "models-huge": ("/v1/models", b'{"data": [{"id": "m"}], "pad": "' + b"x" * HUGE + b'"}'),
    "metrics-garbage": ("/metrics", b'vllm:num_requests_waiting{engine="0"} many\n'),
    "metrics-huge": ("/metrics", METRICS + b"# padding\n" * (HUGE // 10)),
}


@pytest.mark.unit
@pytest.mark.parametrize("case", sorted(BAD_ANSWERS))
def test_one_endpoints_bad_answer_stops_no_other_scrape(case: str) -> None:
    """The bad endpoint is unhealthy, its error logged once and counted;
    the good one is still scraped; once the bad one answers well, it serves."""
    path, body = BAD_ANSWERS[case]

    async def go() -> None:
        before = loop_errors("scrape")
        async with model_servers(2) as (good, bad):
            bad.answers[path] = body
            with structlog.testing.capture_logs() as logs:
                async with router_over([good.url, bad.url]) as router:
                    g, b = router.state.pool.get(good.url), router.state.pool.get(bad.url)
                    assert g is not None and b is not None
                    await until("the good endpoint healthy", lambda: g.healthy)
                    await until("the bad answer counted three times",
                                lambda: loop_errors("scrape") >= before + 3)
                    seen = g.load.at
                    await until("the good endpoint scraped since", lambda: g.load.at > seen)
                    assert not b.healthy
                    [line] = logged(logs, "scrape", endpoint=b.name)
                    assert path in line["error"] or "bytes" in line["error"], line
                    bad.answers[path] = GOOD[path]
                    await until("the bad endpoint healthy once it answers well",
                                lambda: b.healthy)
                    assert any(e["event"].startswith("background loop recovered")
                               and e.get("endpoint") == b.name for e in logs)

    run(go)


# --- a fake apiserver: Kubernetes discovery and the API-key Secret -----------------------
class ApiServer:
    """LISTs answered from a script per path (the last answer repeats);
    a WATCH stays open a while with no events."""

    def __init__(self, lists: dict[str, list[Any]]) -> None:
        self.lists = lists
        self.listed: Counter[str] = Counter()
        self.closing = asyncio.Event()
        app = web.Application()
        app.router.add_get("/{path:.*}", self._answer)
        self.server = TestServer(app, host="127.0.0.1")

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        if request.query.get("watch") == "true":
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.closing.wait(), 1.0)
            return resp
        self.listed[request.path] += 1
        script = self.lists[request.path]
        return web.Response(body=orjson.dumps(script.pop(0) if len(script) > 1 else script[0]),
                            content_type="application/json")

    def kubeconfig(self, tmp_path: Path) -> str:
        return write_kubeconfig(tmp_path, f"http://127.0.0.1:{self.server.port}")


def write_kubeconfig(tmp_path: Path, server: str) -> str:
    f = tmp_path / "kubeconfig"
    f.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": server}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
        "users": [{"name": "x", "user": {"token": "t"}}]}))
    return str(f)


@asynccontextmanager
async def apiserver(lists: dict[str, list[Any]]) -> AsyncIterator[ApiServer]:
    api = ApiServer(lists)
    await api.server.start_server()
    try:
        yield api
    finally:
        api.closing.set()
        await api.server.close()


def _pod(name: str, ip: str = "127.0.0.1") -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"app": "m"}, "resourceVersion": "5"},
            "spec": {}, "status": {"phase": "Running", "podIP": ip,
                                   "conditions": [{"type": "Ready", "status": "True"}]}}


def _list(*items: Any) -> dict[str, Any]:
    return {"kind": "List", "metadata": {"resourceVersion": "5"}, "items": list(items)}


PODS = "/api/v1/namespaces/default/pods"
BAD_PODS = [{"metadata": {"name": "no-labels", "labels": [1]}, "status": {}},
            {"metadata": {}, "status": {"phase": "Running"}}]


@pytest.mark.unit
@pytest.mark.parametrize("script", ["bad-pods-beside-a-good-one", "a-list-that-is-not-one"])
def test_discovery_routes_the_good_pods_past_bad_ones(tmp_path: Path, script: str) -> None:
    async def go() -> None:
        before = loop_errors("discovery")
        async with model_servers(1) as [model]:
            lists: list[Any]
            if script == "bad-pods-beside-a-good-one":
                lists, bad = [_list(BAD_PODS[0], _pod("good"), BAD_PODS[1])], BAD_PODS
            else:
                lists, bad = [[1, 2], _list(_pod("good"))], [[1, 2]]
            async with apiserver({PODS: lists}) as api:
                cfg = KubernetesDiscovery.model_validate({
                    "labelSelector": "app=m", "port": model.port,
                    "kubeconfig": api.kubeconfig(tmp_path)})
                pool = Pool()
                watcher = KubernetesWatcher(cfg, pool, 1.0)
                with structlog.testing.capture_logs() as logs:
                    watcher.start()
                    try:
                        await until("the good pod routed", lambda: pool.get(model.url))
                        await until("the bad ones counted",
                                    lambda: loop_errors("discovery") >= before + len(bad))
                    finally:
                        watcher.stop()
                if script == "bad-pods-beside-a-good-one":  # once a pod, each named
                    assert sorted(e["pod"] for e in logged(logs, "discovery")) == [
                        "(no name)", "no-labels"]
                else:
                    assert len(logged(logs, "discovery")) == 1

    run(go)


SECRETS = "/api/v1/namespaces/default/secrets"


def _keys_config(kubeconfig: str) -> RouterConfig:
    return _config(flowControl={"enabled": True, "queueTTLSeconds": 10, "tenants": {
        "keys": {"secret": {"name": "keys", "kubeconfig": kubeconfig}}}})


def _admission(cfg: RouterConfig) -> tuple[Admission, RouterMetrics, Endpoint]:
    state = RouterState(cfg)
    ep = state.pool.upsert(Endpoint("http://127.0.0.1:9", healthy=True))
    metrics = RouterMetrics(state)
    return Admission(cfg.flow_control, state, metrics), metrics, ep


def _gauge(metrics: RouterMetrics, name: str) -> float:
    for fam in text_string_to_metric_families(metrics.render().decode()):
        for s in fam.samples:
            if s.name == name:
                return s.value
    raise AssertionError(f"{name} not in /metrics")


@pytest.mark.unit
def test_key_secret_is_read_after_a_malformed_answer(tmp_path: Path) -> None:
    secret = {"metadata": {"name": "keys", "resourceVersion": "5"},
              "data": {"team-a": base64.b64encode(b"sk-1\n").decode()}}

    async def go() -> None:
        before = loop_errors("api-keys")
        async with apiserver({SECRETS: [[1, 2], _list(5), _list(secret)]}) as api:
            adm, metrics, _ = _admission(_keys_config(api.kubeconfig(tmp_path)))
            with structlog.testing.capture_logs() as logs:
                task = asyncio.create_task(adm.run(0.05))
                try:
                    await until("the key read", lambda: adm.tenants.who("Bearer sk-1"))
                    await until("the gauge set", lambda: _gauge(
                        metrics, "toposerve_router_api_keys_loaded") == 1)
                finally:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            assert adm.tenants.who("Bearer sk-1") == "team-a"
            assert loop_errors("api-keys") >= before + 2
            [line] = logged(logs, "api-keys", secret="default/keys")
            assert "401" in line["effect"]

    run(go)


@pytest.mark.unit
@pytest.mark.parametrize("kubeconfig", ["nothing-listens", "not-a-kubeconfig"])
def test_release_goes_on_while_the_key_secret_cannot_be_read(tmp_path: Path,
                                                             kubeconfig: str) -> None:
    """Every request would get 401 (no key has loaded): said once and in a
    gauge; the release of waiting requests is not stopped by it."""
    if kubeconfig == "nothing-listens":
        path = write_kubeconfig(tmp_path, f"http://127.0.0.1:{free_port()}")
    else:
        (tmp_path / "kubeconfig").write_text("a: [\n")
        path = str(tmp_path / "kubeconfig")

    async def go() -> None:
        before = loop_errors("api-keys")
        adm, metrics, ep = _admission(_keys_config(path))
        ep.load = LoadSample(waiting=100, at=time.monotonic())  # full: a request waits
        headers = CIMultiDictProxy(CIMultiDict[str]())
        with structlog.testing.capture_logs() as logs:
            task = asyncio.create_task(adm.run(0.05))
            try:
                waiting = asyncio.create_task(adm.admit(adm.classify(headers), lambda: [ep]))
                await until("the request queued", lambda: adm.queued == 1)
                await until("the key source failing again and again",
                            lambda: loop_errors("api-keys") >= before + 3)
                assert _gauge(metrics, "toposerve_router_api_keys_loaded") == 0
                ep.load = LoadSample(waiting=0, at=time.monotonic())
                await asyncio.wait_for(waiting, 2)  # let go by the release loop
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        [line] = logged(logs, "api-keys", secret="default/keys")
        assert "401" in line["effect"]

    run(go)


# --- KV events ---------------------------------------------------------------------
@pytest.mark.unit
def test_kv_subscription_goes_on_past_bad_batches_and_a_bad_replay() -> None:
    url = "http://127.0.0.1:9"
    end = (-1).to_bytes(8, "big", signed=True)
    good = msgpack.packb([0.0, [["BlockStored", [1, 2], None, list(range(32)), 16]]])
    bad = [b"\xc1", msgpack.packb([0.0, 5]),
           msgpack.packb([0.0, [["BlockStored", [1], None, [1] * 16, "sixteen"]]])]

    async def go() -> None:
        before = loop_errors("kv-events")
        ctx = zmq.asyncio.Context.instance()
        pub, replay = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
        for s in (pub, replay):
            s.setsockopt(zmq.LINGER, 0)
        pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
        replay_port = replay.bind_to_random_port("tcp://127.0.0.1")
        replies = [[b"one frame, not a replayed batch"]]

        async def answer() -> None:
            while True:
                ident, *_ = await replay.recv_multipart()
                await replay.send_multipart([ident, *(replies.pop(0) if replies
                                                       else [b"", end, b""])])

        responder = asyncio.create_task(answer())
        index = PrefixIndex()
        kv = KVIndex(index, ByteTokenizer(), 16)
        seq = 0

        async def publish(payloads: list[bytes]) -> None:
            nonlocal seq
            for p in payloads:
                await pub.send_multipart([b"kv", seq.to_bytes(8, "big"), p])
                seq += 1
            await asyncio.sleep(0.05)

        with structlog.testing.capture_logs() as logs:
            kv.watch(url, f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}")
            try:
                deadline = time.monotonic() + 10
                while loop_errors("kv-events") < before + 1 + len(bad):
                    assert time.monotonic() < deadline, "the bad batches were not counted"
                    await publish(bad)
                assert len(logged(logs, "kv-events", endpoint=url)) == 1
                while not len(index):
                    assert time.monotonic() < deadline, "the good batch was not applied"
                    await publish([good])
            finally:
                await kv.close()
                responder.cancel()
                pub.close()
                replay.close()

    run(go)


# --- replication --------------------------------------------------------------------
def test_replication_drops_what_is_not_a_decision_and_goes_on(redis_url: str) -> None:
    channel = "toposerve:decisions:test/loops"
    url = "http://127.0.0.1:9001"
    decision = {"from": "a#1", "seq": 1, "stage": "profile", "url": url, "session": None,
                "blocks": {"64": [1, 2]}}
    bad = [b"{not json", b"[1, 2]", *(orjson.dumps({**decision, **change}) for change in (
        {"stage": ["profile"]}, {"blocks": [1]}, {"blocks": {"x": [1]}}, {"session": ["s"]}))]

    async def go() -> None:
        before = loop_errors("replication-subscribe")
        cfg = _config(discovery={"static": [{"url": url}]})
        state = RouterState(cfg)
        load_static(state.pool, cfg.discovery.static)
        counts: Counter[str] = Counter()
        rep = Replication(RedisBus(redis_url, channel), "b",
                          {"profile": Scheduler(state, cfg.profile, None)},
                          state.pool, lambda outcome, n: counts.update({outcome: n}),
                          SnapshotConfig(enabled=False))
        r = aioredis.from_url(redis_url)
        with structlog.testing.capture_logs() as logs:
            rep.start()
            try:
                async def subscribed() -> bool:
                    return bool((await r.pubsub_numsub(channel))[0][1])

                deadline = time.monotonic() + 10
                while not await subscribed():
                    assert time.monotonic() < deadline
                    await asyncio.sleep(0.02)
                for raw in bad:
                    await r.publish(channel, raw)
                await until("the bad messages counted",
                            lambda: loop_errors("replication-subscribe") >= before + len(bad))
                await r.publish(channel, orjson.dumps(decision))
                await until("the decision applied", lambda: counts["received"] == 1)
            finally:
                await rep.close()
                await r.aclose()
        assert len(logged(logs, "replication-subscribe")) == 1

    run(go)


# --- the Responses store's background task --------------------------------------------
@pytest.mark.unit
def test_responses_store_sweeps_on_after_a_failed_sweep(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    calls: list[float] = []
    sweep = MemoryStore.sweep

    def failing_once(self: MemoryStore, now: float | None = None) -> int:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("the first sweep fails")
        return sweep(self, now)

    monkeypatch.setattr(MemoryStore, "sweep", failing_once)

    async def go() -> None:
        before = loop_errors("responses-store")
        async with model_servers(1) as [model]:
            with structlog.testing.capture_logs() as logs:
                async with router_over([model.url],
                                       responses={"sweepIntervalSeconds": 0.01}):
                    await until("sweeps after the failed one", lambda: len(calls) >= 3)
        assert loop_errors("responses-store") == before + 1
        [line] = logged(logs, "responses-store")
        assert "the first sweep fails" in line["error"]

    run(go)
