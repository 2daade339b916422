"""Reading each endpoint's readiness from ``/health``, its load from its
Prometheus ``/metrics`` (vLLM and SGLang names) and its models from
``/v1/models``. A non-200 health answer makes the endpoint unready at
once; a failed scrape leaves the last sample to age into staleness, and
three in a row mark the endpoint unhealthy. An answer that cannot be read
(malformed, or over ``MAX_ANSWER_BYTES``) fails the scrape the same way
and is the scrape loop's error for that endpoint alone: logged once a
streak, counted, and that endpoint tried again after a backoff while the
others are scraped as before (``toposerve.router.supervise``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Iterator

import aiohttp
import orjson
import structlog
from prometheus_client.parser import text_string_to_metric_families

from toposerve.router.pool.endpoints import Endpoint, LoadSample
from toposerve.router.supervise import Streak, Streaks, supervise

log = structlog.get_logger("router.pool.scrape")
UNHEALTHY_AFTER = 3
# the most of one /metrics or /v1/models answer read: a real one is a few
# KiB (a server that ignores name[] sends some hundred KiB)
MAX_ANSWER_BYTES = 4 * 2**20

WAITING = {"vllm:num_requests_waiting", "sglang:num_queue_reqs"}
RUNNING = {"vllm:num_requests_running", "sglang:num_running_reqs"}
KV_USAGE = {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"}
CACHE_INFO = "vllm:cache_config_info"
# prometheus_client's process collector (vLLM exposes it): a new value is a
# new process, whose cache is empty
START_TIME = "process_start_time_seconds"
# vLLM and SGLang serve /metrics with prometheus_client, which then renders
# only the series named in name[]: a fraction of the server's CPU and bytes
# (a real vLLM exposes hundreds of lines). A server that ignores the query
# sends everything, which parse_load reads just the same.
_LOAD_QUERY = [("name[]", n) for n in sorted(WAITING | RUNNING | KV_USAGE)]
_LOAD_AND_CACHE_QUERY = [*_LOAD_QUERY, ("name[]", CACHE_INFO), ("name[]", START_TIME)]


def _series(text: str, name: str) -> Iterator[str]:
    """The sample lines of series ``name`` in an exposition text, each
    without the name. str.find skips the hundreds of other lines a real
    server exposes faster than splitting the text or a multi-line regex."""
    start = 0
    while (i := text.find(name, start)) >= 0:
        end = text.find("\n", i)
        start = end = len(text) if end < 0 else end
        rest = text[i + len(name):end]
        # a match inside a line (a comment) or of a longer name is not this series
        if (i == 0 or text[i - 1] == "\n") and rest[:1] in ("{", " ", "\t"):
            yield rest


def _value(rest: str) -> float:
    """A sample's value, after its labels (the line's last "}": braces and
    spaces inside label values do not matter) and before any timestamp."""
    fields = rest[rest.rfind("}") + 1:].split()
    if not fields:
        raise ValueError(f"a sample line without a value: {rest!r}")
    return float(fields[0])


def parse_load(text: str, cache_info: bool = True) -> tuple[LoadSample, int | None, int | None]:
    """(load, block_size, num_gpu_blocks) from an exposition text. The load
    series' values are read directly: the exposition parser costs about
    50 us a line, which made it most of a scrape's CPU (measured). Only the
    cache-config line, whose labels are read, goes to the parser, and only
    with ``cache_info`` (it does not change while a server runs); block size
    and count come back None without it. A malformed value raises ValueError."""
    waiting = sum(_value(r) for n in WAITING for r in _series(text, n))
    running = sum(_value(r) for n in RUNNING for r in _series(text, n))
    usage = [_value(r) for n in KV_USAGE for r in _series(text, n)]
    block_size = num_blocks = None
    for rest in _series(text, CACHE_INFO) if cache_info else ():
        for fam in text_string_to_metric_families(CACHE_INFO + rest):
            for s in fam.samples:
                bs, nb = s.labels.get("block_size"), s.labels.get("num_gpu_blocks")
                block_size = int(bs) if bs and bs.isdigit() else block_size
                num_blocks = int(nb) if nb and nb.isdigit() else num_blocks
    kv = max(usage) if usage else 0.0
    return (LoadSample(waiting=waiting, running=running, kv_usage=kv, at=time.monotonic()),
            block_size, num_blocks)


def started_at(text: str) -> float | None:
    """The server process' start time, None where it does not expose one."""
    for rest in _series(text, START_TIME):
        return _value(rest)
    return None


def restarted(before: float | None, now: float | None, was_out: bool) -> bool:
    """Whether an endpoint answering again is a new process, its cache
    empty: its start time changed; where it tells none, it was out of reach
    (``was_out``) meanwhile, which most often is a restart. The first answer
    is no restart."""
    if before is not None and now is not None:
        return now != before
    return was_out


class BadAnswer(ValueError):
    """An answer of a model server that cannot be read."""


