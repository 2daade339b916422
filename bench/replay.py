"""Sending a workload through one router and measuring what clients see:
time to first token from the first streamed chunk, end-to-end time, and
which answers failed."""

from __future__ import annotations

import asyncio
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from bench.workloads import AgentSession, TraceRequest, text_tokens

MODEL = "toposerve/sim-model"
ERROR_CHARS = 300


@dataclass
class Result:
    ttft: float | None
    e2e: float
    status: int
    prompt: bytes
    text: str = ""
    started: float = 0.0
    completion_tokens: int = 0  # from the stream's usage chunk
    prompt_tokens: int = 0
    cached_tokens: int = 0  # the engine's prompt_tokens_details.cached_tokens
    error: str = ""  # a failed answer's body or SSE error event, its first ERROR_CHARS


@dataclass
class Run:
    results: list[Result] = field(default_factory=list)
    wall_s: float = 0.0

    @property
    def ok(self) -> list[Result]:
        return [r for r in self.results if r.status == 200 and r.ttft is not None]

    def errors(self) -> dict[str, int]:
        """The answers that are not ok, counted by status and error text."""
        out: dict[str, int] = {}
        for r in self.results:
            if r.status != 200 or r.ttft is None:
                key = f"{r.status} {r.error}".strip()
                out[key] = out.get(key, 0) + 1
        return out


async def _stream(session: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any],
                  prompt: bytes, timeout_s: float) -> Result:
    t0 = time.monotonic()
    ttft = None
    text: list[str] = []
    r0 = Result(None, 0.0, 0, prompt, started=t0)
    try:
        async with _post(session, url + path, orjson.dumps(body), timeout_s) as r:
            if r.status != 200:
                r0.error = (await r.content.read(ERROR_CHARS)).decode(errors="replace")
                return _done(r0, r.status)
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = orjson.loads(line[6:])
                if "error" in chunk:
                    r0.error = str(chunk["error"])[:ERROR_CHARS]
                    return _done(r0, 599)
                if usage := chunk.get("usage"):
                    r0.completion_tokens = int(usage.get("completion_tokens") or 0)
                    r0.prompt_tokens = int(usage.get("prompt_tokens") or 0)
                    details = usage.get("prompt_tokens_details") or {}
                    r0.cached_tokens = int(details.get("cached_tokens") or 0)
                for ch in chunk.get("choices", []):
                    piece = ch.get("text") or (ch.get("delta") or {}).get("content") or ""
                    if piece:
                        if ttft is None:
                            ttft = time.monotonic() - t0
                        text.append(piece)
    except (aiohttp.ClientError, TimeoutError):
        return _done(r0, 598)
    r0.ttft, r0.text = ttft, "".join(text)
    return _done(r0, 200)


def _done(r: Result, status: int) -> Result:
    r.status, r.e2e = status, time.monotonic() - r.started
    return r


