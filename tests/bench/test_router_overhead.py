"""The router-overhead benchmark's parts: the null backend's answers, the
closed-loop client against it (in process, on loopback), and the added
latency and fleet tables."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from bench.null_backend import NOT_FOUND, answer, serve
from bench.router_bench import OURS
from bench.router_overhead import (
    DIRECT,
    ENVOY_ALONE,
    ENVOY_EPP,
    FLEET_CONCURRENCY,
    GATEWAY,
    GATEWAY_ROUTERS,
    LOADS,
    OURS_2,
    OURS_2_UNSHARED,
    ROUTERS,
    STANDALONE,
    Row,
    added,
    bodies,
    fleet_table,
    gateway_table,
    sharing_table,
)
from toposerve.localcluster.ports import free_port

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


def _sse_events(raw: bytes) -> list[bytes]:
    return [line[6:] for line in raw.split(b"\r\n") if line.startswith(b"data: ")]


def test_null_backend_answers_what_routers_ask() -> None:
    streamed = answer(b"POST", b"/v1/chat/completions", bodies(1)[0])
    assert streamed.startswith(b"HTTP/1.1 200 OK") and b"text/event-stream" in streamed
    events = b"".join(_sse_events(streamed)).split(b"\n\ndata: ")
    assert orjson.loads(events[0])["choices"][0]["delta"]["content"] == "ok"
    assert streamed.rstrip().endswith(b"0")  # the chunked body's terminator
    assert b"[DONE]" in streamed
    plain = answer(b"POST", b"/v1/completions", b'{"prompt": "x", "stream": false}')
    doc = orjson.loads(plain.split(b"\r\n\r\n", 1)[1])
    assert doc["choices"][0]["text"] == "ok"
    models = orjson.loads(answer(b"GET", b"/v1/models", b"").split(b"\r\n\r\n", 1)[1])
    assert models["data"][0]["id"] == "toposerve/sim-model"
    metrics = answer(b"GET", b"/metrics", b"")
    assert b'vllm:num_requests_running{model_name="toposerve/sim-model"} 0.0' in metrics
    assert answer(b"GET", b"/health", b"").startswith(b"HTTP/1.1 200 OK")
    assert answer(b"POST", b"/tokenize", b"{}") is NOT_FOUND


@pytest.mark.parametrize("connections", sorted(LOADS))
def test_closed_loop_clients_against_the_null_backend(connections: str) -> None:
    """Kept-alive connections, or one a request: a connection the backend
    did not close after its answer would hold its client to the deadline."""
    async def go() -> tuple[list[float], int, float]:
        port = free_port()
        server = asyncio.create_task(serve([port]))
        await asyncio.sleep(0.1)
        try:
            return await LOADS[connections](f"http://127.0.0.1:{port}", 4, 40, bodies(8))
        finally:
            server.cancel()

    ttfts, failed, wall = asyncio.run(go())
    assert len(ttfts) == 40 and failed == 0
    assert all(0 < t < wall for t in ttfts)
    assert wall < 10


def _row(router: str, fleet: int, c: int, p50: float, cpu: float, repeat: int = 0) -> Row:
    return Row(router=router, fleet=fleet, concurrency=c, requests=100, failed=0,
               ttft_p50_ms=p50, ttft_p99_ms=2 * p50, ttft_p999_ms=3 * p50, added_p50_ms=0.0,
               added_p99_ms=0.0, added_p999_ms=0.0, rps=100.0, cpu_ms_per_request=cpu,
               rss_mb=50.0, load1=1.0, repeat=repeat)


def test_added_latency_is_over_direct_in_the_same_round() -> None:
    rows = added([_row(DIRECT, 4, 1, 0.1, 0.0), _row("a", 4, 1, 1.1, 0.5),
                  _row(DIRECT, 4, 1, 0.3, 0.0, repeat=1), _row("a", 4, 1, 0.8, 0.5, repeat=1),
                  _row("a", 4, 16, 5.0, 0.5)])  # no direct row at 16: nothing taken off
    a = [r for r in rows if r.router == "a"]
    assert a[0].added_p50_ms == pytest.approx(1.0) and a[0].added_p999_ms == pytest.approx(3.0)
    assert a[1].added_p50_ms == pytest.approx(0.5)
    assert a[2].added_p50_ms == 0.0


def test_fleet_table_gives_the_cost_ratio() -> None:
    c = FLEET_CONCURRENCY
    md = fleet_table([_row(DIRECT, 4, c, 0.1, 0.0), _row("a", 4, c, 1.0, 0.4),
                      _row("a", 16, c, 1.0, 0.5), _row("a", 64, c, 1.0, 0.6)])
    assert "| a | 0.400 | 0.500 | 0.600 | 1.50 |" in md
    assert "direct" not in md


def test_gateway_table_gives_ratios_to_ours_standalone_and_the_pickers_share() -> None:
    """Each row over ours standalone at its own clients (added p50, p99 and
    req/s); Envoy + picker also over Envoy alone; a base at or below direct
    gives no ratio rather than a division by zero."""
    rows = added([_row(DIRECT, 4, 1, 0.1, 0.0), _row(OURS, 4, 1, 1.1, 0.3),
                  _row(ENVOY_EPP, 4, 1, 3.1, 0.9), _row(ENVOY_ALONE, 4, 1, 0.6, 0.1),
                  _row("smg cache_aware", 4, 1, 48.1, 0.2),
                  _row(DIRECT, 4, 8, 0.5, 0.0), _row(OURS, 4, 8, 0.5, 0.3),
                  _row(ENVOY_EPP, 4, 8, 2.5, 0.9)])
    rows[2].rps, rows[3].rps = 50.0, 400.0
    md = gateway_table(rows)
    lines = md.splitlines()
    assert lines[0].startswith("| router | endpoints | clients | added p50 / toposerve |")
    # added p50 3.0 over 1.0 (p99 6.0 over 2.0); 50 req/s over 100; over Envoy alone: 2.5, 5.0
    assert f"| {ENVOY_EPP} | 4 | 1 | 3.00 | 3.00 | 0.50 | 2.500 | 5.00 |" in lines
    assert f"| {ENVOY_ALONE} | 4 | 1 | 0.50 | 0.50 | 4.00 | | |" in lines
    assert "| smg cache_aware | 4 | 1 | 48.00 | 48.00 | 1.00 | | |" in lines
    assert f"| {ENVOY_EPP} | 4 | 8 | | | 1.00 | | |" in lines  # ours adds nothing at 8
    assert not any(line.startswith(("| direct", "| toposerve |")) for line in lines)


def test_gateway_routers_stay_out_of_a_plain_run() -> None:
    assert set(GATEWAY_ROUTERS) <= set(ROUTERS) and set(GATEWAY) <= set(GATEWAY_ROUTERS)
    assert not set(GATEWAY) & set(STANDALONE) and OURS in STANDALONE


def test_sharing_table_gives_sharing_over_nothing_shared_and_over_one_process() -> None:
    rows = [_row(OURS, 4, 16, 1.0, 0.30), _row(OURS_2_UNSHARED, 4, 16, 1.0, 0.40),
            _row(OURS_2, 4, 16, 1.0, 0.42), _row(OURS_2, 4, 64, 1.0, 0.5)]  # no baseline at 64
    lines = sharing_table(rows).splitlines()
    assert "| 4 | 16 | 0.300 | 0.400 | 0.420 | 1.05 | 1.40 |" in lines
    assert len(lines) == 3
    assert OURS_2_UNSHARED not in STANDALONE and OURS_2 in STANDALONE
