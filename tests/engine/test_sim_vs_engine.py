"""The simulator held to the engine: the same requests to one of the tier's
real vLLM servers and to ``toposerve sim`` (started with the same model
name, tokenizer, chat template, block size, cache size and KV-event
encoding), and what the router and its users read of the answers compared:
the JSON of chat, completions and Responses, streamed and not (the chunks
by kind, their order, usage with ``prompt_tokens_details``), /v1/models,
/tokenize, refused and odd requests (status, content type, error body),
the /metrics series the router scrapes and the tests and benchmarks count,
and the KV events of one prompt over ZMQ. Every difference found must be
one of ``sim_vs_engine.DIFFERENCES``, and every one listed must still be
found."""

from __future__ import annotations

import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import httpx
import msgpack
import orjson
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from harness.procs import Procs
from harness.vllm import BLOCK_SIZE, MAX_MODEL_LEN, MAX_NUM_SEQS, MODEL, VllmServer
from tests.engine.sim_vs_engine import DIFFERENCES, differences, flatten
from toposerve.localcluster.ports import free_port
from toposerve.router.pool.scrape import CACHE_INFO, KV_USAGE, RUNNING, START_TIME, WAITING

pytestmark = pytest.mark.engine
FIXED = {"ignore_eos": True}  # random weights: the end-of-sequence token may come at any step
TEXT = "Simulator and engine, side by side: the quick brown fox jumps over the lazy dog. "
# a text no other test of the tier sends, so neither server has it cached
CHAT = [{"role": "user", "content": "chat " + TEXT * 4}]
# the series the router scrapes, and the ones the tier and benchmarks count
METRICS = sorted({*WAITING, *RUNNING, *KV_USAGE, CACHE_INFO, START_TIME} - {
    "sglang:num_queue_reqs", "sglang:num_running_reqs", "sglang:token_usage",
    "vllm:gpu_cache_usage_perc"} | {
    "vllm:prefix_cache_queries", "vllm:prefix_cache_hits", "vllm:prompt_tokens",
    "vllm:generation_tokens", "vllm:request_success", "vllm:time_to_first_token_seconds"})
ROUTER_QUERY: list[tuple[str, str | int | float | bool | None]] = [
    ("name[]", n) for n in sorted({*WAITING, *RUNNING, *KV_USAGE, CACHE_INFO, START_TIME})]
EVICTING_PROMPTS = 8  # of ~1,700 tokens: past the cache's 8,192 tokens within 5
# (where, path, body): each sent to both servers in this order; the second
# of a pair finds the first's prompt cached on both
REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("chat", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 3, **FIXED}),
    ("chat stream", "/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True}, **FIXED}),
    ("completion", "/v1/completions", {"prompt": "completion " + TEXT * 4, "max_tokens": 3,
                                       **FIXED}),
    ("completion stream", "/v1/completions", {
        "prompt": "completion " + TEXT * 4, "max_tokens": 3, "stream": True,
        "stream_options": {"include_usage": True}, **FIXED}),
    ("responses", "/v1/responses", {"input": "responses " + TEXT * 4,
                                    "max_output_tokens": 3}),
    ("responses stream", "/v1/responses", {"input": "responses " + TEXT * 4,
                                           "max_output_tokens": 3, "stream": True}),
    ("tokenize prompt", "/tokenize", {"prompt": "tokenize " + TEXT}),
    ("tokenize chat", "/tokenize", {"messages": CHAT}),
    ("unknown model", "/v1/chat/completions", {"messages": CHAT, "model": "no-such-model",
                                               "max_tokens": 2}),
    ("prompt over the context", "/v1/completions", {"prompt": "word " * MAX_MODEL_LEN,
                                                    "max_tokens": 2}),
    ("temperature a string", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2,
                                                      "temperature": "hot"}),
    ("n 2", "/v1/completions", {"prompt": "n " + TEXT, "max_tokens": 2, "n": 2, **FIXED}),
    ("token-id prompt", "/v1/completions", {"prompt": [11, 12, 13, 14], "max_tokens": 2,
                                            **FIXED}),
    ("prompt batch", "/v1/completions", {"prompt": ["batch one", "batch two"],
                                         "max_tokens": 2, **FIXED}),
]


def ids(tokens: list[int]) -> str:
    """Token ids as a short, comparable leaf."""
    return f"{len(tokens)} ids, crc32 {zlib.crc32(orjson.dumps(tokens))}"


def chunk_kind(where: str, data: dict[str, Any]) -> str:
    if "responses" in where:
        return str(data.get("type"))
    if not data.get("choices"):
        return "usage"
    choice = data["choices"][0]
    if "role" in (choice.get("delta") or {}):
        return "role"
    return "finish" if choice.get("finish_reason") else "token"


