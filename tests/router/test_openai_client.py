"""The official ``openai`` client against the router and simulators."""

from __future__ import annotations

import httpx
import openai
import pytest

from harness.procs import MODEL, Procs


@pytest.fixture
def client(procs: Procs) -> openai.OpenAI:
    sims = [procs.sim() for _ in range(2)]
    router = procs.router(endpoints=[s.url for s in sims])
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)


def test_chat_non_streaming(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(model=MODEL, max_tokens=7,
                                       messages=[{"role": "user", "content": "hi there"}])
    assert r.object == "chat.completion"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.usage is not None and r.usage.completion_tokens == 7


def test_chat_streaming(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL, max_tokens=9, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "stream please"}])
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text) == 9 * 4
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 9
    assert any(c.choices and c.choices[0].finish_reason == "length" for c in chunks)


def test_completions_both_ways(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=4)
    assert r.object == "text_completion" and len(r.choices[0].text) == 16
    parts = [c.choices[0].text for c in client.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=5, stream=True)]
    assert "".join(parts) and len("".join(parts)) == 20


def test_models_union(procs: Procs) -> None:
    a = procs.sim(served_model_name="alpha")
    b = procs.sim(served_model_name="beta")
    router = procs.router(endpoints=[a.url, b.url])
    c = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    assert sorted(m.id for m in c.models.list()) == ["alpha", "beta"]
    # a request for beta only reaches the server that has it
    for _ in range(5):
        r = c.chat.completions.with_raw_response.create(
            model="beta", messages=[{"role": "user", "content": "x"}], max_tokens=1)
        assert r.headers["x-toposerve-endpoint"] == b.url.removeprefix("http://")
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="gamma", messages=[{"role": "user", "content": "x"}])


def test_responses_chain_survives_endpoint_loss(procs: Procs) -> None:
    sims = [procs.sim() for _ in range(3)]
    router = procs.router(endpoints=[s.url for s in sims])
    c = openai.OpenAI(base_url=router.url + "/v1", api_key="x", max_retries=0)
    by_name = {s.url.removeprefix("http://"): s for s in sims}
    prev = None
    served = []
    last_input = 0
    for turn in range(5):
        raw = c.responses.with_raw_response.create(
            model=MODEL, input=f"turn {turn}: tell me more", previous_response_id=prev,
            max_output_tokens=6)
        r = raw.parse()
        served.append(raw.headers["x-toposerve-endpoint"])
        assert r.status == "completed" and r.output_text
        assert r.previous_response_id == prev
        # the model saw the whole conversation: input grows every turn
        assert r.usage is not None
        if turn == 1:
            by_name[served[1]].kill()  # lose the endpoint that served turn 2
        assert r.usage.input_tokens > last_input
        last_input = r.usage.input_tokens
        prev = r.id
    assert served[0] == served[1]  # the chain prefers its warm endpoint
    assert served[1] not in served[2:]  # and moved on once it was gone
    assert prev is not None
    fetched = c.responses.retrieve(prev)
    assert fetched.id == prev and fetched.output_text
    with pytest.raises(openai.NotFoundError):
        c.responses.create(model=MODEL, input="x", previous_response_id="resp_missing")


def test_responses_streaming_chain(client: openai.OpenAI) -> None:
    """Streamed turns are kept too: each turn names the one before, streamed
    or not, and sees the whole conversation."""
    prev, last_input = None, 0
    for turn in range(4):
        if turn % 2:
            r = client.responses.create(model=MODEL, input=f"turn {turn}", max_output_tokens=5,
                                        previous_response_id=prev)
        else:
            events = list(client.responses.create(
                model=MODEL, input=f"turn {turn}", max_output_tokens=5,
                previous_response_id=prev, stream=True))
            kinds = [e.type for e in events]
            assert kinds[:4] == ["response.created", "response.in_progress",
                                 "response.output_item.added", "response.content_part.added"]
            assert kinds[-1] == "response.completed"
            assert [e.sequence_number for e in events] == list(range(len(events)))
            deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            done = events[-1]
            assert done.type == "response.completed"
            r = done.response
            assert deltas == r.output_text and len(deltas) == 5 * 4
            assert events[0].type == "response.created"
            assert events[0].response.previous_response_id == prev
        assert r.previous_response_id == prev
        assert r.usage is not None and r.usage.input_tokens > last_input
        last_input, prev = r.usage.input_tokens, r.id
    assert prev is not None and client.responses.retrieve(prev).id == prev


def test_health_ready_metrics(procs: Procs) -> None:
    sim = procs.sim()
    router = procs.router(endpoints=[sim.url])
    assert httpx.get(router.url + "/health").status_code == 200
    assert httpx.get(router.url + "/ready").status_code == 200
    httpx.post(router.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
    text = httpx.get(router.url + "/metrics").text
    assert 'toposerve_router_requests_total{code="200",path="/v1/completions"} 1.0' in text
    assert "toposerve_router_endpoint_inflight{" in text
    assert 'toposerve_router_decisions_total{reason="only-candidate"} 1.0' in text
