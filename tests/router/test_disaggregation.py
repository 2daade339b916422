"""Prefill/decode disaggregation against real simulators: the prompt is
prefilled on a prefill endpoint (one token, KV left there), the answer comes
from a decode endpoint handed the prefill's kv_transfer_params; decode sits
next to its prefill when it can; a failed prefill still gets an answer."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import openai
import orjson
import pytest

from harness.procs import MODEL, Proc, Procs
from harness.waiting import wait_for
from tests.router.hangup import hanging_client
from toposerve.localcluster.ports import free_port
from toposerve.topology.model import DomainPath, Tier
from toposerve.topology.profiles import load_profile
from toposerve.wire.tokens import BYTES_PER_TOKEN


def pd_router(procs: Procs, prefill: list[Proc], decode: list[Proc],
              nodes: tuple[str, str] | None = None, **extra: Any) -> Proc:
    static = []
    for role, sims in (("prefill", prefill), ("decode", decode)):
        for i, s in enumerate(sims):
            entry: dict[str, Any] = {"url": s.url, "role": role}
            if nodes:
                entry["node"] = nodes[i % len(nodes)]
            static.append(entry)
    return procs.router({"discovery": {"static": static},
                         "disaggregation": {"enabled": True}, **extra})


def test_split_through_openai_client(procs: Procs) -> None:
    prefill = [procs.sim(time_scale=0.01) for _ in range(2)]
    decode = [procs.sim(time_scale=0.01) for _ in range(2)]
    router = pd_router(procs, prefill, decode)
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused")
    n = 6
    for i in range(n):
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, max_tokens=5,
            messages=[{"role": "user", "content": f"question {i} " + "context " * 100}])
        r = raw.parse()
        assert r.choices[0].message.content and r.usage and r.usage.completion_tokens == 5
        rid = raw.headers["x-request-id"]
        assert r.id == f"chatcmpl-{rid}"  # the decode endpoint saw the router's request id
        assert raw.headers["x-toposerve-endpoint"] in {s.url[7:] for s in decode}
        assert raw.headers["x-toposerve-prefill-endpoint"] in {s.url[7:] for s in prefill}
    stream = client.completions.create(model=MODEL, prompt="stream me " * 50, max_tokens=7,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices)
    pre = [s.counters() for s in prefill]
    dec = [s.counters() for s in decode]
    # each request: one token on a prefill endpoint, the rest on a decode endpoint
    assert sum(c["vllm:request_success_total"] for c in pre) == n + 1
    assert sum(c["vllm:generation_tokens_total"] for c in pre) == n + 1
    assert sum(c["vllm:request_success_total"] for c in dec) == n + 1
    assert sum(c["vllm:generation_tokens_total"] for c in dec) == 5 * n + 7
    metrics = httpx.get(router.url + "/metrics").text
    assert f'toposerve_router_disaggregation_total{{outcome="split"}} {n + 1}.0' in metrics
    assert f'toposerve_router_pd_pairs_total{{tier="unknown"}} {n + 1}.0' in metrics


def paired_within(router: Proc, group_of: dict[str, str], n: int) -> set[str]:
    """Sends ``n`` split requests; each must decode in its prefill's group
    (a node, a domain). Returns the groups used."""
    used = set()
    for i in range(n):
        r = httpx.post(router.url + "/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": f"document {i} " * 250, "max_tokens": 2})
        assert r.status_code == 200, r.text
        p, d = r.headers["x-toposerve-prefill-endpoint"], r.headers["x-toposerve-endpoint"]
        assert group_of[p] == group_of[d]
        used.add(group_of[p])
    return used


def test_decode_pairs_with_prefill_node(procs: Procs) -> None:
    prefill = [procs.sim(time_scale=0.01) for _ in range(2)]
    decode = [procs.sim(time_scale=0.01) for _ in range(2)]
    router = pd_router(procs, prefill, decode, nodes=("node-a", "node-b"))
    node_of = {s.url[7:]: ("node-a", "node-b")[i] for sims in (prefill, decode)
               for i, s in enumerate(sims)}
    # both nodes' prefill endpoints were used
    assert paired_within(router, node_of, 8) == {"node-a", "node-b"}


def test_failed_prefill_still_answers(procs: Procs) -> None:
    prefill = [procs.sim(time_scale=0.01, error_rate=1.0)]
    decode = [procs.sim(time_scale=0.01)]
    router = pd_router(procs, prefill, decode)
    for i in range(3):
        r = httpx.post(router.url + "/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": f"try {i}", "max_tokens": 3})
        assert r.status_code == 200, r.text
        assert "x-toposerve-prefill-endpoint" not in r.headers
    dec = decode[0].counters()
    assert dec["vllm:generation_tokens_total"] == 9  # decoded with a local prefill
    metrics = httpx.get(router.url + "/metrics").text
    assert 'toposerve_router_disaggregation_total{outcome="prefill-failed"} 3.0' in metrics


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": "far too long " * 200, "max_tokens": 3}),
    ("/v1/responses", {"input": "far too long " * 200, "max_output_tokens": 3})])
def test_prompt_refused_by_prefill_is_passed_on(procs: Procs, path: str,
                                                body: dict[str, Any]) -> None:
    prefill = [procs.sim(time_scale=0.01, max_model_len=100)]
    decode = [procs.sim(time_scale=0.01)]
    router = pd_router(procs, prefill, decode)
    r = httpx.post(router.url + path, timeout=30, json={"model": MODEL, **body})
    assert r.status_code == 400 and "maximum context length" in r.json()["error"]["message"]
    assert decode[0].counters().get("vllm:request_success_total", 0) == 0


def test_without_decode_endpoints_requests_run_whole(procs: Procs) -> None:
    prefill = [procs.sim(time_scale=0.01)]
    router = pd_router(procs, prefill, [])
    r = httpx.post(router.url + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": "alone", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4


def test_responses_chain_split(procs: Procs) -> None:
    """A Responses chain split turn by turn, streamed and not: every turn is
    prefilled where the chain's prefix lives, answered by a decode endpoint,
    and the chain still resolves at the router."""
    prefill = [procs.sim(time_scale=0.01) for _ in range(2)]
    decode = [procs.sim(time_scale=0.01) for _ in range(2)]
    # the session scorer alone: the chain sticks by the endpoint the router
    # stored with each turn (ties are broken at random), not by prefix index
    router = pd_router(procs, prefill, decode, profile={"scorers": [{"type": "session"}]})
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)
    prev, last_input, prefilled_on = None, 0, set()
    turns = 6
    for turn in range(turns):
        raw = client.responses.with_raw_response.create(
            model=MODEL, input=f"turn {turn}: " + "detail " * 100, max_output_tokens=5,
            previous_response_id=prev, stream=bool(turn % 2))
        prefilled_on.add(raw.headers["x-toposerve-prefill-endpoint"])
        assert raw.headers["x-toposerve-endpoint"] in {s.url[7:] for s in decode}
        if turn % 2:
            events: Any = raw.parse()  # a stream of events when streamed
            *_, done = events
            assert done.type == "response.completed"
            r = done.response
        else:
            r = raw.parse()
        assert r.previous_response_id == prev and r.output_text
        assert r.usage is not None and r.usage.output_tokens == 5
        assert r.usage.input_tokens > last_input  # the whole conversation, every turn
        last_input, prev = r.usage.input_tokens, r.id
    assert len(prefilled_on) == 1  # the chain's prefill endpoint holds its prefix
    pre = [s.counters() for s in prefill]
    dec = [s.counters() for s in decode]
    assert sum(c.get("vllm:generation_tokens_total", 0) for c in pre) == turns
    assert sum(c.get("vllm:prefix_cache_hits_total", 0) for c in pre) > 0
    assert sum(c.get("vllm:generation_tokens_total", 0) for c in dec) == 5 * turns
    metrics = httpx.get(router.url + "/metrics").text
    assert f'toposerve_router_disaggregation_total{{outcome="split"}} {turns}.0' in metrics
    assert prev is not None and client.responses.retrieve(prev).id == prev


def test_decode_refuses_incomplete_kv_params(procs: Procs) -> None:
    sim = procs.sim(time_scale=0.01)
    params = {"do_remote_prefill": True, "remote_engine_id": "e"}
    for path, body in (("/v1/completions", {"prompt": "x", "max_tokens": 2}),
                       ("/v1/responses", {"input": "x", "max_output_tokens": 2})):
        r = httpx.post(sim.url + path, timeout=30,
                       json={"model": MODEL, **body, "kv_transfer_params": params})
        assert r.status_code == 400, path
        assert "remote_block_ids" in r.json()["error"]["message"]


# two GB200 trays in different NVL72 racks of one block
RACKS: tuple[dict[str, Any], ...] = (
    {"node": "tray-a", "nvlink_domain": "r1", "rack": "r1", "block": "b", "zone": "z"},
    {"node": "tray-b", "nvlink_domain": "r2", "rack": "r2", "block": "b", "zone": "z"})


def sglang_router(procs: Procs, time_scale: float = 0.01, bootstrap_timeout_s: float = 1.0,
                  **prefill_flags: Any) -> tuple[Proc, Proc, Proc]:
    port = free_port()
    prefill = procs.sim(dialect="sglang", disaggregation_mode="prefill", time_scale=time_scale,
                        disaggregation_bootstrap_port=port, **prefill_flags, **RACKS[0])
    decode = procs.sim(dialect="sglang", disaggregation_mode="decode", time_scale=time_scale,
                       disaggregation_bootstrap_timeout_s=bootstrap_timeout_s, **RACKS[1])
    router = procs.router({
        "discovery": {"static": [{"url": prefill.url, "role": "prefill", "bootstrapPort": port},
                                 {"url": decode.url, "role": "decode"}]},
        "disaggregation": {"enabled": True, "protocol": "sglang"}})
    return router, prefill, decode


def test_sglang_bootstrap_split(procs: Procs) -> None:
    router, prefill, decode = sglang_router(procs)
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused")
    r = client.chat.completions.create(model=MODEL, max_tokens=6,
                                       messages=[{"role": "user", "content": "hello " * 80}])
    assert r.choices[0].message.content and r.usage and r.usage.completion_tokens == 6
    stream = client.completions.create(model=MODEL, prompt="more " * 80, max_tokens=4,
                                       stream=True)
    assert "".join(c.choices[0].text for c in stream if c.choices)
    pre, dec = prefill.counters(), decode.counters()
    assert pre["sglang:generation_tokens_total"] == 2  # one token each: it only prefills
    assert dec["sglang:generation_tokens_total"] == 10
    # the decode server learnt at the bootstrap where the prefill ran: across racks
    assert ('toposerve_sim_kv_pulls_total{tier="block"} 2.0'
            in httpx.get(decode.url + "/metrics").text)
    assert dec["toposerve_sim_kv_pull_bytes_sum"] > 0
    metrics = httpx.get(router.url + "/metrics").text
    assert 'toposerve_router_disaggregation_total{outcome="split"} 2.0' in metrics
    # SGLang's bootstrap fields are not for its Responses API: that runs whole
    r2 = client.responses.create(model=MODEL, input="whole " * 20, max_output_tokens=3)
    assert r2.output_text and r2.usage is not None and r2.usage.output_tokens == 3
    metrics = httpx.get(router.url + "/metrics").text
    assert 'toposerve_router_disaggregation_total{outcome="split"} 2.0' in metrics


def test_sglang_failed_prefill_falls_back(procs: Procs) -> None:
    # the decode server waits for a room that never fills, gives up, and the
    # router has it prefill the prompt itself
    router, _, decode = sglang_router(procs, error_rate=1.0)
    r = httpx.post(router.url + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": "lonely", "max_tokens": 3})
    assert r.status_code == 200, r.text
    assert decode.counters()["sglang:generation_tokens_total"] == 3
    metrics = httpx.get(router.url + "/metrics").text
    assert 'toposerve_router_disaggregation_total{outcome="prefill-failed"} 1.0' in metrics


def test_sglang_split_hangup_stops_the_prefill_too(procs: Procs) -> None:
    """Both halves of a split request run at once; a client that hangs up
    while the decode half waits for its KV stops the prefill half as well,
    which would otherwise prefill on for nobody."""
    # 20,000 tokens at 1 ms each: 20 s of prefill if nobody stops it
    router, prefill, decode = sglang_router(procs, time_scale=1.0, bootstrap_timeout_s=60,
                                            prefill_s_per_token=0.001)
    body = orjson.dumps({"model": MODEL, "prompt": "abcd" * 20_000, "max_tokens": 5})
    with hanging_client(router.url, "/v1/completions", body, stream=False):
        wait_for("the prefill to start", lambda: prefill.metric("sglang:num_running_reqs"))
    wait_for("the prefill to stop after the client hung up",
             lambda: not (prefill.metric("sglang:num_running_reqs")
                          or router.metric("toposerve_router_endpoint_inflight")))
    assert decode.metric("sglang:num_running_reqs") == 0


def test_kv_pull_priced_by_topology_tier(procs: Procs) -> None:
    """A decode server pulls a remote prefill's KV in the time the shared
    topology model gives for the tier the two nodes share: NVLink within a
    GB200 NVL72 domain, the zone's network across blocks."""
    here: dict[str, Any] = {"zone": "z1", "block": "b1", "rack": "r1", "nvlink_domain": "nvl1"}
    prefill = procs.sim(time_scale=1.0, node="tray-1", **here)
    near = procs.sim(time_scale=1.0, node="tray-2", **here)
    far = procs.sim(time_scale=1.0, node="tray-9", zone="z1", block="b2", rack="r7",
                    nvlink_domain="nvl7")
    prompt = "kv " * 8000
    r = httpx.post(prefill.url + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": prompt, "max_tokens": 1, "kv_transfer_params": {
            "do_remote_decode": True, "do_remote_prefill": False}})
    assert r.status_code == 200, r.text
    params = r.json()["kv_transfer_params"]
    src = DomainPath(host="tray-1", zone="z1", block="b1", rack="r1", nvlink="nvl1")
    assert params["toposerve_place"] == src.model_dump()
    links = load_profile("gb200-nvl72").links()
    n_bytes = len(prompt.encode()) // BYTES_PER_TOKEN * 327_680  # the byte tokenizer
    expected: dict[Tier, float] = {}
    for sim, tier in ((near, Tier.NVLINK), (far, Tier.ZONE)):
        r = httpx.post(sim.url + "/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": prompt, "max_tokens": 2, "kv_transfer_params": params})
        assert r.status_code == 200, r.text
        c = sim.counters()
        assert c["vllm:nixl_bytes_transferred_sum"] == n_bytes
        assert (f'toposerve_sim_kv_pulls_total{{tier="{tier.name.lower()}"}} 1.0'
                in httpx.get(sim.url + "/metrics").text)
        link = links[tier]
        expected[tier] = link.latency_us * 1e-6 + n_bytes / (link.bandwidth_gbps * 1e9)
        assert abs(c["vllm:nixl_xfer_time_seconds_sum"] - expected[tier]) < 1e-9
        # the pull is part of the decode's time to first token
        assert c["vllm:time_to_first_token_seconds_sum"] >= expected[tier]
    assert expected[Tier.ZONE] > 20 * expected[Tier.NVLINK]
    # KV a decode server holds already is not pulled again
    r = httpx.post(far.url + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": prompt, "max_tokens": 2, "kv_transfer_params": params})
    assert r.status_code == 200, r.text
    assert far.counters()["vllm:nixl_bytes_transferred_sum"] == n_bytes
    ttft_near, ttft_far = (s.counters()["vllm:time_to_first_token_seconds_sum"]
                           for s in (near, far))
    assert ttft_far - ttft_near > 0.8 * (expected[Tier.ZONE] - expected[Tier.NVLINK])
    r = httpx.post(near.url + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": "x", "max_tokens": 2,
        "kv_transfer_params": {**params, "toposerve_place": {"rack": 3}}})
    assert r.status_code == 400 and "toposerve_place" in r.json()["error"]["message"]


