"""What a client says about its request besides the body, against a real
router process: a Content-Encoding the body does not follow is a JSON 400
(it was a 500 with a traceback), and one it follows goes upstream decoded
and unlabelled (it went on labelled gzip, and every endpoint failed on it);
an X-Request-Id, which reaches the engine's own ids, is bounded as the
session and fairness ids are; an expectation other than 100-continue is a
JSON 417 (aiohttp's was plain text)."""

from __future__ import annotations

import gzip
import socket

import httpx
import orjson

from harness.procs import MODEL, Procs

CHAT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def _raw(url: str, request: bytes) -> tuple[int, bytes]:
    """One request as bytes on a fresh connection: the status and the body."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as s:
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
            if b"\r\n\r\n" in data and b"}" in data.partition(b"\r\n\r\n")[2]:
                break
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), body


def test_content_encoding_is_read_or_refused(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router({}, endpoints=[sim.url])
    url = router.url + "/v1/chat/completions"
    packed = gzip.compress(orjson.dumps(CHAT))
    r = httpx.post(url, content=packed, timeout=30,
                   headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]
    r = httpx.post(url, content=orjson.dumps(CHAT), timeout=30,
                   headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "could not be read" in error["message"] and error["param"] == "Content-Encoding"
    assert "Traceback" not in router.log.read_text()


def test_a_request_id_is_bounded_and_plain(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router({}, endpoints=[sim.url])
    url = router.url + "/v1/chat/completions"
    ok = httpx.post(url, json=CHAT, headers={"X-Request-Id": "trace-42"}, timeout=30)
    assert ok.status_code == 200 and ok.headers["X-Request-Id"] == "trace-42"
    for bad in ("x" * 257, "two\tfields"):
        r = httpx.post(url, json=CHAT, headers={"X-Request-Id": bad}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["param"] == "X-Request-Id", r.text


def test_only_100_continue_is_expected(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router({}, endpoints=[sim.url])
    body = orjson.dumps(CHAT)
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
            b"\r\nContent-Length: %d\r\nExpect: %s\r\nConnection: close\r\n\r\n")
    status, answer = _raw(router.url, head % (len(body), b"foo") + body)
    assert status == 417
    assert orjson.loads(answer)["error"]["param"] == "Expect"
    status, answer = _raw(router.url, head % (len(body), b"100-continue") + body)
    assert status == 100  # then the answer itself
    assert b"HTTP/1.1 200 OK" in answer