def stream(where: str, body: str) -> dict[str, str]:
    """An SSE answer: its events' kinds in order (repeats as one), how each
    is framed, and each kind's chunks flattened under its name."""
    out: dict[str, str] = {}
    kinds: list[str] = []
    framing: set[str] = set()
    for block in body.split("\n\n"):
        if not block.strip():
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        framing.add("+".join(sorted(fields)))
        if fields["data"] == "[DONE]":
            kinds.append("[DONE]")
            continue
        data = orjson.loads(fields["data"])
        kind = chunk_kind(where, data)
        if "event" in fields and fields["event"] != kind:
            kind += f" (event: {fields['event']})"
        if not kinds or kinds[-1] != kind:
            kinds.append(kind)
        for p, leaf_ in flatten(data, kind).items():
            out[p] = leaf_ if out.get(p, leaf_) == leaf_ else "|".join(sorted({out[p], leaf_}))
    out["events"] = " ".join(kinds)
    out["framing"] = " ".join(sorted(framing))
    return out


def answer(where: str, r: httpx.Response) -> dict[str, str]:
    out = {"status_code": f"int {r.status_code}", "content_type": r.headers.get("content-type",
                                                                                  "absent")}
    if out["content_type"].startswith("text/event-stream"):
        return out | stream(where, r.text)
    body = r.json()
    out |= flatten(body, "body")
    if isinstance(body, dict) and isinstance(body.get("tokens"), list):
        out["body.tokens"] = ids(body["tokens"])
    return out


def metrics(url: str) -> dict[str, str]:
    """Each series of METRICS: its type, its labels, and the cache config's
    block size and count; and which series the router's name[] query gets."""
    out: dict[str, str] = {}
    families = {f.name: f for f in text_string_to_metric_families(httpx.get(
        url + "/metrics", timeout=30).text)}
    for name in METRICS:
        fam = families.get(name)
        if fam is None:
            continue
        labels = sorted({k for s in fam.samples for k in s.labels} - {"le"})
        out[name] = f"{fam.type} {{{','.join(labels)}}}"
        if name == CACHE_INFO:
            for s in fam.samples:
                out |= {f"{name}.{k}": s.labels[k] for k in ("block_size", "num_gpu_blocks")
                        if k in s.labels}
    queried = {f.name for f in text_string_to_metric_families(httpx.get(
        url + "/metrics", params=ROUTER_QUERY, timeout=30).text)}
    asked = {n for _, n in ROUTER_QUERY}
    out["the router's name[] query"] = ("the named series" if queried <= asked else
                                        f"every series ({len(queried)} families)")
    return out


def kv_events(endpoint: str, url: str, prompt: str) -> dict[str, str]:
    """The KV events of one new prompt: the frames, the batch, the fields of
    its BlockStored events and the token ids its stored blocks hold."""
    sub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    try:
        time.sleep(0.5)  # the subscription reaches the publisher before the events
        httpx.post(url + "/v1/completions", timeout=60, json={
            "model": MODEL, "prompt": prompt, "max_tokens": 3, **FIXED}).raise_for_status()
        frames: list[list[bytes]] = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and sub.poll(500):
            frames.append(sub.recv_multipart())
    finally:
        sub.close()
    assert frames, f"no KV events from {endpoint}"
    out: dict[str, str] = {
        "frames": " ".join(sorted({f"{len(f)} frames" for f in frames})),
        "topic": " ".join(sorted({f[0].decode() for f in frames})),
        "sequence number": " ".join(sorted({f"{len(f[1])} bytes" for f in frames}))}
    stored: list[int] = []
    for f in frames:
        ts, events, *rest = msgpack.unpackb(f[2], raw=False, strict_map_key=False)
        out |= {"batch": f"[ts, events, {len(rest)} more]", "batch ts": type(ts).__name__}
        out |= flatten(rest, "batch rest")
        # the prompt's stores: the simulator evicts nothing here, and vLLM
        # may still be sending its reset's AllBlocksCleared
        for e in events:
            if not isinstance(e, dict):
                out |= flatten(e, "array event")
            elif e.get("type") == "BlockStored":
                out |= flatten(e, "BlockStored")
                stored += e["token_ids"]
    out["BlockStored.token_ids (all)"] = ids(stored)
    return out


def empty(url: str) -> httpx.Response:
    """POST /reset_prefix_cache, and a one-token request without a full
    block after it: vLLM publishes its AllBlocksCleared with its next step."""
    reset = httpx.post(url + "/reset_prefix_cache", timeout=30)
    httpx.post(url + "/v1/completions", timeout=30, json={
        "model": MODEL, "prompt": "hi", "max_tokens": 1}).raise_for_status()
    return reset


