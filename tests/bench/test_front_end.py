"""bench.front_end, the HTTP front ends bench.router_overhead runs alone:
each answers the benchmark's request as the closed-loop client counts it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from bench.router_overhead import (
    FLEET_CONCURRENCY,
    FRONT_AIOHTTP,
    bodies,
    fleet_table,
    front_end,
    load,
)
from harness.procs import Procs
from tests.bench.test_router_overhead import _row


@pytest.mark.parametrize("stack", ["aiohttp", "httptools"])
def test_a_front_end_alone_answers_the_benchmarks_request(stack: str, tmp_path: Path) -> None:
    """Each front end, started as the benchmark starts it (ready once
    /health answers), answers the streamed chat request whole (the
    closed-loop client counts it) and nothing else; it is left out of the
    fleet table."""
    procs = Procs(tmp_path)
    try:
        url = front_end(stack)(procs, []).url
        r = httpx.post(url + "/v1/chat/completions", content=bodies(1)[0])
        assert r.status_code == 200 and r.headers["content-type"] == "text/event-stream"
        assert b"[DONE]" in r.content
        assert httpx.get(url + "/v1/models").status_code == 404
        ttfts, failed, _ = asyncio.run(load(url, 4, 40, bodies(8)))
        assert len(ttfts) == 40 and failed == 0
    finally:
        procs.close()
    c = FLEET_CONCURRENCY
    md = fleet_table([_row(FRONT_AIOHTTP, 4, c, 1.0, 0.1), _row("a", 4, c, 1.0, 0.4)])
    assert FRONT_AIOHTTP not in md