def test_decode_pairs_within_nvlink_domain(procs: Procs) -> None:
    """Static endpoints placed in two NVLink domains: every split request
    decodes in its prefill's domain, and its KV moves over NVLink."""
    domains = ("nvl1", "nvl2")
    outer: dict[str, Any] = {"zone": "z1", "block": "b1"}
    prefill = [procs.sim(time_scale=0.01, node=f"p-{d}", nvlink_domain=d, rack=d, **outer)
               for d in domains]
    decode = [procs.sim(time_scale=0.01, node=f"d-{d}", nvlink_domain=d, rack=d, **outer)
              for d in domains]
    static = [{"url": s.url, "role": role, "node": f"{role[0]}-{d}", "nvlinkDomain": d,
               "rack": d, **outer} for role, sims in (("prefill", prefill), ("decode", decode))
              for s, d in zip(sims, domains, strict=True)]
    router = procs.router({"discovery": {"static": static}, "disaggregation": {"enabled": True}})
    domain_of = {s.url[7:]: d for sims in (prefill, decode)
                 for s, d in zip(sims, domains, strict=True)}
    assert paired_within(router, domain_of, 10) == set(domains)
    metrics = httpx.get(router.url + "/metrics").text
    assert 'toposerve_router_pd_pairs_total{tier="nvlink"} 10.0' in metrics
    nvlink = load_profile("gb200-nvl72").links()[Tier.NVLINK]
    for s in decode:
        c = s.counters()
        pulls = c["vllm:nixl_xfer_time_seconds_count"]
        assert pulls > 0
        # every pull at NVLink speed (scaled): none crossed between domains
        per_byte = 0.01 / (nvlink.bandwidth_gbps * 1e9)
        assert c["vllm:nixl_xfer_time_seconds_sum"] <= (
            c["vllm:nixl_bytes_transferred_sum"] * per_byte + pulls * 0.01 * 1e-3)


