"""A model server that speaks vLLM's HTTP surface (or SGLang's metric
dialect): OpenAI completions, chat completions and Responses, /v1/models,
/health, /metrics, KV events over ZMQ and ``kv_transfer_params`` for
prefill/decode disaggregation. The text it generates is filler; the timing
follows ``engine``."""

from __future__ import annotations

import asyncio
import os
import random
import socket
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson
from aiohttp import web
from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator

from toposerve.serving.http import bind, run_app
from toposerve.simulator.bootstrap import ROUTE, Rooms, pull
from toposerve.simulator.config import DisaggregationMode, SimConfig
from toposerve.simulator.engine import Engine, Job
from toposerve.simulator.kv_publisher import BindError, KVEventPublisher
from toposerve.simulator.kvcache import BlockCache
from toposerve.simulator.metrics import SimMetrics
from toposerve.simulator.responses_stream import ResponseEvents
from toposerve.topology.distance import node_tier
from toposerve.topology.model import DomainPath
from toposerve.wire.chat_template import chat_text, load_chat_template
from toposerve.wire.errors import ApiError, error_response, from_validation
from toposerve.wire.kv_events import BlockStored, encode_cleared, encode_removed, encode_stored
from toposerve.wire.kv_transfer import REMOTE_PREFILL_FIELDS, SGLANG_BOOTSTRAP_PORT
from toposerve.wire.openai import (
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    ResponsesRequest,
    TokenizeRequest,
)
from toposerve.wire.prompt import completion_prompt, responses_items
from toposerve.wire.tokens import load_tokenizer

WORDS = (" the", " kv ", " and", " for", " GPU", " one", " two", " ten")
MAX_STORED_RESPONSES = 10_000
# The simulator's own addition to a prefill's kv_transfer_params: where it
# ran, so the decode server can price the pull by topology tier. A real
# NixlConnector learns its peer from the NIXL agent's metadata instead.
PLACE_FIELD = "toposerve_place"


class Sampling(BaseModel):
    """The sampling settings vLLM type-checks on every generation API (a
    string for a number is a 400), with its defaults, which Responses echo."""

    model_config = ConfigDict(extra="ignore")

    temperature: float = 1.0
    top_p: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0

    @field_validator("*", mode="before")
    @classmethod
    def _default_for_null(cls, v: Any, info: ValidationInfo) -> Any:
        return cls.model_fields[str(info.field_name)].default if v is None else v


def filler(n: int, offset: int = 0) -> str:
    return "".join(WORDS[(offset + i) % len(WORDS)] for i in range(n))