def evictions(endpoint: str, url: str) -> dict[str, str]:
    """From an empty cache, filled past its size with new prompts, then
    reset: the first BlockRemoved event (and whether it names blocks stored
    meanwhile), the reset's answer, and the AllBlocksCleared that follows."""
    empty(url)
    sub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    events: list[dict[str, Any]] = []

    def read(until: str, timeout: float = 15) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and sub.poll(200):
            events.extend(e for e in msgpack.unpackb(sub.recv_multipart()[2], raw=False,
                                                     strict_map_key=False)[1]
                          if isinstance(e, dict))
            if any(e.get("type") == until for e in events):
                return True
        return any(e.get("type") == until for e in events)

    out: dict[str, str] = {}
    try:
        time.sleep(0.5)  # the subscription reaches the publisher before the events
        salt = uuid.uuid4().hex[:8]
        for i in range(EVICTING_PROMPTS):  # ~53 blocks each, new: the cache overflows
            httpx.post(url + "/v1/completions", timeout=120, json={
                "model": MODEL, "prompt": f"[{salt} {i}] " + "word " * 1700, "max_tokens": 1,
                **FIXED}).raise_for_status()
            if read("BlockRemoved", timeout=2):
                break
        stored = {h for e in events if e.get("type") == "BlockStored"
                  for h in e["block_hashes"]}
        removed = next((e for e in events if e.get("type") == "BlockRemoved"), None)
        out["a prompt evicts"] = (f"the prompt {i + 1} of 1,700 tokens" if removed
                                  else f"none of {EVICTING_PROMPTS}")
        if removed is not None:
            out |= flatten(removed, "BlockRemoved")
            out["BlockRemoved names stored blocks"] = str(set(removed["block_hashes"]) <= stored)
        reset = empty(url)
        out |= {"reset status": str(reset.status_code)} | flatten(reset.json(), "reset")
        out["AllBlocksCleared"] = "sent" if read("AllBlocksCleared") else "never sent"
        out |= flatten(next((e for e in events if e.get("type") == "AllBlocksCleared"), {}),
                       "AllBlocksCleared")
    finally:
        sub.close()
    return out


def observe(url: str, kv_endpoint: str) -> dict[str, dict[str, str]]:
    seen: dict[str, dict[str, str]] = {}
    for where, path, body in REQUESTS:
        r = httpx.post(url + path, json={"model": MODEL, **body}, timeout=60)
        seen[where] = answer(where, r)
    seen["models"] = answer("models", httpx.get(url + "/v1/models", timeout=30))
    seen["metrics"] = metrics(url)
    seen["kv events"] = kv_events(kv_endpoint, url, "events " + TEXT * 3)
    seen["kv evictions"] = evictions(kv_endpoint, url)
    return seen


def test_the_simulator_answers_as_vllm_does(engines: list[VllmServer], model_dir: Path,
                                            procs: Procs) -> None:
    engine, kv_port = engines[0], free_port()
    # vLLM sizes its cache from --kv-cache-memory-bytes; the simulator is given its count
    blocks = metrics(engine.url)[f"{CACHE_INFO}.num_gpu_blocks"]
    sim = procs.sim(model=MODEL, tokenizer=model_dir / "tokenizer.json",
                    block_size=BLOCK_SIZE, max_model_len=MAX_MODEL_LEN, num_gpu_blocks=blocks,
                    max_num_seqs=MAX_NUM_SEQS, kv_events_port=kv_port,
                    kv_events_encoding="map", kv_events_topic="kv-events")
    # as empty as the new simulator's: the tier's earlier tests filled the cache
    engine.reset_cache()
    vllm_seen = observe(engine.url, engine.kv_events)
    sim_seen = observe(sim.url, f"tcp://127.0.0.1:{kv_port}")
    print("[engine] evictions, vLLM:", vllm_seen["kv evictions"])
    print("[engine] evictions, simulator:", sim_seen["kv evictions"])
    found = set().union(*(differences(where, vllm_seen[where], sim_seen[where])
                          for where in vllm_seen))
    new = sorted(d for d in found if not any(a.allows(d) for a in DIFFERENCES))
    gone = [a for a in DIFFERENCES if not any(a.allows(d) for d in found)]
    assert not new and not gone, (
        "new differences (fix the simulator, or add each to DIFFERENCES with a reason):\n"
        + "\n".join(f"    Difference{d!r}," for d in new)
        + "\nlisted but no longer found:\n" + "\n".join(map(repr, gone)))
