"""Logs are one JSON object a line, library records and the start-up
line included: a client's malformed HTTP is a warning line, never a
traceback."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import httpx

from harness.procs import Procs
from harness.waiting import wait_for
from tests.router.hangup import connect

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
    # a shorter oversized header gets the router's own JSON 431)
    long_header = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 100_000 + b"\r\n\r\n"
    for target in (router, sim):
        assert _send_raw(target.url, H2_PREFACE).split(b" ")[1] == b"400"
        assert _send_raw(target.url, long_header).split(b" ")[1] in (b"400", b"431")
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
