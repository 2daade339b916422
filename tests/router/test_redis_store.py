"""The Responses store on a real redis-server: two routers (a hot-standby
pair) share one chain, so either can continue what the other started."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import openai
import pytest
import redis

from harness import redis_proc
from harness.procs import MODEL, Procs
from toposerve.localcluster.processes import end_process


def test_chain_continues_on_the_standby(procs: Procs, redis_url: str) -> None:
    sims = [procs.sim() for _ in range(2)]
    cfg = {"responses": {"backend": "redis", "redisUrl": redis_url, "ttlSeconds": 60}}
    active = procs.router(cfg, endpoints=[s.url for s in sims])
    standby = procs.router(cfg, endpoints=[s.url for s in sims])
    a = openai.OpenAI(base_url=active.url + "/v1", api_key="x", max_retries=0)
    b = openai.OpenAI(base_url=standby.url + "/v1", api_key="x", max_retries=0)
    r1 = a.responses.create(model=MODEL, input="first", max_output_tokens=3)
    r2 = a.responses.create(model=MODEL, input="second", previous_response_id=r1.id,
                            max_output_tokens=3)
    active.kill()  # failover
    r3 = b.responses.create(model=MODEL, input="third", previous_response_id=r2.id,
                            max_output_tokens=3)
    assert r3.previous_response_id == r2.id
    assert r3.usage is not None and r2.usage is not None
    assert r3.usage.input_tokens > r2.usage.input_tokens
    assert b.responses.retrieve(r1.id).id == r1.id
    r = redis.Redis.from_url(redis_url)
    # the answer apart from the record a chain walk reads; both expire, the earlier
    # turns' as long as the chain's newest
    record = r.get(f"toposerve:response:{r3.id}")
    assert record is not None and b'"response"' not in record
    for rid in (r1.id, r3.id):
        for key in (f"toposerve:response:{rid}", f"toposerve:response:{rid}:response"):
            assert 0 < r.pttl(key) <= 60_000, key
    b.responses.delete(r3.id)
    assert not r.exists(f"toposerve:response:{r3.id}", f"toposerve:response:{r3.id}:response")


def test_redis_down_is_a_clear_503(procs: Procs,
                                   redis_server: tuple[str, subprocess.Popen[bytes]]) -> None:
    """A Responses turn that cannot be stored or read is an explicit 503 in
    OpenAI's error shape, not a 500 or a hang; the router recovers with Redis."""
    url, server = redis_server
    sim = procs.sim()
    router = procs.router({"responses": {"backend": "redis", "redisUrl": url}},
                          endpoints=[sim.url])
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    first = client.responses.create(model=MODEL, input="first", max_output_tokens=3)
    end_process(server, 10)
    calls: list[Callable[[], object]] = [
                 lambda: client.responses.retrieve(first.id),
                 lambda: client.responses.create(model=MODEL, input="next", max_output_tokens=3,
                                                 previous_response_id=first.id),
                 lambda: client.responses.create(model=MODEL, input="new", max_output_tokens=3)]
    for call in calls:
        with pytest.raises(openai.APIStatusError) as err:
            call()
        assert err.value.status_code == 503
        body = err.value.response.json()
        assert "Responses store is unavailable" in body["error"]["message"]
    # chat completions do not need the store
    chat = client.chat.completions.create(model=MODEL, max_tokens=2,
                                          messages=[{"role": "user", "content": "hi"}])
    assert chat.choices


def test_a_stream_whose_turn_redis_cannot_keep_ends_failed(
        procs: Procs, redis_server: tuple[str, subprocess.Popen[bytes]]) -> None:
    """Redis killed while a Responses answer streams: the client's stream
    ends with a well-formed response.failed event (not response.completed,
    whose id would name nothing), the router counts it, and nothing of the
    turn is kept: with Redis back its id is 404 and new turns are stored."""
    url, server = redis_server
    sim = procs.sim(time_scale=1.0)  # slow tokens: Redis dies mid-answer
    router = procs.router({"responses": {"backend": "redis", "redisUrl": url}},
                          endpoints=[sim.url])
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    types: list[str] = []
    rid = ""
    last: object = None
    for event in client.responses.create(model=MODEL, input="hi", max_output_tokens=300,
                                         stream=True):
        types.append(event.type)
        last = event
        if event.type == "response.created":
            rid = event.response.id
        if types.count("response.output_text.delta") == 3:
            server.kill()
            server.wait(10)
    assert rid and "response.completed" not in types, types
    assert isinstance(last, openai.types.responses.ResponseFailedEvent), types[-3:]
    assert last.response.status == "failed" and last.response.id == rid
    assert last.response.error is not None and last.response.error.code == "server_error"
    assert "Responses store is unavailable" in last.response.error.message
    assert router.counters().get("toposerve_router_responses_unstored_total") == 1.0
    back = redis_proc.start_again(url)
    try:
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(rid)
        kept = client.responses.create(model=MODEL, input="again", max_output_tokens=2,
                                       stream=True)
        done = [e for e in kept if e.type == "response.completed"]
        assert len(done) == 1
        assert client.responses.retrieve(done[0].response.id).id == done[0].response.id
    finally:
        end_process(back, 10)