class _post:
    """POST that reconnects once when a kept-alive connection was closed by
    the server in the meantime (as HTTP clients do), so a router that closes
    idle connections is not charged with failures it did not cause."""

    def __init__(self, session: aiohttp.ClientSession, url: str, data: bytes,
                 timeout_s: float = 120) -> None:
        self.args = (session, url, data, timeout_s)
        self.resp: aiohttp.ClientResponse | None = None

    async def __aenter__(self) -> aiohttp.ClientResponse:
        session, url, data, timeout_s = self.args
        for attempt in (0, 1):
            try:
                self.resp = await session.post(
                    url, data=data, headers={"Content-Type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=timeout_s))
                return self.resp
            except (aiohttp.ClientOSError, aiohttp.ServerDisconnectedError):
                if attempt:
                    raise
        raise AssertionError("unreachable")

    async def __aexit__(self, *exc: object) -> None:
        if self.resp is not None:
            self.resp.release()


def _messages_prompt(msgs: list[dict[str, str]]) -> bytes:
    from toposerve.wire.prompt import chat_prompt

    return chat_prompt(msgs).encode()


@dataclass
class Target:
    """Where a replay sends its requests: the router's URL, the model
    named, and fields every body adds (a real engine's ``ignore_eos``)."""

    url: str
    model: str = MODEL
    extra: dict[str, Any] = field(default_factory=dict)

    def body(self, **fields: Any) -> dict[str, Any]:
        return {"model": self.model, **fields, "stream": True,
                "stream_options": {"include_usage": True}, **self.extra}


async def _agent(session: aiohttp.ClientSession, to: Target, s: AgentSession,
                 time_scale: float, run: Run, timeout_s: float) -> None:
    await asyncio.sleep(s.start_s * time_scale)
    msgs = [{"role": "system", "content": s.system}]
    for n, turn in enumerate(s.turns):
        if n:
            await asyncio.sleep(turn.think_s * time_scale)
        msgs.append({"role": "user",
                     "content": text_tokens(turn.user_tokens, f"user-{s.sid}-{n}")})
        body = to.body(messages=msgs, max_tokens=turn.max_tokens)
        subs = [_subagent(session, to, msgs, s.sid, n, k, sizes, time_scale, run, timeout_s)
                for k, sizes in enumerate(turn.subagents)]
        main, *_ = await asyncio.gather(
            _stream(session, to.url, "/v1/chat/completions", body, _messages_prompt(msgs),
                    timeout_s), *subs)
        assert isinstance(main, Result)
        run.results.append(main)
        msgs = [*msgs, {"role": "assistant", "content": main.text}]


async def _subagent(session: aiohttp.ClientSession, to: Target, parent: list[dict[str, str]],
                    sid: int, turn: int, k: int, sizes: list[int], time_scale: float, run: Run,
                    timeout_s: float) -> Result | None:
    # a sub-agent starts from its parent's system prompt and first task
    msgs = [dict(m) for m in parent[:2]]
    for j, size in enumerate(sizes):
        msgs.append({"role": "user", "content": text_tokens(size, f"sub-{sid}-{turn}-{k}-{j}")})
        body = to.body(messages=msgs, max_tokens=8)
        r = await _stream(session, to.url, "/v1/chat/completions", body,
                          _messages_prompt(msgs), timeout_s)
        run.results.append(r)
        msgs.append({"role": "assistant", "content": r.text})
        await asyncio.sleep(0.5 * time_scale)
    return None


async def replay_agentic(to: str | Target, sessions: list[AgentSession], time_scale: float,
                         timeout_s: float = 120) -> Run:
    """The sessions through ``to`` (a URL: the simulators' model)."""
    target = Target(to) if isinstance(to, str) else to
    run = Run()
    t0 = time.monotonic()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(_agent(session, target, s, time_scale, run, timeout_s)
                               for s in sessions))
    run.wall_s = time.monotonic() - t0
    return run


async def replay_trace(url: str, reqs: list[TraceRequest], time_scale: float,
                       timeout_s: float = 120) -> Run:
    run = Run()
    t0 = time.monotonic()

    async def one(session: aiohttp.ClientSession, r: TraceRequest) -> None:
        delay = r.at_s * time_scale - (time.monotonic() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        body = {"model": MODEL, "prompt": r.prompt, "max_tokens": r.max_tokens, "stream": True,
                "stream_options": {"include_usage": True}}
        run.results.append(await _stream(session, url, "/v1/completions", body,
                                         r.prompt.encode(), timeout_s))

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(one(session, r) for r in reqs))
    run.wall_s = time.monotonic() - t0
    return run


async def direct_latency(url: str, n: int, stream: bool = False) -> list[float]:
    """Sequential tiny requests on one kept-alive connection, as an SDK client
    in a loop sends them: the floor a router adds to. Non-streamed, the time
    to the whole answer; streamed, to the first token (of four, so the answer
    arrives in several writes, as a real stream does)."""
    out = []
    async with aiohttp.ClientSession() as session:
        for i in range(n):
            body = {"model": MODEL, "prompt": f"ping {i}", "max_tokens": 4 if stream else 1,
                    "stream": stream}
            t0 = time.monotonic()
            first = None
            async with _post(session, url + "/v1/completions", orjson.dumps(body)) as r:
                async for _ in r.content.iter_any():
                    first = first or time.monotonic() - t0
            out.append(first if stream and first is not None else time.monotonic() - t0)
    return out


def added_latency(direct_url: str, urls: dict[str, str], n: int, rounds: int = 3,
                  stream: bool = False) -> dict[str, float]:
    """Seconds each of ``urls`` adds to a direct call to ``direct_url`` (the
    median of per-round p50s). The rounds interleave (direct, each URL,
    again), so the machine's noise falls on all of them alike."""
    p50s: dict[str, list[float]] = {k: [] for k in ["", *urls]}
    for _ in range(rounds):
        for name, url in [("", direct_url), *urls.items()]:
            p50s[name].append(statistics.median(asyncio.run(direct_latency(url, n, stream))))
    direct = statistics.median(p50s.pop(""))
    return {name: statistics.median(v) - direct for name, v in p50s.items()}


async def big_prompts(url: str, n: int, tokens: int) -> int:
    """``n`` requests with a ``tokens``-token chat prompt; returns how many succeeded."""
    ok = 0
    system = text_tokens(tokens, "big-system")  # made once: the client must not be the bottleneck
    bodies = [orjson.dumps({"model": MODEL, "max_tokens": 1, "messages": [
        {"role": "system", "content": system}, {"role": "user", "content": f"question {i}"}]})
        for i in range(n)]
    async with aiohttp.ClientSession() as session:
        for body in bodies:
            async with _post(session, url + "/v1/chat/completions", body) as r:
                await r.read()
                ok += r.status == 200
    return ok
