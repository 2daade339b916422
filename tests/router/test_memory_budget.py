"""The router's memory has a byte budget: request bodies in flight, the
requests themselves, the Responses store (bytes, TTL swept in the
background, chains stored as linked turns), session ids, oversized
headers. Each against a real router process (and a real redis-server)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path

import httpx
import openai
import pytest
import redis
from openai._models import FinalRequestOptions

from harness.procs import MODEL, Procs
from harness.waiting import wait_for
from tests.router.hangup import connect
from toposerve.router.config import ResponsesStoreConfig
from toposerve.router.http.handlers import session_key
from toposerve.router.responses.store import MemoryStore, RedisStore
from toposerve.wire.errors import ApiError

CHAT = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}


def _chat(client: openai.OpenAI, content: str = "hi") -> object:
    return client.chat.completions.create(model=MODEL, max_tokens=2,
                                          messages=[{"role": "user", "content": content}])


def _hold(url: str, declared: int, sent: int) -> socket.socket:
    """A request whose body stops after ``sent`` of its ``declared`` bytes."""
    s = connect(url, 10)
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
              f"Content-Type: application/json\r\nContent-Length: {declared}\r\n\r\n".encode()
              + b" " * sent)
    return s


def test_bodies_in_flight_have_a_byte_budget(procs: Procs) -> None:
    """One body held half-read takes its bytes of maxInflightBytes: the next
    whose Content-Length does not fit gets 429 with Retry-After at once (the
    SDK would wait that long); freed, it goes through."""
    sim = procs.sim()
    router = procs.router({"server": {"maxBodyBytes": 2 * 2**20, "maxInflightBytes": 3 * 2**20}},
                          endpoints=[sim.url])
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    held = _hold(router.url, 2 * 2**20, 2 * 2**20 - 10)

    def refused() -> openai.RateLimitError | None:
        try:
            _chat(client, "a" * (3 * 2**19))  # 1.5 MiB
        except openai.RateLimitError as err:
            return err
        return None

    err = wait_for("the held body counted", refused)
    assert err is not None
    assert err.response.headers["retry-after"] == "1"
    assert "maxInflightBytes" in err.response.json()["error"]["message"]
    wait = client._calculate_retry_timeout(1, FinalRequestOptions(method="post", url="/x",
                                                                  max_retries=2),
                                           err.response.headers)
    assert wait == 1.0  # the SDK honours it
    held.close()
    wait_for("the held body's bytes given back", lambda: refused() is None)


def test_a_body_over_the_default_limit_is_refused_unread(procs: Procs) -> None:
    """The default limit (8 MiB) holds a 1M-token prompt; a 60 MiB body is
    refused by its Content-Length before a byte of it is read."""
    sim = procs.sim()
    router = procs.router(endpoints=[sim.url])
    with _hold(router.url, 60 * 2**20, 0) as s:
        answer = s.recv(4096)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:100]
    assert b"maxBodyBytes" in answer


def test_requests_in_flight_have_a_budget_the_sdk_retries_after(procs: Procs) -> None:
    """maxInflightRequests held: the next gets 429 with Retry-After: 1; the
    official SDK waits that second and its retry goes through."""
    sim = procs.sim()
    router = procs.router({"server": {"maxInflightRequests": 2}}, endpoints=[sim.url])
    held = [_hold(router.url, 1000, 10) for _ in range(2)]
    def refused() -> httpx.Response | None:
        r = httpx.post(router.url + "/v1/chat/completions", json=CHAT)
        return r if r.status_code == 429 else None

    r = wait_for("two requests held", refused)
    assert r is not None
    assert r.headers["retry-after"] == "1"
    assert "maxInflightRequests" in r.json()["error"]["message"]
    assert httpx.get(router.url + "/health").status_code == 200  # probes are not counted

    def release() -> None:
        for s in held:
            s.close()

    threading.Timer(0.3, release).start()
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=2)
    t0 = time.monotonic()
    assert _chat(client)
    assert time.monotonic() - t0 >= 1.0  # it waited the Retry-After


def test_memory_store_drops_oldest_by_bytes(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router({"responses": {"maxBytes": 300_000}}, endpoints=[sim.url])
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    ids = [client.responses.create(model=MODEL, input=f"{n}" + "x" * 100_000,
                                   max_output_tokens=2).id for n in range(5)]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(ids[0])
    assert client.responses.retrieve(ids[-1]).id == ids[-1]


def test_memory_store_sweeps_expired_turns_unread() -> None:
    cfg = ResponsesStoreConfig.model_validate({"ttlSeconds": 0.05, "sweepIntervalSeconds": 0.05})

    async def run() -> None:
        store = MemoryStore(cfg)
        await store.put("resp_a", {"input": "x" * 1000}, "t")
        await store.put("resp_b", {"input": "y" * 1000}, "t")
        assert store.bytes > 2000
        task = asyncio.create_task(store.run())
        try:
            for _ in range(100):
                if store.bytes == 0:
                    break
                await asyncio.sleep(0.02)
            assert store.bytes == 0  # nobody read them
        finally:
            task.cancel()

    asyncio.run(run())


def test_redis_chain_stores_each_turn_once(procs: Procs, redis_url: str) -> None:
    """Each turn's key holds its own input, not the conversation so far, and
    continuing the chain keeps its earlier turns as long as the newest."""
    sim = procs.sim()
    cfg = {"responses": {"backend": "redis", "redisUrl": redis_url, "ttlSeconds": 60,
                         "allowUnauthenticated": True, "maxChainTurns": 3}}
    router = procs.router(cfg, endpoints=[sim.url])
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    r = redis.Redis.from_url(redis_url)
    prev: str | None = None
    ids, usage = [], []
    for n in range(4):  # a chain of 3 read, then the fourth turn
        resp = client.responses.create(model=MODEL, input=f"turn {n} " + "z" * 50_000,
                                       max_output_tokens=2, previous_response_id=prev)
        assert resp.previous_response_id == prev
        assert resp.usage is not None
        prev = resp.id
        ids.append(resp.id)
        usage.append(resp.usage.input_tokens)
    assert usage == sorted(set(usage))  # the model saw the whole conversation
    for rid in ids:
        assert r.strlen(f"toposerve:response:{rid}") < 120_000  # not 3 x 50 KB
    assert r.pttl(f"toposerve:response:{ids[0]}") > 50_000  # refreshed by the later turns
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=MODEL, input="a fifth", previous_response_id=ids[-1],
                                max_output_tokens=2)
    assert "maxChainTurns" in err.value.message


def test_ids_are_minted_and_never_overwritten(procs: Procs, redis_url: str) -> None:
    """The id a client sees is the router's (the upstream's is 32 hex
    digits); the store refuses a write over any existing turn."""
    sim = procs.sim()
    router = procs.router({"responses": {"backend": "redis", "redisUrl": redis_url,
                                         "allowUnauthenticated": True}},
                          endpoints=[sim.url])
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    plain = client.responses.create(model=MODEL, input="a", max_output_tokens=2)
    streamed = [e for e in client.responses.create(model=MODEL, input="b", max_output_tokens=2,
                                                   stream=True)
                if e.type in ("response.created", "response.completed")]
    for rid in (plain.id, streamed[0].response.id):
        assert rid.startswith("resp_") and len(rid) == 5 + 48
    assert streamed[0].response.id == streamed[1].response.id
    assert client.responses.retrieve(streamed[1].response.id).id == streamed[1].response.id

    async def overwrite() -> None:
        store = RedisStore(redis_url, 60)
        try:
            await store.put("resp_same", {"input": "red's"}, "red")
            with pytest.raises(ApiError):
                await store.put("resp_same", {"input": "blue's"}, "blue")
            assert (await store.get("resp_same", "red") or {}).get("input") == "red's"
        finally:
            await store.close()

    asyncio.run(overwrite())


def test_long_session_ids_are_kept_hashed(procs: Procs) -> None:
    """A session id of the most bytes it may have (256; a longer one is a
    400, tests/router/test_client_input.py) sticks as a short one does (two
    endpoints, same answerer every time)."""
    sims = [procs.sim() for _ in range(2)]
    router = procs.router(endpoints=[s.url for s in sims])
    heads = {"x-session-id": "s" * 256}
    where = {httpx.post(router.url + "/v1/chat/completions", json=CHAT, headers=heads,
                        timeout=30).headers["x-toposerve-endpoint"] for _ in range(4)}
    assert len(where) == 1


def test_session_ids_are_hashed_to_32_chars() -> None:
    a, b = session_key("s" * 8000), session_key("t" * 8000)
    assert len(a) == 32 and a != b and session_key("s" * 8000) == a


def test_an_oversized_header_is_a_json_error_and_no_secret_is_logged(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router(endpoints=[sim.url])
    secret = "sk-secret-" + "k" * 9000
    for size in (9000, 100_000):
        token = (secret * 20)[:size]
        with connect(router.url, 10) as s:
            s.sendall(f"GET /v1/models HTTP/1.1\r\nHost: x\r\n"
                      f"Authorization: Bearer {token}\r\n\r\n".encode())
            answer = b""
            while b"\r\n\r\n" not in answer or not answer.endswith((b"}", b"\n")):
                chunk = s.recv(65536)
                if not chunk:
                    break
                answer += chunk
        head, _, body = answer.partition(b"\r\n\r\n")
        if size == 9000:  # the router's own answer
            assert head.startswith(b"HTTP/1.1 431"), head
            assert "Authorization" in json.loads(body)["error"]["message"]
            assert json.loads(body)["error"]["type"] == "RequestHeaderFieldsTooLarge"
            assert b"sk-secret" not in body
        else:  # over the parser's limit: refused before any handler, still in JSON
            assert head.split(b" ")[1] == b"400", head  # HTTP/1.0: nothing was parsed
            assert b"application/json" in head, head
            assert "too long" in json.loads(body)["error"]["message"]
            assert b"sk-secret" not in body
    assert httpx.get(router.url + "/health").status_code == 200
    wait_for("the malformed request logged", lambda: "malformed HTTP" in router.log.read_text())
    assert "sk-secret" not in Path(router.log).read_text()


def test_delete_input_items_and_model_retrieve(procs: Procs, tmp_path: Path) -> None:
    """The SDK's responses.delete, responses.input_items.list and
    models.retrieve, each scoped to the tenant of the key."""
    import yaml

    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"apiVersion": "toposerve.io/v1", "kind": "APIKeys",
                                    "tenants": {"red": ["sk-red"], "blue": ["sk-blue"]}}))
    sim = procs.sim()
    router = procs.router({"flowControl": {"tenants": {"keys": {"file": str(keys)}}}},
                          endpoints=[sim.url])
    red, blue = (openai.OpenAI(base_url=router.url + "/v1", api_key=k, max_retries=0)
                 for k in ("sk-red", "sk-blue"))
    assert red.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        red.models.retrieve("no/such-model")
    first = red.responses.create(model=MODEL, input="first words", max_output_tokens=2)
    second = red.responses.create(
        model=MODEL, previous_response_id=first.id, max_output_tokens=2,
        input=[{"role": "user", "content": "second"}, {"role": "user", "content": "third"}])
    items = list(red.responses.input_items.list(second.id, order="asc"))
    assert [i.content[0].text for i in items] == ["second", "third"]  # type: ignore[union-attr,index]
    assert [i.type for i in items] == ["message", "message"]
    assert len(list(red.responses.input_items.list(second.id, limit=1))) == 2  # paged
    for call in (lambda: blue.responses.input_items.list(first.id),
                 lambda: blue.responses.delete(first.id)):
        with pytest.raises(openai.NotFoundError):
            call()
    red.responses.delete(second.id)
    with pytest.raises(openai.NotFoundError):
        red.responses.retrieve(second.id)
    with pytest.raises(openai.NotFoundError):
        red.responses.delete(second.id)
    assert red.responses.retrieve(first.id).id == first.id


def test_a_stored_turn_holds_about_its_own_bytes() -> None:
    """The byte budget counts each turn's encoded length; what the store
    keeps must be about that. orjson's result keeps the buffer it sized for
    the worst case: a 1 MiB turn held 16 MiB, so a 64 MiB store grew the
    router by 250 MiB over 240 turns."""
    import tracemalloc

    store = MemoryStore(ResponsesStoreConfig())
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        asyncio.run(store.put("resp_big", {"input": "y" * (1 << 20)}, "t"))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert store.bytes > 1 << 20
    assert held < 2 * store.bytes, held