def test_little_to_prefill_runs_whole_on_decode(procs: Procs) -> None:
    """With minPrefillTokens, a short prompt skips the split; so does a long
    one whose prefix a prefill endpoint holds already (what is left to
    prefill is short), and a decode endpoint prefills it itself."""
    prefill = [procs.sim(time_scale=0.01)]
    decode = [procs.sim(time_scale=0.01)]
    router = pd_router(procs, prefill, decode,
                       disaggregation={"enabled": True, "minPrefillTokens": 500})
    decode_names = {s.url[7:] for s in decode}

    def ask(prompt: str) -> httpx.Response:
        r = httpx.post(router.url + "/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": prompt, "max_tokens": 3})
        assert r.status_code == 200, r.text
        assert r.headers["x-toposerve-endpoint"] in decode_names
        return r

    assert "x-toposerve-prefill-endpoint" not in ask("a short question").headers
    document = "A long shared document. " * 400  # about 2,400 tokens
    assert "x-toposerve-prefill-endpoint" in ask(document + "First question?").headers
    assert "x-toposerve-prefill-endpoint" not in ask(document + "Second question?").headers
    metrics = httpx.get(router.url + "/metrics").text
    assert 'toposerve_router_disaggregation_total{outcome="whole"} 2.0' in metrics
    assert 'toposerve_router_disaggregation_total{outcome="split"} 1.0' in metrics
    # the prefill endpoint saw the one split request only
    assert prefill[0].counters()["vllm:request_success_total"] == 1


