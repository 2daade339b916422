"""Bad input and failing upstreams: always an answer, a 4xx for the
client's mistakes, retries before the first byte, and an SSE error event
(never a silent truncation) after it."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import httpx
import openai
import orjson
import pytest

from harness.procs import MODEL, Procs
from harness.waiting import wait_for
from tests.router.hangup import connect, hanging_client

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}


@pytest.mark.parametrize("body, status, fragment", [
    (b"{not json", 400, "not valid JSON"),
    (b"[1, 2]", 400, "must be a JSON object"),
    (orjson.dumps({"model": MODEL}), 400, "messages"),
    (orjson.dumps({**CHAT, "messages": "hi"}), 400, "messages"),
    (orjson.dumps({**CHAT, "messages": []}), 400, "messages"),
    (orjson.dumps({**CHAT, "max_tokens": "3"}), 400, "max_tokens"),
    (orjson.dumps({**CHAT, "max_tokens": -1}), 400, "max_tokens"),
    (orjson.dumps({**CHAT, "stream": "yes"}), 400, "stream"),
    (orjson.dumps({**CHAT, "model": 7}), 400, "model"),
    (orjson.dumps({**CHAT, "model": "nope"}), 404, "does not exist"),
    (b"\xff\xfe{}", 400, "not valid JSON"),
])
def test_malformed_chat(procs: Procs, body: bytes, status: int, fragment: str) -> None:
    sim = procs.sim()
    router = procs.router(endpoints=[sim.url])
    r = httpx.post(router.url + "/v1/chat/completions", content=body,
                   headers={"Content-Type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert fragment in err["message"] and err["code"] == status


def test_oversized_body_413(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router({"server": {"maxBodyBytes": 10_000}}, endpoints=[sim.url])
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * 20_000}]}
    r = httpx.post(router.url + "/v1/chat/completions", json=big)
    assert r.status_code == 413 and "maxBodyBytes" in r.json()["error"]["message"]
    # the same without a Content-Length: chunked upload, cut off at the limit
    def chunks() -> Iterator[bytes]:
        data = orjson.dumps(big)
        for i in range(0, len(data), 1000):
            yield data[i:i + 1000]
    r = httpx.post(router.url + "/v1/chat/completions", content=chunks())
    assert r.status_code == 413


def test_no_ready_endpoint_503(procs: Procs) -> None:
    sim = procs.sim(slow_start_s=60)
    router = procs.router(endpoints=[sim.url], wait_ready=False)
    assert httpx.get(router.url + "/ready").status_code == 503
    r = httpx.post(router.url + "/v1/chat/completions", json={**CHAT, "model": None})
    assert r.status_code == 503 and r.json()["error"]["type"] == "ServiceUnavailable"


def test_ready_for_a_pod_probe_without_model_servers(procs: Procs) -> None:
    """A router with no model server that works answers 503 "no endpoint",
    and its pod is ready (the install on an empty cluster finishes): the pod
    probe (?role=any) needs it warm, each endpoint scraped once, not a
    healthy one; a load balancer's plain /ready still needs one."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{s.getsockname()[1]}"
    router = procs.router(endpoints=[nobody], wait_ready=False)
    wait_for("warm", lambda: httpx.get(router.url + "/ready?role=any").status_code == 200,
             timeout=10)
    assert httpx.get(router.url + "/ready").status_code == 503
    r = httpx.post(router.url + "/v1/chat/completions", json={**CHAT, "model": None})
    assert r.status_code == 503 and r.json()["error"]["type"] == "ServiceUnavailable"
    starting = procs.sim(slow_start_s=60)
    router = procs.router(endpoints=[starting.url], wait_ready=False)
    # the endpoint's first scrape fails (it is starting): known, unhealthy
    wait_for("warm", lambda: httpx.get(router.url + "/ready?role=any").status_code == 200,
             timeout=20)
    assert httpx.get(router.url + "/ready").status_code == 503


