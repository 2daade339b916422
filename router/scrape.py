"""Reading each endpoint's readiness from ``/health``, its load from its
Prometheus ``/metrics`` (vLLM and SGLang names) and its models from
``/v1/models``. A non-200 health answer makes the endpoint unready at
once; a failed scrape leaves the last sample to age into staleness, and
three in a row mark the endpoint unhealthy."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable

import aiohttp
import orjson
import structlog
from prometheus_client.parser import text_string_to_metric_families

from router.endpoints import Endpoint, LoadSample

log = structlog.get_logger("router.scrape")
UNHEALTHY_AFTER = 3

WAITING = {"vllm:num_requests_waiting", "sglang:num_queue_reqs"}
RUNNING = {"vllm:num_requests_running", "sglang:num_running_reqs"}
KV_USAGE = {"vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage"}
CACHE_INFO = "vllm:cache_config_info"


_LOAD = tuple(sorted(WAITING | RUNNING | KV_USAGE))


def parse_load(text: str, cache_info: bool = True) -> tuple[LoadSample, int | None, int | None]:
    """(load, block_size, num_gpu_blocks) from an exposition text. Only the
    lines of the few series we read go to the parser: a real server exposes
    hundreds of histogram lines, and parsing them all dominated the router's
    idle CPU. ``cache_info=False`` skips the cache-config line too (its long
    label set was most of what was left, and it does not change while a
    server runs); block size and count come back None then."""
    waiting = running = 0.0
    usage: list[float] = []
    block_size = num_blocks = None
    prefixes = (*_LOAD, CACHE_INFO) if cache_info else _LOAD
    wanted = "\n".join(x for x in text.splitlines() if x.startswith(prefixes))
    for fam in text_string_to_metric_families(wanted):
        for s in fam.samples:
            if s.name in WAITING:
                waiting += s.value
            elif s.name in RUNNING:
                running += s.value
            elif s.name in KV_USAGE:
                usage.append(s.value)
            elif s.name == CACHE_INFO:
                bs, nb = s.labels.get("block_size"), s.labels.get("num_gpu_blocks")
                block_size = int(bs) if bs and bs.isdigit() else block_size
                num_blocks = int(nb) if nb and nb.isdigit() else num_blocks
    kv = max(usage) if usage else 0.0
    return (LoadSample(waiting=waiting, running=running, kv_usage=kv, at=time.monotonic()),
            block_size, num_blocks)


async def scrape(session: aiohttp.ClientSession, ep: Endpoint, timeout_s: float,
                 health: bool = True) -> None:
    """Load from /metrics; readiness from /health too when ``health`` (or
    while the endpoint is not healthy, so it comes back at once)."""
    try:
        if health or not ep.healthy:
            async with session.get(f"{ep.url}/health",
                                   timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                if r.status != 200:  # the server says it cannot serve: believe it at once
                    if ep.healthy:
                        log.warning("endpoint not ready", endpoint=ep.name, status=r.status)
                    ep.healthy = False
                    return
        async with session.get(f"{ep.url}/metrics",
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                raise aiohttp.ClientResponseError(r.request_info, (), status=r.status)
            text = await r.text()
        # the cache config is re-read with /health: a server may restart reconfigured
        load, bs, nb = parse_load(text, cache_info=health or ep.num_gpu_blocks is None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as err:
        ep.scrape_failures += 1
        if ep.scrape_failures >= UNHEALTHY_AFTER and ep.healthy:
            ep.healthy = False
            log.warning("endpoint unhealthy", endpoint=ep.name, error=repr(err))
        return
    ep.load = load
    ep.block_size, ep.num_gpu_blocks = bs or ep.block_size, nb or ep.num_gpu_blocks
    ep.scrape_failures = 0
    if not ep.models:
        await refresh_models(session, ep, timeout_s)
    if not ep.healthy and ep.models:
        ep.healthy = True
        log.info("endpoint healthy", endpoint=ep.name, models=sorted(ep.models))


async def refresh_models(session: aiohttp.ClientSession, ep: Endpoint, timeout_s: float) -> None:
    try:
        async with session.get(f"{ep.url}/v1/models",
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200:
                return
            doc = orjson.loads(await r.read())
        ep.models = frozenset(str(m["id"]) for m in doc.get("data", []) if "id" in m)
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError, TypeError):
        return


async def scrape_loop(session: aiohttp.ClientSession, endpoints: Iterable[Endpoint],
                      interval_s: float, timeout_s: float, health_interval_s: float) -> None:
    """Scrape every endpoint of ``endpoints`` (re-read each round) forever;
    /health at its own, slower pace (each GET costs the server CPU too)."""
    last_health = 0.0
    while True:
        eps = list(endpoints)
        now = time.monotonic()
        health = now - last_health >= health_interval_s
        if health:
            last_health = now
        if eps:
            await asyncio.gather(*(scrape(session, e, timeout_s, health) for e in eps))
        await asyncio.sleep(interval_s)
