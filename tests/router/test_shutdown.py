"""The router stopping (SIGTERM, as Kubernetes stops a pod): it takes no new
connections, lets in-flight answers finish for server.drainTimeoutSeconds,
then ends the rest with an error that says why; never a silent cut."""

from __future__ import annotations

import signal
import threading

import httpx
import orjson

from harness.procs import MODEL, Procs
from harness.waiting import wait_for

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello"}]}


RUNNING = "vllm:num_requests_running"


def test_sigterm_lets_in_flight_streams_finish(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router(endpoints=[sim.url])
    # about 2 s of decoding, well inside the default 30 s drain
    with httpx.stream("POST", router.url + "/v1/chat/completions", timeout=30,
                      json={**CHAT, "stream": True, "max_tokens": 2000}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        router.popen.send_signal(signal.SIGTERM)

        def refused() -> bool:
            try:
                httpx.get(router.url + "/health")
            except httpx.ConnectError:
                return True
            return False

        # the listener is closed at once
        wait_for("new connections to be refused", refused, timeout=2, interval=0.02)
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]" and len(rest) > 100
    assert router.popen.wait(10) == 0
    assert "stopping: in-flight requests finish first" in router.log.read_text()


def test_drain_timeout_ends_answers_with_the_reason(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router({"server": {"drainTimeoutSeconds": 1}}, endpoints=[sim.url])
    long = {**CHAT, "max_tokens": 100_000}  # about 100 s of decoding
    whole: list[httpx.Response] = []
    waiter = threading.Thread(target=lambda: whole.append(
        httpx.post(router.url + "/v1/chat/completions", json=long, timeout=30)))
    waiter.start()
    with httpx.stream("POST", router.url + "/v1/chat/completions", timeout=30,
                      json={**long, "stream": True}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("data: ")
        wait_for("both generations running", lambda: sim.metric(RUNNING) >= 2, interval=0.05)
        router.popen.send_signal(signal.SIGTERM)
        events = [line for line in lines if line.startswith("data: ")]
    last = orjson.loads(events[-1].removeprefix("data: "))
    assert last["error"]["code"] == 503 and "drainTimeoutSeconds" in last["error"]["message"]
    waiter.join(10)
    assert whole[0].status_code == 503
    assert "drainTimeoutSeconds" in whole[0].json()["error"]["message"]
    assert router.popen.wait(10) == 0
    # both generations were stopped upstream, not left running
    wait_for("both generations to stop upstream", lambda: not sim.metric(RUNNING))
