"""The simulator's /tokenize and /detokenize, as vLLM serves them: the ids a
router gets there are the ids the engine caches and reports in its KV
events, which is what KV-aware routers (vllm-router's ``kv_aware``) key
their index by."""

from __future__ import annotations

import httpx
import msgpack
import pytest
import zmq

from harness.procs import MODEL, Procs
from harness.waiting import wait_for
from toposerve.localcluster.ports import free_port
from toposerve.wire.tokens import ByteTokenizer

MESSAGES = [{"role": "system", "content": "You are terse. " * 40},
            {"role": "user", "content": "Name three primes."}]


def test_tokenize_gives_the_ids_the_kv_events_carry(procs: Procs) -> None:
    pub = free_port()
    sim = procs.sim(kv_events_port=pub, kv_events_encoding="map", time_scale=0.01)
    sub: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.RCVTIMEO, 5000)
    sub.connect(f"tcp://127.0.0.1:{pub}")
    probes = iter(range(1000))

    def subscribed() -> bool:
        # a PUB socket drops what it sends before the subscription reaches
        # it: prompts of their own until one's events come through
        httpx.post(sim.url + "/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": f"probe {next(probes)} " * 20, "max_tokens": 1})
        return bool(sub.poll(100))

    try:
        wait_for("the subscription to reach the publisher", subscribed)
        r = httpx.post(sim.url + "/v1/chat/completions", timeout=30,
                       json={"model": MODEL, "messages": MESSAGES, "max_tokens": 1})
        assert r.status_code == 200, r.text
        while True:  # past the probes' batches, to this request's
            _, _, payload = sub.recv_multipart()
            _, events, _ = msgpack.unpackb(payload)
            stored = [e for e in events if e["type"] == "BlockStored"]
            if stored and "probe" not in ByteTokenizer().decode(stored[0]["token_ids"]):
                break
    finally:
        sub.close(linger=0)
    # every field of current vLLM's map encoding is there, as strict decoders want
    assert set(stored[0]) == {"type", "block_hashes", "parent_block_hash", "token_ids",
                              "block_size", "lora_id", "medium", "lora_name", "extra_keys",
                              "group_idx"}
    cached = [t for e in stored for t in e["token_ids"]]
    tok = httpx.post(sim.url + "/tokenize", json={"model": MODEL, "messages": MESSAGES}).json()
    assert tok["count"] == len(tok["tokens"]) == r.json()["usage"]["prompt_tokens"]
    assert len(cached) == tok["count"] // 16 * 16 > 0  # full blocks only
    assert tok["tokens"][:len(cached)] == cached
    assert tok["max_model_len"] > 0 and tok["token_strs"] is None


def test_tokenize_a_prompt_and_back(procs: Procs) -> None:
    sim = procs.sim()
    prompt = "naïve café, 42 ✓"
    tok = httpx.post(sim.url + "/tokenize", json={"prompt": prompt}).json()
    done = httpx.post(sim.url + "/v1/completions", timeout=30,
                      json={"model": MODEL, "prompt": prompt, "max_tokens": 1}).json()
    assert tok["count"] == done["usage"]["prompt_tokens"]
    back = httpx.post(sim.url + "/detokenize", json={"model": MODEL, "tokens": tok["tokens"]})
    assert back.status_code == 200 and back.json() == {"prompt": prompt}


@pytest.mark.parametrize("path, body, status, fragment", [
    ("/tokenize", {"model": MODEL}, 400, "either prompt or messages"),
    ("/tokenize", {"prompt": "a", "messages": MESSAGES}, 400, "either prompt or messages"),
    ("/tokenize", {"prompt": 7}, 400, "prompt"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/tokenize", {"model": "nope", "prompt": "a"}, 404, "does not exist"),
    ("/detokenize", {"tokens": [-1]}, 400, "32-bit"),
    ("/detokenize", {"tokens": "abc"}, 400, "tokens"),
])
def test_tokenize_refuses_bad_input(procs: Procs, path: str, body: dict[str, object],
                                    status: int, fragment: str) -> None:
    sim = procs.sim()
    r = httpx.post(sim.url + path, json=body)
    assert r.status_code == status and fragment in r.json()["error"]["message"], r.text


def test_unknown_paths_and_methods_answer_as_fastapi_does(procs: Procs) -> None:
    """vLLM and SGLang serve with FastAPI: a path it does not route is 404
    and a method it does not take 405, each with a JSON ``detail``."""
    sim = procs.sim()
    r = httpx.get(sim.url + "/v1/nothing")
    assert r.status_code == 404 and r.json() == {"detail": "Not Found"}, r.text
    r = httpx.get(sim.url + "/v1/chat/completions")
    assert r.status_code == 405 and r.json() == {"detail": "Method Not Allowed"}, r.text