def test_failing_endpoint_is_retried(procs: Procs) -> None:
    bad = procs.sim(error_rate=1.0)
    good = procs.sim()
    router = procs.router(endpoints=[bad.url, good.url])
    c = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    for i in range(20):
        raw = c.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": f"q{i}"}], max_tokens=2)
        assert raw.headers["x-toposerve-endpoint"] == good.url.removeprefix("http://")
    # ties between the two break at random: some requests tried the bad one first
    assert router.metric("toposerve_router_retries_total") >= 1


def test_connection_refused_is_retried(procs: Procs) -> None:
    good = procs.sim()
    doomed = procs.sim()
    router = procs.router(endpoints=[doomed.url, good.url])
    doomed.kill()  # the router still believes in it until scrapes fail
    for i in range(10):
        r = httpx.post(router.url + "/v1/chat/completions",
                       json={**CHAT, "messages": [{"role": "user", "content": f"m{i}"}]})
        assert r.status_code == 200


def test_midstream_failure_ends_with_error_event(procs: Procs) -> None:
    sim = procs.sim(midstream_failure_rate=1.0)
    router = procs.router(endpoints=[sim.url])
    with httpx.stream("POST", router.url + "/v1/chat/completions",
                      json={**CHAT, "stream": True, "max_tokens": 50}) as r:
        assert r.status_code == 200
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    last = orjson.loads(events[-1].removeprefix("data: "))
    assert "error" in last and "broke while answering" in last["error"]["message"]
    c = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIError):
        for _ in c.chat.completions.create(model=MODEL, stream=True, max_tokens=50,
                                           messages=[{"role": "user", "content": "go"}]):
            pass


def test_all_endpoints_failing_502(procs: Procs) -> None:
    a, b = procs.sim(error_rate=1.0), procs.sim(error_rate=1.0)
    router = procs.router(endpoints=[a.url, b.url])
    r = httpx.post(router.url + "/v1/chat/completions", json=CHAT)
    assert r.status_code == 502 and "HTTP 500" in r.json()["error"]["message"]


def test_unknown_path_and_method(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router(endpoints=[sim.url])
    r = httpx.get(router.url + "/v1/chat/completions")
    assert r.status_code == 405 and r.json()["error"]["code"] == 405
    r = httpx.post(router.url + "/v2/anything", json={})
    assert r.status_code == 404 and r.json()["error"]["code"] == 404


def test_truncated_body_and_slow_client(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router(endpoints=[sim.url])
    with connect(router.url, 5) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"model\"")
        s.shutdown(socket.SHUT_WR)  # the client gives up mid-body
        reply = s.recv(4096)
    assert reply == b"" or reply.startswith(b"HTTP/1.1 4")
    # a slow client trickles its body; good traffic is served meanwhile
    body = orjson.dumps(CHAT)
    with connect(router.url, 10) as slow:
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        for i in range(0, len(body), 8):
            slow.sendall(body[i:i + 8])
            assert httpx.post(router.url + "/v1/chat/completions",
                              json=CHAT).status_code == 200
        assert slow.recv(4096).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("stream", [True, False])
def test_client_hangup_frees_the_upstream(procs: Procs, stream: bool) -> None:
    """A client that hangs up, mid-stream or while waiting for a whole
    answer, must not leave its generation running upstream (vLLM aborts a
    request whose connection closes), nor its tokens counted against the
    endpoint."""
    sim = procs.sim()
    router = procs.router(endpoints=[sim.url])
    # about 100 s of decoding if nobody stops it
    body = orjson.dumps({**CHAT, "stream": stream, "max_tokens": 100_000})
    with hanging_client(router.url, "/v1/chat/completions", body, stream):
        wait_for("the request to start upstream",
                 lambda: sim.metric("vllm:num_requests_running"))
        assert router.metric("toposerve_router_endpoint_inflight") == 1
    wait_for("the upstream to stop generating after the hang-up",
             lambda: not (sim.metric("vllm:num_requests_running")
                          or router.metric("toposerve_router_endpoint_inflight")))
    assert httpx.post(router.url + "/v1/chat/completions", json=CHAT).status_code == 200
