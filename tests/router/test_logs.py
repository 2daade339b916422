"""Logs are one JSON object a line, library records and the start-up
line included: a client's malformed HTTP is a warning line, never a
traceback."""

from __future__ import annotations

import json
import time
from functools import partial
from pathlib import Path

import httpx

from harness.procs import Procs
from harness.waiting import wait_for
from tests.router.hangup import connect
from toposerve.localcluster.ports import free_port

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")


def _send_raw(url: str, data: bytes) -> bytes:
    with connect(url, 5) as s:
        s.sendall(data)
        return s.recv(4096)


def _warnings(log: Path) -> list[dict[str, object]]:
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    return [r for r in recs if str(r.get("msg", "")).startswith("malformed HTTP")]


def _at_least_two_warnings(log: Path) -> list[dict[str, object]]:
    w = _warnings(log)
    return w if len(w) >= 2 else []


def test_malformed_http_is_one_warning_line(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router(endpoints=[sim.url])
    # over aiohttp's line limit (the router's is 8 times server.maxHeaderBytes;
    # a shorter oversized header gets the router's 431 from its middleware)
    long_header = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
    for target in (router, sim):
        for raw in (H2_PREFACE, long_header):
            # refused before any handler runs, and still in the OpenAI error shape
            head, _, body = _send_raw(target.url, raw).partition(b"\r\n\r\n")
            assert head.split(b" ")[1] == b"400", head
            assert b"Content-Type: application/json" in head, head
            assert json.loads(body)["error"]["code"] == 400, body
        assert httpx.get(target.url + "/health").status_code == 200  # still serving

        warned = wait_for("the two malformed requests logged",
                          partial(_at_least_two_warnings, target.log))
        assert all(r["level"] == "warning" and r["status"] in (400, 431) for r in warned)
        assert any("PRI" in str(r["error"]) for r in warned)
        text = target.log.read_text()
        assert "Traceback" not in text
        # every line is JSON (stdout and stderr, merged into this log by the
        # test's process runner), the start-up record included
        recs = [json.loads(line) for line in text.splitlines()]
        assert [r["url"] for r in recs if r["msg"] == "serving"] == [target.url]


def _unreachable(log: Path) -> list[dict[str, object]]:
    recs = [json.loads(line) for line in log.read_text().splitlines()]
    return [r for r in recs if r.get("msg") == "endpoint unreachable"]


def test_an_endpoint_never_reached_is_one_warning(procs: Procs) -> None:
    """A typo in an endpoint's URL: a warning naming it and why (once a
    streak of failed scrapes, not once a scrape), while the good one serves."""
    sim = procs.sim()
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    router = procs.router({"scrape": {"intervalSeconds": 0.2}}, endpoints=[sim.url, nobody])
    warned = wait_for("the unreachable endpoint named", partial(_unreachable, router.log))
    assert warned[0]["level"] == "warning"
    assert nobody.removeprefix("http://") in str(warned[0]["endpoint"])
    assert "Connect" in str(warned[0]["error"])
    assert httpx.get(router.url + "/health").status_code == 200
    time.sleep(1.5)  # seven more failed scrapes
    assert len(_unreachable(router.log)) == 1
