"""The router's routes: each reads what its client asked into the request's
exchange and hands a generation request to the director's stages; the
Responses API's stored turns, the model list and the probes answer here."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from toposerve.router.admission.budget import Budget
from toposerve.router.admission.flow_control import client_id
from toposerve.router.admission.usage import requested_output
from toposerve.router.config import RouterConfig
from toposerve.router.disaggregation.pairing import RESPONSES_PATH, drop_hand_over
from toposerve.router.exchange import Exchange
from toposerve.router.ha.replica import Replica
from toposerve.router.http.bodies import (
    INLINE_VALUES,
    BodyWorker,
    few_values,
    list_sizes,
    parse,
)
from toposerve.router.http.director import Director
from toposerve.router.metrics import RouterMetrics
from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.relay.proxy import Upstream, forward_headers
from toposerve.router.request import RequestContext
from toposerve.router.responses import stored
from toposerve.router.responses.relay import ResponsesTap, output_text
from toposerve.router.responses.store import ResponsesStore, keep_or_fail
from toposerve.router.responses.turn import begin as begin_turn
from toposerve.router.state import RouterState
from toposerve.wire.errors import ApiError, from_validation
from toposerve.wire.openai import ChatRequest, CompletionRequest, ResponsesRequest
from toposerve.wire.prompt import chat_prompt, completion_prompt

SESSION_HEADERS = ("x-session-id", "x-llm-d-session-id")


class Handlers:
    def __init__(self, cfg: RouterConfig, state: RouterState, metrics: RouterMetrics,
                 budget: Budget, store: ResponsesStore, director: Director,
                 ha: Replica | None) -> None:
        self.cfg, self.state, self.metrics, self.budget = cfg, state, metrics, budget
        self.store, self.director, self.ha = store, director, ha
        self.bodies = BodyWorker()  # the app stops it
        # has discovery listed the pods once (the app sets it with a watcher)
        self.discovered: Callable[[], bool] = lambda: True

    # --- reading the request into its exchange ----------------------------------
    async def _json(self, ex: Exchange, model: type[BaseModel]) -> Any:
        """The body, parsed and validated; ``ex`` gets it and the output it
        asks for (flow control's cost)."""
        ex.body = await self.budget.read_body(ex.request, ex.hold)
        ex.body, ex.doc, parsed = await self.read_json(ex.body, model, ex.tenant)
        ex.max_tokens = requested_output(parsed)
        return parsed

    async def read_json(self, body: bytes, model: type[BaseModel], tenant: str
                        ) -> tuple[bytes, dict[str, Any], Any]:
        """A request ``body`` of ``model`` read as the router reads every
        one (the endpoint picker's too): what goes upstream (the body, or it
        without a client's hand-over fields), the document and the model;
        else the ApiError its client gets. A body that may hold more values
        than the loop parses unseen is read by the body worker first, and
        refused as the loop would refuse it (bodies.py); the model of a
        body the worker read is not validated again (``unvalidated``)."""
        server = self.cfg.server
        vetted = not few_values(body, min(INLINE_VALUES, server.max_json_values))
        if vetted:
            v = await self.bodies.vet(body, model, server.max_list_items,
                                      server.max_json_values)
            if v.unreadable is not None:
                raise ApiError(*v.unreadable)
            self._before_validation(v.model, v.sizes)
            if v.values > server.max_json_values:
                raise ApiError(413, f"request body holds more than {server.max_json_values} "
                                    "JSON values (server.maxJsonValues)")
            if v.invalid is not None:
                raise ApiError(*v.invalid)
        doc = parse(body)  # now known to cost the loop no more than its values
        self._before_validation(doc.get("model"), list_sizes(doc))
        if vetted:
            parsed = unvalidated(model, doc)
        else:
            try:
                parsed = model.model_validate(doc)
            except ValidationError as err:
                raise from_validation(err) from None
        trusted = self.director.admission.tenants.settings.get(tenant)
        if not (trusted and trusted.pass_transfer_fields) and drop_hand_over(doc):
            body = orjson.dumps(doc)  # only then: a body goes on as it was read
        return body, doc, parsed

    def _before_validation(self, model: object, sizes: Iterable[tuple[str, int]]) -> None:
        """What is cheap to refuse is refused before the body is validated
        (validation costs some microseconds an item): an unknown model, and
        more messages or input items than server.maxListItems."""
        if isinstance(model, str):
            self._check_model(model)
        limit = self.cfg.server.max_list_items
        for key, n in sizes:
            if n > limit:
                raise ApiError(413, f"{key} holds {n} items, over {limit} "
                                    "(server.maxListItems)", key)

    def _check_model(self, model: str | None) -> None:
        if model is None or self.state.pool.may_serve(model):
            return
        raise ApiError(404, f"The model `{model}` does not exist.", "model")

    def _asked(self, ex: Exchange, path: str, model: str | None, prompt: str) -> RequestContext:
        """What the scheduler will know of the request, and the headers to
        send upstream."""
        request = ex.request
        raw = client_id(request.headers, *SESSION_HEADERS)
        # it goes upstream and back to the client, and into the engine's own ids
        client_id(request.headers, "X-Request-Id")
        ex.path = path
        ex.ctx = RequestContext(model=model, prompt=prompt.encode("utf-8", "surrogatepass"),
                                session=None if raw is None else session_key(raw))
        ex.headers = forward_headers(request, ex.key_checked)
        return ex.ctx

    # --- generation ----------------------------------------------------------------
    async def _generate(self, ex: Exchange, path: str, model: type[BaseModel],
                        prompt_of: Callable[[dict[str, Any]], str]) -> web.StreamResponse:
        """``prompt_of`` reads the validated document, not the model: dumping
        the messages back to dicts cost as much as validating them."""
        req = await self._json(ex, model)
        self._check_model(req.model)
        ctx = self._asked(ex, path, req.model, prompt_of(ex.doc))
        if model is ChatRequest:
            ctx.chat = ex.doc  # the precise index tokenizes it through the chat template
        return await self.director.generate(ex)

    async def chat(self, ex: Exchange) -> web.StreamResponse:
        return await self._generate(
            ex, "/v1/chat/completions", ChatRequest, lambda d: chat_prompt(d["messages"]))

    async def completions(self, ex: Exchange) -> web.StreamResponse:
        return await self._generate(ex, "/v1/completions", CompletionRequest,
                                    lambda d: completion_prompt(d["prompt"]))

    async def create_response(self, ex: Exchange) -> web.StreamResponse:
        """The router keeps the conversation, so any endpoint can continue a
        chain; the endpoint that served the last turn is still preferred."""
        req = await self._json(ex, ResponsesRequest)
        self._check_model(req.model)
        turn = await begin_turn(self.store, self.cfg.responses, req, ex.doc, ex.tenant)
        ctx = self._asked(ex, RESPONSES_PATH, req.model, turn.prompt)
        ctx.affinity_url = turn.affinity
        ctx.revision = turn.revision  # the chain's revision, while it has ready endpoints
        ex.doc, ex.body = turn.doc, turn.body
        # what the chain brought in is held like a body: the upstream body and the prompt
        self.budget.take(ex.hold, len(ex.body) + len(ctx.prompt), "assembled chain bytes")
        director = self.director
        if director.split is not None and director.split.splits(ex):
            route = await director.split.hand_over(ex)
            if isinstance(route, web.Response):
                return route
        else:
            route = await director.whole(ex)
        ex.route = route

        async def keep(ep: Endpoint, resp: dict[str, Any], text: str) -> None:
            # a split chain's next turn prefers the prefill endpoint: it holds the prefix
            await turn.keep(self.store, ex, route.prefill or ep, ep, resp, text)

        if req.stream:
            return await director.relay(ex, ResponsesTap(
                turn.rid, turn.previous,
                keep_or_fail(keep, self.metrics.responses_unstored.inc),
                director.proxy.max_answer_bytes,
                lambda n: self.budget.adjust(ex.hold, n, "answer bytes")))
        up = await director.proxy.fetch(route.ranked, RESPONSES_PATH, route.body, ex.headers,
                                        route.work, ex.hold)
        if not isinstance(up, Upstream):
            return director.proxy.refusal(up)
        ex.endpoint = up.endpoint
        # an engine's refusal names who refused, as its answers do
        said = {"X-Request-Id": ex.request_id, "X-Toposerve-Endpoint": up.endpoint.name,
                **route.headers}
        if up.status != 200:
            return web.Response(status=up.status, body=up.body, content_type=None,
                                headers={**said, "Content-Type": up.content_type})
        resp = turn.whole(up.body, up.endpoint)
        await keep(up.endpoint, resp, output_text(resp))
        return web.Response(body=orjson.dumps(resp), content_type="application/json",
                            headers=said)

    # --- stored turns ----------------------------------------------------------------
    async def _stored(self, ex: Exchange, route: stored.Route) -> web.StreamResponse:
        body = await route(self.store, ex.request.match_info["id"], ex.tenant, ex.request.query)
        return web.Response(body=body, content_type="application/json")

    async def get_response(self, ex: Exchange) -> web.StreamResponse:
        return await self._stored(ex, stored.retrieve)

    async def delete_response(self, ex: Exchange) -> web.StreamResponse:
        return await self._stored(ex, stored.delete)

    async def input_items(self, ex: Exchange) -> web.StreamResponse:
        return await self._stored(ex, stored.input_items)

    # --- models and probes -------------------------------------------------------------
    def _served(self) -> list[str]:
        return sorted({m for ep in self.state.pool.routable() if ep.healthy for m in ep.models})

    async def models(self, ex: Exchange) -> web.StreamResponse:
        data = [_model(n) for n in self._served()]
        return web.Response(body=orjson.dumps({"object": "list", "data": data}),
                            content_type="application/json")

    async def model(self, ex: Exchange) -> web.StreamResponse:
        name = ex.request.match_info["model"]
        if name not in self._served():
            raise ApiError(404, f"The model `{name}` does not exist.", "model")
        return web.Response(body=orjson.dumps(_model(name)), content_type="application/json")

    async def health(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text="ok")

    async def ready(self, request: web.Request) -> web.StreamResponse:
        """200 with a ready endpoint, while this replica serves under ha
        (the hot-standby leader, or any active-active replica not stopping:
        a load balancer's check, this router can serve a model now). ``?role=any``
        is the pod's readiness probe: whatever the role (a rollout is not
        held up by a standby that is rightly unready), and warm suffices:
        discovery listed the pods and every endpoint found was scraped once,
        healthy or not. A router with no model server is a working router
        (503 "no endpoint" until one comes): an install on an empty cluster
        becomes ready."""
        n = sum(1 for ep in self.state.pool.routable() if ep.healthy)
        pod_probe = request.query.get("role") == "any"
        if self.ha is not None and not self.ha.leader and not pod_probe:
            return web.Response(status=503, text=f"standby; {n} endpoints ready")
        if n or (pod_probe and self.warm()):
            return web.Response(status=200, text=f"{n} endpoints ready")
        return web.Response(status=503, text=f"{n} endpoints ready")

    def warm(self) -> bool:
        """Discovery has listed (``discovered``) and no endpoint awaits its first scrape."""
        return self.discovered() and all(ep.scraped for ep in self.state.pool.routable())

    async def metrics_endpoint(self, request: web.Request) -> web.StreamResponse:
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def unvalidated(model: type[BaseModel], doc: dict[str, Any]) -> Any:
    """``model`` of a document the body worker has validated, built without
    validating it again: that cost the loop what the worker spared it (21
    ms of the 32 ms an at-limit chat of 8,192 messages took to read). Its
    fields are the document's own values, unvalidated lists included
    (messages stay dicts): read lists from the document. Only the model's
    fields are passed (an extra field named ``_fields_set`` would be taken
    for model_construct's own argument)."""
    return model.model_construct(**{k: doc[k] for k in model.model_fields if k in doc})


def session_key(header: str) -> str:
    """A session as the router keeps it: by its hash, so the tables of
    sessions hold 32 characters a session, whatever length of header a
    client sends."""
    return hashlib.blake2b(header.encode("utf-8", "surrogateescape"),
                           digest_size=16).hexdigest()


def _model(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "toposerve"}