def test_prefill_chunks_stall_decode_when_asked(procs: Procs) -> None:
    """With --prefill-stalls-decode a sequence's decode waits while another
    request's prefill chunks run on the same server; without it, it does not."""
    async def decode_time(sim: Proc) -> float:
        async with httpx.AsyncClient(timeout=30) as c:
            async def decode() -> float:
                t0 = time.monotonic()
                r = await c.post(sim.url + "/v1/completions", json={
                    "model": MODEL, "prompt": "go", "max_tokens": 21})
                assert r.status_code == 200, r.text
                return time.monotonic() - t0

            async def prefill() -> None:
                await asyncio.to_thread(  # once the first request decodes
                    wait_for, "the first request to decode",
                    lambda: sim.metric("vllm:num_requests_running") >= 1, 10, 0.005)
                r = await c.post(sim.url + "/v1/completions", json={
                    "model": MODEL, "prompt": "x" * 4 * 8000, "max_tokens": 1})
                assert r.status_code == 200, r.text

            took, _ = await asyncio.gather(decode(), prefill())
            return took

    # 20 decode steps of 20 ms, against one 8,000-token prefill of 0.4 s
    flags: dict[str, Any] = {"time_scale": 1.0, "decode_s_per_token": 0.02,
                             "decode_slowdown_per_seq": 0.0, "prefill_s_per_token": 0.00005,
                             "overhead_s": 0.0}
    free = asyncio.run(decode_time(procs.sim(**flags)))
    stalled = asyncio.run(decode_time(procs.sim(**flags, prefill_stalls_decode=True)))
    assert free < 0.7  # 0.4 s of decode, not held up (held up it would be 0.8 s)
    assert stalled > free + 0.25  # held up by most of the 0.4 s prefill