class SimServer:
    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.tokenizer = load_tokenizer(cfg.tokenizer)
        # the model's chat template beside tokenizer.json, as vLLM renders chat
        self.chat_template = load_chat_template(cfg.tokenizer)
        self.publisher: KVEventPublisher | None = None
        self.cache = BlockCache(cfg.num_gpu_blocks, cfg.block_size,
                                on_stored=self._stored, on_removed=self._removed)
        self.engine = Engine(cfg, self.cache)
        self.metrics = SimMetrics(cfg, self.engine)
        self.started = time.monotonic()
        self.requests = 0
        self.rng = random.Random(cfg.seed)
        self.responses: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.engine_id = cfg.engine_id or f"sim-{uuid.uuid4().hex[:8]}"
        mode = cfg.disaggregation_mode
        self.rooms = (Rooms(cfg.disaggregation_bootstrap_timeout_s, cfg.path)
                      if mode == DisaggregationMode.PREFILL else None)
        self.client: aiohttp.ClientSession | None = None  # decode mode: pulls KV
        self.bootstrap: socket.socket | None = None  # prefill mode: the rooms' port, bound

    # --- KV events -------------------------------------------------------
    def _stored(self, s: BlockStored) -> None:
        if self.publisher:
            self.publisher.add(encode_stored(s, self.publisher.encoding))

    def _removed(self, hashes: list[int]) -> None:
        if self.publisher:
            self.publisher.add(encode_removed(hashes, self.publisher.encoding))

    def bind(self) -> None:
        """Bind what is served besides HTTP, the KV-event sockets and the
        SGLang bootstrap port, now: a taken one fails before anything
        serves, with a BindError naming its field."""
        c = self.cfg
        if c.kv_events_port is not None:
            replay = (f"tcp://{c.host}:{c.kv_events_replay_port}"
                      if c.kv_events_replay_port is not None else None)
            try:
                self.publisher = KVEventPublisher(
                    f"tcp://{c.host}:{c.kv_events_port}", replay, topic=c.kv_events_topic,
                    encoding=c.kv_events_encoding)
            except BindError as err:
                field = "kv_events_replay_port" if err.address == replay else "kv_events_port"
                raise BindError(err.address, err.reason, field) from None
        if self.rooms is not None:
            try:
                self.bootstrap = bind(c.host, c.disaggregation_bootstrap_port)
            except OSError as err:  # the bare reason: create_server adds the address to it
                why = str(err.strerror or err).split(" (while attempting", 1)[0]
                raise BindError(f"{c.host}:{c.disaggregation_bootstrap_port}", why,
                                "disaggregation_bootstrap_port") from None

    async def start_events(self) -> None:
        if self.publisher is not None:
            self.publisher.start()
            self.engine.after_store = self.publisher.flush

    # --- helpers ---------------------------------------------------------
    def ready(self) -> bool:
        return time.monotonic() - self.started >= self.cfg.slow_start_s

    async def _body(self, request: web.Request, schema: type[BaseModel]) -> dict[str, Any]:
        """The JSON body, checked against the same request models vLLM's
        OpenAI server validates with (a mistake is a 400, never a 500)."""
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as err:
            raise ApiError(400, f"Invalid JSON body: {err}") from None
        if not isinstance(body, dict):
            raise ApiError(400, "Request body must be a JSON object")
        try:
            schema.model_validate(body)
            Sampling.model_validate(body)
        except ValidationError as err:
            raise from_validation(err) from None
        model = body.get("model")
        if model is not None and model not in self.cfg.names:
            raise ApiError(404, f"The model `{model}` does not exist.", "model")
        return body

    def _max_tokens(self, body: dict[str, Any], *keys: str) -> int:
        """The first of ``keys`` given (validated already), else vLLM's default 16."""
        return next((int(body[k]) for k in keys if body.get(k) is not None), 16)

    async def _faults(self, request: web.Request) -> web.StreamResponse | None:
        self.requests += 1
        if self.cfg.crash_after and self.requests >= self.cfg.crash_after:
            os._exit(3)  # a crash, not a shutdown: no response, connections reset
        if not self.ready():
            return error_response(503, "server is starting")
        if self.cfg.error_rate and self.rng.random() < self.cfg.error_rate:
            return error_response(500, "injected error")
        if self.cfg.hang_rate and self.rng.random() < self.cfg.hang_rate:
            await asyncio.Event().wait()  # until the client goes away
        return None

    def _job(self, prompt: str, max_tokens: int, skip_prefill: bool = False,
             source: DomainPath | None = None) -> Job:
        """A generation job, refused as vLLM refuses one that overflows the
        context; ``source`` is where a remote prefill left its KV."""
        tokens = self.tokenizer.encode(prompt)
        if len(tokens) > self.cfg.max_model_len:  # vLLM names the prompt, not max_tokens
            raise ApiError(400, f"This model's maximum context length is "
                                f"{self.cfg.max_model_len} tokens. However, your prompt "
                                f"contains {len(tokens)} input tokens, which exceeds this "
                                f"limit even without any output tokens. Please reduce the "
                                f"length of the input prompt.", "input_tokens")
        if len(tokens) + max_tokens > self.cfg.max_model_len:
            raise ApiError(400, f"This model's maximum context length is "
                                f"{self.cfg.max_model_len} tokens. However, you requested "
                                f"{len(tokens) + max_tokens} tokens ({len(tokens)} in the "
                                f"messages, {max_tokens} in the completion).", "max_tokens")
        job = Job(tokens=tokens, max_tokens=max_tokens, skip_prefill=skip_prefill)
        place = self.cfg.path
        if skip_prefill and source is not None and place is not None and source != place:
            job.pull_tier = node_tier(source, place)
        return job

    def _kv_params(self, body: dict[str, Any]) -> tuple[bool, bool, DomainPath | None]:
        """(hand the KV on, take it from a remote prefill, where that prefill ran)."""
        p = body.get("kv_transfer_params") or {}
        remote_prefill = bool(p.get("do_remote_prefill"))
        missing = [k for k in REMOTE_PREFILL_FIELDS if p.get(k) is None]
        if remote_prefill and missing:
            # a real engine would have no KV to pull: refuse rather than pretend
            raise ApiError(400, "kv_transfer_params with do_remote_prefill needs "
                                f"{', '.join(missing)} (copy them from the prefill's answer)",
                           "kv_transfer_params")
        source = None
        if remote_prefill and p.get(PLACE_FIELD) is not None:
            try:
                source = DomainPath.model_validate(p[PLACE_FIELD])
            except ValidationError:
                raise ApiError(400, f"kv_transfer_params.{PLACE_FIELD} must be an object with "
                                    "host and optionally zone, block, rack, nvlink (strings)",
                               "kv_transfer_params") from None
        return bool(p.get("do_remote_decode")), remote_prefill, source

    async def _bootstrap(self, body: dict[str, Any]) -> tuple[int | None, DomainPath | None]:
        """SGLang's hand-over: a prefill server notes the request's room; a
        decode server first waits for that room's KV at its prefill server.
        (The room, and for a decode server where its prefill server runs.)"""
        if self.cfg.disaggregation_mode == DisaggregationMode.NULL:
            return None, None
        room, host = body.get("bootstrap_room"), body.get("bootstrap_host")
        if room is None:
            return None, None
        if not isinstance(room, int) or isinstance(room, bool):
            raise ApiError(400, "bootstrap_room must be an integer", "bootstrap_room")
        if self.rooms is not None:
            return room, None
        port = body.get("bootstrap_port") or SGLANG_BOOTSTRAP_PORT
        if not isinstance(host, str) or not isinstance(port, int):
            raise ApiError(400, "a decode request needs bootstrap_host (string) and "
                                "bootstrap_port (integer) of its prefill server",
                           "bootstrap_host")
        if self.client is None:
            self.client = aiohttp.ClientSession()
        got = await pull(self.client, host, port, room,
                         self.cfg.disaggregation_bootstrap_timeout_s)
        if isinstance(got, str):
            raise ApiError(500, f"KV transfer for room {room} failed: {got}")
        return room, got

    def _kv_response(self, job: Job, rid: str) -> dict[str, Any]:
        """What vLLM v0.33's NixlConnector answers a prefill with (block ids
        per KV-cache group; tests/wire/fixtures/kv_transfer.json)."""
        n_blocks = -(-len(job.tokens) // self.cfg.block_size)
        out = {"do_remote_prefill": True, "do_remote_decode": False,
               "remote_block_ids": [list(range(n_blocks))], "remote_engine_id": self.engine_id,
               "remote_request_id": rid, "remote_host": self.cfg.host,
               "remote_port": self.cfg.port, "tp_size": 1, "dcp_size": 1, "pp_size": 1,
               "remote_num_tokens": len(job.tokens)}
        if (place := self.cfg.path) is not None:
            out[PLACE_FIELD] = place.model_dump()
        return out

    def _record(self, job: Job) -> None:
        m = self.metrics
        m.prefix_queries.inc(len(job.tokens))
        m.prefix_hits.inc(job.cached_tokens)
        m.prompt_tokens.inc(len(job.tokens))
        m.ttft.observe(job.ttft)
        if job.pull_bytes and job.pull_tier is not None:
            m.kv_pulls.labels(job.pull_tier.name.lower()).inc()
        if job.pull_bytes:
            m.kv_pull_seconds.observe(job.pull_s * self.cfg.time_scale)
            m.kv_pull_bytes.observe(job.pull_bytes)

    async def _steps(self, job: Job) -> AsyncIterator[int]:
        """The engine's steps (new tokens each), recording the prefill's
        metrics when the first token is out."""
        first = True
        async for n in self.engine.generate(job):
            if first:
                self._record(job)
                if self.rooms is not None and job.bootstrap_room is not None:
                    self.rooms.ready(job.bootstrap_room)
                first = False
            yield n

    async def _generate_all(self, job: Job) -> int:
        """Run a job to its end (no streaming); returns the tokens produced."""
        produced = 0
        async for n in self._steps(job):
            produced += n
        self._finished(produced)
        return produced

    def _finished(self, produced: int) -> None:
        self.metrics.generation_tokens.inc(produced)
        self.metrics.success.inc()

    def _usage(self, job: Job, produced: int) -> dict[str, Any]:
        return {"prompt_tokens": len(job.tokens), "completion_tokens": produced,
                "total_tokens": len(job.tokens) + produced,
                "prompt_tokens_details": {"cached_tokens": job.cached_tokens}}

    # --- generation --------------------------------------------------------
    async def _run(self, request: web.Request, body: dict[str, Any], prompt: str,
                   max_tokens: int, kind: str) -> web.StreamResponse:
        remote_decode, remote_prefill, source = self._kv_params(body)
        room, prefill_place = await self._bootstrap(body)
        source = source or prefill_place
        if remote_decode or (self.rooms is not None and room is not None):
            max_tokens = 1  # a prefill endpoint makes the KV and one token
        remote_prefill = remote_prefill or (room is not None and self.rooms is None)
        job = self._job(prompt, max_tokens, remote_prefill, source)
        job.bootstrap_room = room
        model = body.get("model") or self.cfg.names[0]
        # vLLM takes the request id from X-Request-Id when given
        rid = (f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-"
               f"{request.headers.get('X-Request-Id') or uuid.uuid4().hex}")
        created = int(time.time())
        extra = {"kv_transfer_params": self._kv_response(job, rid)} if remote_decode else {}
        if body.get("stream"):
            return await self._stream(request, job, kind, rid, model, created, body, extra)
        produced = await self._generate_all(job)
        if self.cfg.midstream_failure_rate and self.rng.random() < self.cfg.midstream_failure_rate:
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)
        text = filler(produced)
        if kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text,
                                              "tool_calls": [], "reasoning_content": None},
                      "logprobs": None, "finish_reason": "length", "stop_reason": None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length",
                      "stop_reason": None, "prompt_logprobs": None}
            obj = "text_completion"
        return web.json_response({"id": rid, "object": obj, "created": created, "model": model,
                                  "choices": [choice], "usage": self._usage(job, produced),
                                  **extra}, dumps=lambda o: orjson.dumps(o).decode())

    async def _stream(self, request: web.Request, job: Job, kind: str, rid: str, model: str,
                      created: int, body: dict[str, Any], extra: dict[str, Any]
                      ) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "Cache-Control": "no-cache"})
        await resp.prepare(request)
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        usage_wanted = bool((body.get("stream_options") or {}).get("include_usage"))

        def event(data: dict[str, Any]) -> bytes:
            return b"data: " + orjson.dumps({"id": rid, "object": obj, "created": created,
                                             "model": model, **data}) + b"\n\n"

        def token(text: str, last: bool) -> bytes:
            # as vLLM v0.33: finish_reason (with the chunk's kv_transfer_params)
            # rides on the last token's chunk, not on a chunk of its own
            reason = "length" if last else None
            choice: dict[str, Any] = (
                {"index": 0, "delta": {"content": text}, "logprobs": None,
                 "finish_reason": reason, **({"stop_reason": None} if last else {})}
                if kind == "chat" else
                {"index": 0, "text": text, "logprobs": None, "finish_reason": reason,
                 "stop_reason": None})
            return event({"choices": [choice],
                          **({"kv_transfer_params": extra.get("kv_transfer_params")}
                             if last else {})})

        produced = 0
        fail_mid = (self.cfg.midstream_failure_rate
                    and self.rng.random() < self.cfg.midstream_failure_rate)
        async for n in self._steps(job):
            if produced == 0 and kind == "chat":  # chat alone opens with the role
                await resp.write(event({"choices": [{
                    "index": 0, "delta": {"role": "assistant", "content": ""},
                    "logprobs": None, "finish_reason": None}]}))
            text = filler(n, produced)
            produced += n
            last = produced >= job.max_tokens
            await resp.write(b"".join(token(text[i * 4:(i + 1) * 4], last and i == n - 1)
                                      for i in range(n)))
            if fail_mid:
                assert request.transport is not None
                request.transport.close()
                return resp
            if last:
                break
        self._finished(produced)
        if usage_wanted:
            await resp.write(event({"choices": [], "usage": self._usage(job, produced)}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    # --- handlers ----------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        if (fault := await self._faults(request)) is not None:
            return fault
        body = await self._body(request, CompletionRequest)
        return await self._run(request, body, completion_prompt(body["prompt"]),
                               self._max_tokens(body, "max_tokens"), "completion")

    async def chat(self, request: web.Request) -> web.StreamResponse:
        if (fault := await self._faults(request)) is not None:
            return fault
        body = await self._body(request, ChatRequest)
        return await self._run(request, body, chat_text(self.chat_template, body)[0],
                               self._max_tokens(body, "max_completion_tokens", "max_tokens"),
                               "chat")

    async def create_response(self, request: web.Request) -> web.StreamResponse:
        if (fault := await self._faults(request)) is not None:
            return fault
        body = await self._body(request, ResponsesRequest)
        history: list[dict[str, Any]] = []
        prev = body.get("previous_response_id")
        if prev is not None:
            stored = self.responses.get(prev)
            if stored is None:
                raise ApiError(404, f"Response with id '{prev}' not found.",
                                 "previous_response_id")
            history = stored["conversation"]
        instructions = body.get("instructions")
        conversation = history + responses_items(body["input"])
        msgs = ([{"role": "system", "content": instructions}] if instructions else []) + \
            conversation
        # vLLM takes kv_transfer_params on /v1/responses too (since 2026-03)
        remote_decode, remote_prefill, source = self._kv_params(body)
        # through the model's chat template, as vLLM renders Responses input
        max_tokens = 1 if remote_decode else self._max_tokens(body, "max_output_tokens")
        job = self._job(chat_text(self.chat_template, {"messages": msgs})[0], max_tokens,
                        remote_prefill, source)
        rid, item_id = f"resp_{uuid.uuid4().hex}", f"msg_{uuid.uuid4().hex}"
        resp: dict[str, Any] = {
            "id": rid, "object": "response", "created_at": int(time.time()),
            "model": body.get("model") or self.cfg.names[0], "status": "completed",
            "output": [], "previous_response_id": prev, "instructions": instructions,
            "parallel_tool_calls": True, "tools": [], "usage": None,
            # the request's settings as vLLM echoes them (its defaults when not given)
            "background": False, "max_output_tokens": max_tokens,
            "service_tier": body.get("service_tier") or "auto",
            **Sampling.model_validate(body).model_dump(),
            "tool_choice": body.get("tool_choice") or "auto",
            "truncation": body.get("truncation") or "disabled"}
        if remote_decode:
            resp["kv_transfer_params"] = self._kv_response(job, rid)

        def complete(produced: int) -> dict[str, Any]:
            text = filler(produced)
            resp["output"] = [{"type": "message", "id": item_id, "status": "completed",
                               "role": "assistant", "content": [
                                   {"type": "output_text", "text": text, "annotations": []}]}]
            resp["usage"] = {"input_tokens": len(job.tokens), "output_tokens": produced,
                             "total_tokens": len(job.tokens) + produced,
                             # vLLM 0.32's details, for one turn without tools
                             "input_tokens_details": {
                                 "cached_tokens": job.cached_tokens, "cache_write_tokens": 0,
                                 "cached_tokens_per_turn": [], "input_tokens_per_turn": []},
                             "output_tokens_details": {
                                 "reasoning_tokens": 0, "tool_output_tokens": 0,
                                 "output_tokens_per_turn": [],
                                 "tool_output_tokens_per_turn": []}}
            if body.get("store", True):
                self.responses[rid] = {"response": resp, "conversation": [
                    *conversation, {"role": "assistant", "content": text}]}
                while len(self.responses) > MAX_STORED_RESPONSES:
                    self.responses.popitem(last=False)
            return resp

        if not body.get("stream"):
            return web.json_response(complete(await self._generate_all(job)),
                                     dumps=lambda o: orjson.dumps(o).decode())
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                          "Cache-Control": "no-cache"})
        await out.prepare(request)
        events = ResponseEvents(resp, item_id)
        await out.write(events.opening())
        produced = 0
        async for n in self._steps(job):
            await out.write(events.delta(filler(n, produced)))
            produced += n
        self._finished(produced)
        await out.write(events.closing(complete(produced)))
        await out.write_eof()
        return out

    async def get_response(self, request: web.Request) -> web.StreamResponse:
        rid = request.match_info["id"]
        stored = self.responses.get(rid)
        if stored is None:
            return error_response(404, f"Response with id '{rid}' not found.")
        return web.json_response(stored["response"], dumps=lambda o: orjson.dumps(o).decode())

    async def models(self, request: web.Request) -> web.Response:
        created = int(time.time())
        data: list[dict[str, Any]] = [
            {"id": n, "object": "model", "created": created, "owned_by": "vllm",
             "root": self.cfg.model, "parent": None, "max_model_len": self.cfg.max_model_len,
             "permission": [self._permission(created)]} for n in self.cfg.names]
        return web.json_response({"object": "list", "data": data})

    @staticmethod
    def _permission(created: int) -> dict[str, Any]:
        """vLLM's one permission object per model (OpenAI's legacy shape)."""
        return {"id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission",
                "created": created, "allow_create_engine": False, "allow_sampling": True,
                "allow_logprobs": True, "allow_search_indices": False, "allow_view": True,
                "allow_fine_tuning": False, "organization": "*", "group": None,
                "is_blocking": False}

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize: the token ids a generation request with this
        prompt (or these messages, through the same chat template) is
        prefilled and cached with, so routers can key KV events by them."""
        body = await self._body(request, TokenizeRequest)
        text = (chat_text(self.chat_template, body)[0] if body.get("messages") is not None
                else body["prompt"])
        tokens = self.tokenizer.encode(text)
        return web.json_response({"count": len(tokens), "max_model_len": self.cfg.max_model_len,
                                  "tokens": tokens, "token_strs": None})

    async def detokenize(self, request: web.Request) -> web.Response:
        body = await self._body(request, DetokenizeRequest)
        try:
            return web.json_response({"prompt": self.tokenizer.decode(body["tokens"])})
        except ValueError as err:
            raise ApiError(400, str(err), "tokens") from None

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.ready() else 503)

    async def reset_prefix_cache(self, request: web.Request) -> web.Response:
        """vLLM's (its dev mode): the cache emptied and AllBlocksCleared
        published, refused (success false) while a request holds blocks."""
        if self.engine.stats.running:
            return web.json_response({"success": False})
        self.cache.clear()
        if self.publisher:
            self.publisher.add(encode_cleared(self.publisher.encoding))
        return web.json_response({"success": True})

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        body, headers = self.metrics.render(request.query.getall("name[]", []),
                                            request.headers.get("Accept", ""),
                                            request.headers.get("Accept-Encoding", ""))
        return web.Response(body=body, headers=headers)


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    try:
        return await handler(request)  # type: ignore[no-any-return]
    except ApiError as err:
        return error_response(err.status, err.message, err.param)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        # an unknown path or method: FastAPI's default body, as vLLM and SGLang answer
        return web.json_response({"detail": err.reason}, status=err.status)


def build_app(cfg: SimConfig) -> web.Application:
    """The app, with its KV-event sockets and bootstrap port bound (BindError)."""
    sim = SimServer(cfg)
    sim.bind()
    app = web.Application(middlewares=[_errors], client_max_size=cfg.max_body_bytes)
    app.router.add_post("/v1/completions", sim.completions)
    app.router.add_post("/v1/chat/completions", sim.chat)
    app.router.add_post("/v1/responses", sim.create_response)
    app.router.add_get("/v1/responses/{id}", sim.get_response)
    app.router.add_get("/v1/models", sim.models)
    app.router.add_post("/tokenize", sim.tokenize)
    app.router.add_post("/detokenize", sim.detokenize)
    app.router.add_get("/health", sim.health)
    app.router.add_post("/reset_prefix_cache", sim.reset_prefix_cache)
    app.router.add_get("/metrics", sim.metrics_endpoint)

    bootstrap: list[web.AppRunner] = []

    async def on_startup(app: web.Application) -> None:
        await sim.start_events()
        # SGLang prefill mode serves its rooms on the bootstrap port
        if sim.rooms is not None and sim.bootstrap is not None:
            rooms = web.Application()
            rooms.router.add_get(ROUTE, sim.rooms.handle)
            runner = web.AppRunner(rooms, access_log=None)
            await runner.setup()
            await web.SockSite(runner, sim.bootstrap).start()
            bootstrap.append(runner)

    async def on_cleanup(app: web.Application) -> None:
        if sim.publisher:
            await sim.publisher.close()
        if sim.client is not None:
            await sim.client.close()
        for runner in bootstrap:
            await runner.cleanup()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


def serve(cfg: SimConfig, sock: socket.socket | None = None,
          app: web.Application | None = None) -> None:
    """Serve ``app`` (built from ``cfg`` when not given) until stopped, on
    ``sock`` when given (bound already, so that a taken address fails before
    the server starts), else on the configured address."""
    import uvloop

    uvloop.install()
    where: dict[str, Any] = {"sock": sock} if sock else {"host": cfg.host, "port": cfg.port}
    # handler_cancellation: a client that disconnects aborts its request,
    # streamed or not, as vLLM's with_cancellation handlers do
    run_app(app or build_app(cfg), error_factory=error_response, **where, access_log=None,
            handler_cancellation=True)
