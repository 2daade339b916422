"""llm-d's objective, fairness and SLO headers against a real router and a
simulator that is made to saturate (one sequence at a time)."""

from __future__ import annotations

import threading
import time

import httpx

from harness.procs import MODEL, Proc, Procs
from harness.waiting import wait_for


def _post(url: str, max_tokens: int, **headers: str) -> httpx.Response:
    return httpx.post(url + "/v1/completions", headers=headers, timeout=30, json={
        "model": MODEL, "prompt": "hello", "max_tokens": max_tokens})


def saturate(sim: Proc, router: Proc, max_tokens: int) -> list[threading.Thread]:
    """Two long requests through the router to a one-sequence server: one
    runs, one waits there; returns when the router's scrape has seen that."""
    busy = [threading.Thread(target=_post, args=(router.url, max_tokens)) for _ in range(2)]
    busy[0].start()
    wait_for("the first to run", lambda: sim.metric("vllm:num_requests_running") >= 1)
    busy[1].start()
    wait_for("the router to see one waiting",
             lambda: router.metric("toposerve_router_endpoint_waiting") >= 1)
    return busy


def test_shedding_queueing_and_ttl(procs: Procs) -> None:
    sim = procs.sim(max_num_seqs=1, time_scale=1.0, decode_s_per_token=0.05)
    router = procs.router({
        "saturation": {"queueThreshold": 1},
        "flowControl": {"objectives": [{"name": "batch", "priority": -1}],
                        "enabled": True, "queueTTLSeconds": 20}},
        endpoints=[sim.url])
    # with room, a sheddable request is served
    assert _post(router.url, 1, **{"x-llm-d-inference-objective": "batch"}).status_code == 200
    # one request runs, one waits on the server: saturated
    busy = saturate(sim, router, 100)  # 5 s each: the checks below fit inside
    shed = _post(router.url, 1, **{"x-llm-d-inference-objective": "batch"})
    assert shed.status_code == 429, shed.text
    assert "sheddable" in shed.json()["error"]["message"]
    t0 = time.monotonic()
    late = _post(router.url, 1, **{"x-llm-d-slo-ttft-ms": "300"})
    assert late.status_code == 429 and time.monotonic() - t0 >= 0.3
    assert "x-llm-d-slo-ttft-ms" in late.json()["error"]["message"]
    # an ordinary request waits in the router until the server has room
    t0 = time.monotonic()
    queued = _post(router.url, 1, **{"x-llm-d-inference-fairness-id": "tenant-a"})
    assert queued.status_code == 200 and time.monotonic() - t0 > 0.5
    for t in busy:
        t.join()
    metrics = httpx.get(router.url + "/metrics").text
    # each with its band: the sheddable objective's, else 0
    for outcome, band in (("shed", -1), ("expired", 0), ("queued", 0)):
        assert (f'toposerve_router_admission_total{{outcome="{outcome}",priority="{band}"}} 1.0'
                in metrics), outcome
    assert "toposerve_router_queued_requests 0.0" in metrics


def test_flow_control_off_sends_anyway(procs: Procs) -> None:
    sim = procs.sim(max_num_seqs=1, time_scale=1.0, decode_s_per_token=0.05)
    router = procs.router({"saturation": {"queueThreshold": 1}}, endpoints=[sim.url])
    busy = saturate(sim, router, 100)
    # not sheddable, no flow control: goes to the saturated server and is served
    assert _post(router.url, 1).status_code == 200
    assert _post(router.url, 1, **{"x-llm-d-inference-objective": "unknown"}
                 ).status_code == 200
    for t in busy:
        t.join()