async def _body(r: aiohttp.ClientResponse, path: str) -> bytes:
    """The answer's body, of at most MAX_ANSWER_BYTES."""
    if r.content_length is not None and r.content_length > MAX_ANSWER_BYTES:
        raise BadAnswer(f"{path}: an answer of {r.content_length} bytes, over "
                        f"{MAX_ANSWER_BYTES}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in r.content.iter_any():
        size += len(chunk)
        if size > MAX_ANSWER_BYTES:
            raise BadAnswer(f"{path}: an answer over {MAX_ANSWER_BYTES} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_models(raw: bytes) -> frozenset[str]:
    """The model ids of a /v1/models answer; BadAnswer unless it is
    ``{"data": [{"id": ...}, ...]}``."""
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as err:
        raise BadAnswer(f"/v1/models: not JSON: {err}") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list) or not all(isinstance(m, dict) for m in data):
        raise BadAnswer('/v1/models: not {"data": [{"id": ...}, ...]}')
    return frozenset(str(m["id"]) for m in data if "id" in m)


def _failed(ep: Endpoint, err: Exception) -> None:
    ep.scrape_failures += 1
    if ep.scrape_failures >= UNHEALTHY_AFTER and ep.healthy:
        ep.healthy = False
        log.warning("endpoint unhealthy", endpoint=ep.name, error=repr(err))
    elif ep.scrape_failures == UNHEALTHY_AFTER:  # never up (a wrong URL?): said once a streak
        log.warning("endpoint unreachable", endpoint=ep.name, error=repr(err))


OnRestart = Callable[[Endpoint], None]


async def scrape(session: aiohttp.ClientSession, ep: Endpoint, timeout_s: float,
                 health: bool = True, on_restart: OnRestart | None = None) -> None:
    """Load from /metrics; readiness from /health too when ``health`` (or
    while the endpoint is not healthy, so it comes back at once). An answer
    that cannot be read fails the scrape and is raised, for the scrape
    loop to count. ``on_restart`` hears of an endpoint whose server is a
    new process (``restarted``)."""
    try:
        await _scrape(session, ep, timeout_s, health, on_restart)
    finally:
        ep.scraped = True


async def _scrape(session: aiohttp.ClientSession, ep: Endpoint, timeout_s: float,
                  health: bool, on_restart: OnRestart | None) -> None:
    try:
        if health or not ep.healthy:
            async with session.get(f"{ep.url}/health",
                                   timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                if r.status != 200:  # the server says it cannot serve: believe it at once
                    if ep.healthy:
                        log.warning("endpoint not ready", endpoint=ep.name, status=r.status)
                    ep.healthy = False
                    return
        # the cache config and start time are re-read with /health and when
        # the endpoint comes back: a server may restart reconfigured
        cache_info = health or not ep.healthy or ep.num_gpu_blocks is None
        async with session.get(f"{ep.url}/metrics",
                               params=_LOAD_AND_CACHE_QUERY if cache_info else _LOAD_QUERY,
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                raise aiohttp.ClientResponseError(r.request_info, (), status=r.status)
            # the exposition format is UTF-8; a stray byte spoils no value
            text = (await _body(r, "/metrics")).decode("utf-8", "replace")
        try:
            load, bs, nb = parse_load(text, cache_info=cache_info)
            started = started_at(text) if cache_info else ep.started_at
        except ValueError as err:
            raise BadAnswer(f"/metrics: {err}") from None
    except (aiohttp.ClientError, TimeoutError) as err:
        _failed(ep, err)
        return
    except Exception as err:  # the answer, not the network: the loop counts it too
        _failed(ep, err)
        raise
    ep.load = load
    ep.block_size, ep.num_gpu_blocks = bs or ep.block_size, nb or ep.num_gpu_blocks
    if cache_info:
        # out of reach after it had answered (a first start is no restart)
        was_out = ep.scrape_failures >= UNHEALTHY_AFTER and bool(ep.models)
        if restarted(ep.started_at, started, was_out):
            log.info("endpoint restarted", endpoint=ep.name)
            if on_restart is not None:
                on_restart(ep)
        ep.started_at = started
    ep.scrape_failures = 0
    if not ep.models:
        await refresh_models(session, ep, timeout_s)
    if not ep.healthy and ep.models:
        ep.healthy = True
        log.info("endpoint healthy", endpoint=ep.name, models=sorted(ep.models))


async def refresh_models(session: aiohttp.ClientSession, ep: Endpoint, timeout_s: float) -> None:
    """The endpoint's models; none while the server cannot say (not up, not
    200); BadAnswer for an answer that is not a model list."""
    try:
        async with session.get(f"{ep.url}/v1/models",
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                return
            raw = await _body(r, "/v1/models")
    except (aiohttp.ClientError, TimeoutError):
        return
    ep.models = parse_models(raw)


async def scrape_loop(session: aiohttp.ClientSession, endpoints: Iterable[Endpoint],
                      interval_s: float, timeout_s: float, health_interval_s: float,
                      on_restart: OnRestart | None = None) -> None:
    """Scrape every endpoint of ``endpoints`` (re-read each round) forever;
    /health at its own, slower pace (each GET costs the server CPU too).
    An endpoint whose scrape raised is skipped until its backoff is over."""
    streaks = Streaks("scrape", "endpoint")

    async def one(ep: Endpoint, health: bool) -> None:
        if streaks.backing_off(ep.name):
            return
        try:
            await scrape(session, ep, timeout_s, health, on_restart)
        except Exception as err:
            streaks.failed(ep.name, err)
        else:
            streaks.ok(ep.name)

    async def rounds() -> None:
        last_health = 0.0
        while True:
            eps = list(endpoints)
            now = time.monotonic()
            health = now - last_health >= health_interval_s
            if health:
                last_health = now
            streaks.keep(e.name for e in eps)
            if eps:
                await asyncio.gather(*(one(e, health) for e in eps))
            await asyncio.sleep(interval_s)

    await supervise(Streak("scrape"), rounds)
