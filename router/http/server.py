"""The router's HTTP surface: OpenAI-compatible endpoints in front of a pool
of vLLM/SGLang servers, plus /health, /ready and /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import socket
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import structlog
from aiohttp import web
from pydantic import BaseModel, ValidationError
from toposerve.router.admission.budget import Budget, Overloaded
from toposerve.router.admission.flow_control import MAX_TOKENS, Admission
from toposerve.router.admission.usage import OUTPUT_TOKENS, requested_output, responses_output
from toposerve.router.config import RouterConfig
from toposerve.router.disaggregation.pairing import RESPONSES_PATH, Disaggregation
from toposerve.router.disaggregation.split import Call, Route, Splitter
from toposerve.router.ha.standby import HotStandby
from toposerve.router.metrics import RouterMetrics
from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.pool.kubernetes import KubernetesWatcher
from toposerve.router.pool.revisions import Revisions
from toposerve.router.pool.scrape import scrape_loop
from toposerve.router.pool.static import load_static
from toposerve.router.prefix.kv_index import KVIndex
from toposerve.router.relay.proxy import Proxy, Upstream, forward_headers
from toposerve.router.request import RequestContext
from toposerve.router.responses.relay import ResponsesTap, output_text
from toposerve.router.responses.store import (
    ResponsesStore,
    keep_or_fail,
    make_store,
    new_id,
    read_chain,
    tenant_of,
)
from toposerve.router.scheduling.filters import RevisionFilter
from toposerve.router.scheduling.profile import Decision, Scheduler
from toposerve.router.state import RouterState
from toposerve.serving.http import run_app
from toposerve.wire.chat_template import load_chat_template
from toposerve.wire.errors import ApiError, error_response, from_validation
from toposerve.wire.openai import ChatRequest, CompletionRequest, ResponsesRequest
from toposerve.wire.prompt import chat_prompt, completion_prompt, responses_items
from toposerve.wire.tokens import load_tokenizer

log = structlog.get_logger("router")
SESSION_HEADERS = ("x-session-id", "x-llm-d-session-id")
DRAIN_GRACE_S = 1.0
# aiohttp's own line limits, this many times server.maxHeaderBytes: lines
# between the two get the router's JSON error, longer ones aiohttp's 400
PARSER_SLACK = 8
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
GC_THRESHOLDS = (50_000, 20, 100)


class Router:
    def __init__(self, cfg: RouterConfig) -> None:
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
        self.split: Splitter | None = None
        self.admission = Admission(cfg.flow_control, self.state, self.metrics)
        self.budget = Budget(cfg.server)
        self.store: ResponsesStore = make_store(cfg.responses)
        self.ha: HotStandby | None = None
        if cfg.ha.enabled:
            stages = {"profile": self.scheduler} | (
                {"prefill": self.pd.prefill, "decode": self.pd.decode} if self.pd else {})
            self.ha = HotStandby(cfg.ha, cfg.responses, stages, self.state.pool,
                                 leading=lambda on: self.metrics.leader.set(1 if on else 0),
                                 count=lambda outcome, n: self.metrics.replication
                                 .labels(outcome).inc(n),
                                 count_snapshot=lambda outcome: self.metrics.snapshots
                                 .labels(outcome).inc())
            self.metrics.leader.set(0)
        self.session: aiohttp.ClientSession | None = None
        self.proxy: Proxy | None = None
        self.watcher: KubernetesWatcher | None = None
        self._tasks: list[asyncio.Task[Any]] = []

    # --- lifecycle ---------------------------------------------------------
    def _watch_events(self, ep: Endpoint) -> None:
        if self.kv is not None and ep.kv_events:
            self.kv.watch(ep.url, ep.kv_events, ep.kv_events_replay)

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
                           self.admission.request_done)
        if self.pd is not None:
            self.split = Splitter(self.pd, self.proxy, self.metrics, self._schedule)
        for ep in load_static(self.state.pool, self.cfg.discovery.static):
            self._watch_events(ep)
        if self.cfg.discovery.kubernetes is not None:
            self.watcher = KubernetesWatcher(self.cfg.discovery.kubernetes, self.state.pool,
                                             s.drain_timeout_s, on_add=self._watch_events,
                                             on_remove=self._forget,
                                             requests=lambda verb: self.metrics.discovery
                                             .labels(verb).inc())
            self.watcher.start()
        sc = self.cfg.scrape
        self._tasks.append(asyncio.create_task(
            scrape_loop(self.session, self.state.pool, sc.interval_s, sc.timeout_s,
                        sc.health_interval_s)))
        self._tasks.append(asyncio.create_task(self.admission.run(sc.interval_s)))
        self._tasks.append(asyncio.create_task(self.store.run()))
        if self.ha is not None:
            self.ha.start()

    async def draining(self, app: web.Application) -> None:
        """On SIGTERM the listener is closed; in-flight requests get
        server.drainTimeoutSeconds to finish, then end with an error saying
        why (aiohttp waits DRAIN_GRACE_S longer, for those last writes)."""
        drain = self.cfg.server.drain_timeout_s
        log.info("stopping: in-flight requests finish first",
                 inflight=sum(ep.inflight for ep in self.state.pool), timeout_s=drain)
        assert self.proxy is not None
        asyncio.get_running_loop().call_later(
            drain, self.proxy.cut, "the router stopped before the answer was complete "
                                   "(server.drainTimeoutSeconds)")

    async def stop(self, app: web.Application) -> None:
        if self.watcher:
            self.watcher.stop()
        if self.ha is not None:
            await self.ha.close()
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        if self.kv:
            await self.kv.close()
        await self.store.close()
        if self.proxy:
            self.proxy.close()
        if self.session:
            await self.session.close()

    # --- request parsing -----------------------------------------------------
    async def _json(self, request: web.Request, model: type[BaseModel]
                    ) -> tuple[bytes, dict[str, Any], Any]:
        body = await self.budget.read_body(request)
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as err:
            raise ApiError(400, f"request body is not valid JSON: {err}") from None
        if not isinstance(doc, dict):
            raise ApiError(400, "request body must be a JSON object")
        try:
            parsed = model.model_validate(doc)
        except ValidationError as err:
            raise from_validation(err) from None
        request[MAX_TOKENS] = requested_output(parsed)  # flow control's cost
        return body, doc, parsed

    def _check_model(self, model: str | None) -> None:
        if model is None or self.state.pool.may_serve(model):
            return
        raise ApiError(404, f"The model `{model}` does not exist.", "model")

    def _context(self, request: web.Request, model: str | None, prompt: str) -> RequestContext:
        raw = next((request.headers[h] for h in SESSION_HEADERS if h in request.headers), None)
        session = None if raw is None else session_key(raw)
        return RequestContext(model=model, prompt=prompt.encode("utf-8", "surrogatepass"),
                              session=session)

    async def _schedule(self, request: web.Request, ctx: RequestContext,
                        scheduler: Scheduler | None = None) -> Decision:
        sched = scheduler or self.scheduler
        await self.admission.admit(self.admission.of_request(request, ctx),
                                   lambda: sched.candidates(ctx))
        t0 = time.perf_counter()
        d = sched.schedule(ctx)
        self.metrics.scheduling.observe(time.perf_counter() - t0)
        if self.ha is not None:
            self.ha.tap(d, sched)  # the other replicas learn where it went
        if not d.ranked:
            raise ApiError(503, "no ready endpoint serves this request")
        self.metrics.decided(d.reason)
        if (p := d.cycle.prefix) is not None and p.blocks:
            self.metrics.prefix_match.observe(p.matched.get(d.ranked[0].url, 0) / p.blocks)
        return d

    # --- handlers ------------------------------------------------------------
    async def _generate(self, request: web.Request, path: str,
                        model: type[BaseModel], prompt_of: Callable[[dict[str, Any]], str]
                        ) -> web.StreamResponse:
        """``prompt_of`` reads the validated document, not the model: dumping
        the messages back to dicts cost as much as validating them."""
        started = time.monotonic()
        body, doc, req = await self._json(request, model)
        self._check_model(req.model)
        ctx = self._context(request, req.model, prompt_of(doc))
        if model is ChatRequest:
            ctx.chat = doc  # the precise index tokenizes it through the chat template
        headers = forward_headers(request)
        call = Call(request, path, body, doc, ctx, headers, started)
        if self.split is not None and self.split.splits(call):
            return await self.split.serve(call)
        d = await self._schedule(request, ctx)
        assert self.proxy is not None
        return await self.proxy.relay(request, d.ranked, path, body, headers, d.work(), started)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(
            request, "/v1/chat/completions", ChatRequest, lambda d: chat_prompt(d["messages"]))

    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, "/v1/completions", CompletionRequest,
                                    lambda d: completion_prompt(d["prompt"]))

    async def create_response(self, request: web.Request) -> web.StreamResponse:
        """The router keeps the conversation, so any endpoint can continue a
        chain; the endpoint that served the last turn is still preferred."""
        started = time.monotonic()
        _body, doc, req = await self._json(request, ResponsesRequest)
        self._check_model(req.model)
        history: list[dict[str, Any]] = []
        earlier: list[str] = []
        affinity = revision = None
        if req.previous_response_id is not None:
            chain = await read_chain(self.store, req.previous_response_id, tenant_of(request),
                                     self.cfg.responses.max_chain_turns)
            if chain is None:
                raise ApiError(404, f"Response with id '{req.previous_response_id}' not "
                                      "found.", "previous_response_id")
            earlier, turns = chain
            history = [m for t in turns for m in [*responses_items(t["input"]), t["output"]]]
            affinity, revision = turns[-1]["endpoint"], turns[-1].get("revision")
        conversation = history + responses_items(doc["input"])
        upstream_doc = {k: v for k, v in doc.items() if k != "previous_response_id"}
        upstream_doc.update(input=[{"type": "message", "role": m["role"],
                                    "content": m["content"]} for m in conversation],
                            store=False)
        msgs = ([{"role": "system", "content": req.instructions}] if req.instructions else []
                ) + conversation
        ctx = self._context(request, req.model, chat_prompt(msgs))
        ctx.affinity_url = affinity
        ctx.revision = revision  # the chain's revision, while it has ready endpoints
        body = orjson.dumps(upstream_doc)
        call = Call(request, RESPONSES_PATH, body, upstream_doc, ctx, forward_headers(request),
                    started)
        if self.split is not None and self.split.splits(call):
            route = await self.split.hand_over(call)
            if isinstance(route, web.Response):
                return route
        else:
            d = await self._schedule(request, ctx)
            route = Route(d.ranked, body, d.work())
        assert self.proxy is not None
        rid = new_id()  # the turn's id, whatever the upstream calls its answer

        async def keep(ep: Endpoint, resp: dict[str, Any], text: str) -> None:
            if (n := responses_output(resp)) is not None:
                request[OUTPUT_TOKENS] = n  # flow control settles on the answer's usage
            # a split chain's next turn prefers the prefill endpoint: it holds the prefix;
            # the turn stores its own input and output, the chain before it is linked
            if req.store is not False:
                await self.store.put(rid, {
                    "endpoint": (route.prefill or ep).url, "response": resp,
                    "revision": ep.revision or "", "previous": req.previous_response_id,
                    "input": doc["input"], "output": {"role": "assistant", "content": text}},
                    tenant_of(request), earlier)

        if req.stream:
            return await self.proxy.relay(
                request, route.ranked, RESPONSES_PATH, route.body, call.headers, route.work,
                started, ResponsesTap(rid, req.previous_response_id, keep_or_fail(
                    keep, self.metrics.responses_unstored.inc)), route.headers)
        up = await self.proxy.fetch(route.ranked, RESPONSES_PATH, route.body, call.headers,
                                    route.work)
        if not isinstance(up, Upstream):
            return self.proxy.refusal(up)
        if up.status != 200:
            return web.Response(status=up.status, body=up.body, content_type=None,
                                headers={"Content-Type": up.content_type})
        resp = orjson.loads(up.body)
        resp["id"], resp["previous_response_id"] = rid, req.previous_response_id
        await keep(up.endpoint, resp, output_text(resp))
        return web.Response(body=orjson.dumps(resp), content_type="application/json",
                            headers={"X-Request-Id": call.headers["X-Request-Id"],
                                     "X-Toposerve-Endpoint": up.endpoint.name, **route.headers})

    async def _turn(self, request: web.Request) -> tuple[str, dict[str, Any]]:
        rid = request.match_info["id"]
        rec = await self.store.get(rid, tenant_of(request))
        if rec is None:
            raise ApiError(404, f"Response with id '{rid}' not found.")
        return rid, rec

    async def get_response(self, request: web.Request) -> web.StreamResponse:
        _rid, rec = await self._turn(request)
        return web.Response(body=orjson.dumps(rec["response"]), content_type="application/json")

    async def delete_response(self, request: web.Request) -> web.StreamResponse:
        rid = request.match_info["id"]
        if not await self.store.delete(rid, tenant_of(request)):
            raise ApiError(404, f"Response with id '{rid}' not found.")
        return web.Response(body=orjson.dumps({"id": rid, "object": "response",
                                               "deleted": True}),
                            content_type="application/json")

    async def input_items(self, request: web.Request) -> web.StreamResponse:
        """The turn's own input items, as OpenAI lists them (newest first
        unless ``order=asc``; ``limit``, ``after``)."""
        rid, rec = await self._turn(request)
        raw = rec["input"]
        items = [{"type": "message", "role": "user", "content": raw}] if isinstance(
            raw, str) else [i for i in raw if isinstance(i, dict)]
        listed = [{**item, "id": item.get("id") or f"msg_{rid[5:]}_{n}",
                   **({"type": "message", "status": "completed",
                       "content": _input_content(item.get("content"))}
                      if item.get("type", "message") == "message" else {})}
                  for n, item in enumerate(items)]
        q = request.query
        if q.get("order", "desc") == "desc":
            listed.reverse()
        if (after := q.get("after")) is not None:
            ids = [i["id"] for i in listed]
            listed = listed[ids.index(after) + 1:] if after in ids else []
        try:
            limit = min(max(int(q.get("limit", "20")), 1), 100)
        except ValueError:
            raise ApiError(400, "limit must be an integer", "limit") from None
        page = listed[:limit]
        return web.Response(body=orjson.dumps({
            "object": "list", "data": page, "has_more": len(listed) > limit,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None}), content_type="application/json")

    def _served(self) -> list[str]:
        return sorted({m for ep in self.state.pool.routable() if ep.healthy for m in ep.models})

    async def models(self, request: web.Request) -> web.StreamResponse:
        data = [_model(n) for n in self._served()]
        return web.Response(body=orjson.dumps({"object": "list", "data": data}),
                            content_type="application/json")

    async def model(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["model"]
        if name not in self._served():
            raise ApiError(404, f"The model `{name}` does not exist.", "model")
        return web.Response(body=orjson.dumps(_model(name)), content_type="application/json")

    async def health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def ready(self, request: web.Request) -> web.StreamResponse:
        """200 with a ready endpoint, on the leader only under ha (a
        Service then sends traffic to it); ``?role=any``: whatever the role
        (a Deployment's readiness probe, so a rollout is not held up by a
        standby that is rightly unready)."""
        n = sum(1 for ep in self.state.pool.routable() if ep.healthy)
        if self.ha is not None and not self.ha.leader and request.query.get("role") != "any":
            return web.Response(status=503, text=f"standby; {n} endpoints ready")
        return web.Response(status=200 if n else 503, text=f"{n} endpoints ready")

    async def metrics_endpoint(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})



def session_key(header: str) -> str:
    """A session as the router keeps it: by its hash, so the tables of
    sessions hold 32 characters a session, whatever length of header a
    client sends."""
    return hashlib.blake2b(header.encode("utf-8", "surrogateescape"),
                           digest_size=16).hexdigest()


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "toposerve"}


def _input_content(content: Any) -> Any:
    """A message's content as OpenAI lists an input item's: parts."""
    return [{"type": "input_text", "text": content}] if isinstance(content, str) else content


def _oversized(request: web.Request, limit: int) -> web.Response | None:
    """The JSON error for a request line or header line over ``limit``
    bytes; it names the header, never its value (a bearer token)."""
    line = len(request.method) + len(request.raw_path) + 10
    if line > limit:
        return error_response(414, f"request line over {limit} bytes (server.maxHeaderBytes)")
    for name, value in request.raw_headers:
        if len(name) + len(value) + 2 > limit:
            shown = name.decode("latin-1")[:64]
            return error_response(431, f"header {shown} over {limit} bytes "
                                       "(server.maxHeaderBytes)")
    return None


# the Router an app serves, for tests that reach in
ROUTER = web.AppKey("router", Router)


def build_app(cfg: RouterConfig) -> web.Application:
    router = Router(cfg)

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.monotonic()
        path = request.match_info.route.resource.canonical if (
            request.match_info.route.resource is not None) else "unmatched"
        try:
            resp = (_oversized(request, cfg.server.max_header_bytes)
                    or await handler(request))
        except Overloaded as err:
            resp = error_response(err.status, err.message, err.param, err.headers)
        except ApiError as err:
            resp = error_response(err.status, err.message, err.param)
        except web.HTTPException as err:
            resp = error_response(err.status, err.reason)
        except (ConnectionResetError, asyncio.CancelledError):
            raise  # the client went away: nobody to answer
        except Exception as err:
            # a bug, not a refusal: the client still gets OpenAI's error
            # shape, and the log gets the traceback, once
            log.exception("request failed", path=path, error=repr(err))
            resp = error_response(500, f"internal error in the router ({type(err).__name__})")
        router.metrics.answered(path, resp.status, time.monotonic() - started)
        return resp

    app = web.Application(middlewares=[errors, router.budget.middleware(),
                                       router.admission.middleware()],
                          client_max_size=cfg.server.max_body_bytes)
    app[ROUTER] = router
    app.router.add_post("/v1/chat/completions", router.chat)
    app.router.add_post("/v1/completions", router.completions)
    app.router.add_post("/v1/responses", router.create_response)
    app.router.add_get("/v1/responses/{id}", router.get_response)
    app.router.add_delete("/v1/responses/{id}", router.delete_response)
    app.router.add_get("/v1/responses/{id}/input_items", router.input_items)
    app.router.add_get("/v1/models", router.models)
    app.router.add_get("/v1/models/{model:.+}", router.model)  # names hold slashes
    app.router.add_get("/health", router.health)
    app.router.add_get("/ready", router.ready)
    app.router.add_get("/metrics", router.metrics_endpoint)
    app.on_startup.append(router.start)
    app.on_shutdown.append(router.draining)
    app.on_cleanup.append(router.stop)
    return app


def serve(cfg: RouterConfig, sock: socket.socket | None = None) -> None:
    """Serve until stopped, on ``sock`` when given (bound already, so that a
    taken address fails before the router starts), else on the configured
    address."""
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
    run_app(build_app(cfg), error_factory=error_response, **where, access_log=None,
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
