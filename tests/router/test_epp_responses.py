"""Responses-API chains through a real Envoy and the endpoint picker, as
behind the standalone router: the picker keeps each turn in the router's
store, sends the model server the whole conversation (a body mutation
through Envoy's ext_proc), and gives each answer, whole or streamed, the
router's id for its turn, which the next turn names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from harness.envoy import start_envoy, start_picker
from harness.procs import MODEL, Proc, Procs
from harness.waiting import wait_for


def _healthy(picker: Proc, name: str) -> bool:
    return any(s.value == 1 for s in picker.samples()
               if s.name == "toposerve_router_endpoint_healthy"
               and s.labels.get("endpoint") == name)


def test_a_chain_continues_on_any_endpoint(procs: Procs) -> None:
    """Five turns, whole and streamed by turns, each naming the one
    before: the answers carry the router's ids and links, the model server
    sees the whole conversation each turn (its input grows), the chain
    stays on its endpoint until that one is killed and then goes on, whole,
    on the other; the turns' answers settle (nothing left in flight)."""
    sims = [procs.sim() for _ in range(2)]
    by_name = {s.url.removeprefix("http://"): s for s in sims}
    picker = start_picker(procs, [s.url for s in sims])
    envoy = start_envoy(procs, picker.extra["grpc"])
    client = openai.OpenAI(base_url=envoy.url + "/v1", api_key="unused", max_retries=0)
    prev: str | None = None
    served: list[str] = []
    ids: set[str] = set()
    last_input = 0
    for turn in range(5):
        if turn % 2:
            raw = client.responses.with_raw_response.create(
                model=MODEL, input=f"turn {turn}: tell me more", max_output_tokens=5,
                previous_response_id=prev)
            served.append(raw.headers["x-toposerve-endpoint"])
            r = raw.parse()
        else:
            with client.responses.with_streaming_response.create(
                    model=MODEL, input=f"turn {turn}: tell me more", max_output_tokens=5,
                    previous_response_id=prev, stream=True) as streamed:
                served.append(streamed.headers["x-toposerve-endpoint"])
                events: list[Any] = list(streamed.parse())
            kinds = [e.type for e in events]
            assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
            assert events[0].response.id == events[-1].response.id
            assert events[0].response.previous_response_id == prev
            deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
            r = events[-1].response
            assert deltas == r.output_text
        assert r.status == "completed" and r.output_text
        assert r.previous_response_id == prev
        assert r.id.startswith("resp_") and len(r.id) == 53 and r.id not in ids  # the router's
        ids.add(r.id)
        # the model saw the whole conversation: its input grows every turn
        assert r.usage is not None and r.usage.input_tokens > last_input
        last_input, prev = r.usage.input_tokens, r.id
        if turn == 1:
            home = by_name[served[1]]
            home.kill()  # lose the endpoint the chain lives on
            wait_for("the picker to see it gone", lambda: not _healthy(picker, served[1]))
    assert served[0] == served[1]  # the chain prefers its warm endpoint
    assert served[1] not in served[2:]  # and goes on elsewhere once it is gone
    assert prev is not None and client.responses.retrieve(prev).output_text == r.output_text
    counted = {(s.labels["path"], s.labels["code"]): s.value for s in picker.samples()
               if s.name == "toposerve_router_requests_total"}
    assert counted[("/v1/responses", "200")] == 5
    wait_for("the picker to hold nothing in flight",
             lambda: picker.metric("toposerve_router_endpoint_inflight") == 0)


def test_chain_refusals(procs: Procs) -> None:
    """What the standalone router refuses of a chain the picker refuses,
    through Envoy, before anything reaches a model server: an id it never
    gave (404), a turn stored with ``store: false`` (it was not kept:
    404), a chain whose earlier turns are over responses.maxChainBytes
    (413)."""
    sim = procs.sim()
    picker = start_picker(procs, [sim.url], {"responses": {"maxChainBytes": 2000}})
    envoy = start_envoy(procs, picker.extra["grpc"])
    client = openai.OpenAI(base_url=envoy.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError, match="resp_missing"):
        client.responses.create(model=MODEL, input="x", previous_response_id="resp_missing")
    unkept = client.responses.create(model=MODEL, input="x", max_output_tokens=2, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model=MODEL, input="x", previous_response_id=unkept.id)
    long = client.responses.create(model=MODEL, input="long " * 500, max_output_tokens=2)
    r = httpx.post(envoy.url + "/v1/responses", timeout=60, json={
        "model": MODEL, "input": "more", "previous_response_id": long.id})
    assert r.status_code == 413 and "responses.maxChainBytes" in r.json()["error"]["message"]
    assert sim.metric("vllm:request_success_total") == 2  # the two turns answered


def test_a_held_answer_is_bounded(procs: Procs) -> None:
    """A whole turn's answer is held to be stamped and stored, within
    server.maxAnswerBytes: one over it is the picker's 502 in OpenAI's
    shape (an immediate response while Envoy still waits for the answer's
    headers), not a truncated body; a streamed turn holds only its
    unfinished event, and goes through."""
    sim = procs.sim()
    picker = start_picker(procs, [sim.url], {"server": {"maxAnswerBytes": 600}})
    envoy = start_envoy(procs, picker.extra["grpc"])
    ask = {"model": MODEL, "input": "hi", "max_output_tokens": 40}  # a body of 700 bytes
    r = httpx.post(envoy.url + "/v1/responses", timeout=60, json=ask)
    assert r.status_code == 502, r.text
    assert r.json()["error"]["message"] == (
        f"upstream {sim.url.removeprefix('http://')} broke while answering "
        "(UpstreamError: answer over 600 bytes (server.maxAnswerBytes))")
    r = httpx.post(envoy.url + "/v1/responses", timeout=60, json={**ask, "stream": True})
    assert r.status_code == 200 and r.text.rstrip().endswith("}")
    assert '"type":"response.completed"' in r.text
    wait_for("the picker to hold nothing in flight",
             lambda: picker.metric("toposerve_router_endpoint_inflight") == 0)


def test_stored_turns_are_the_pickers_to_answer(procs: Procs, tmp_path: Path) -> None:
    """``GET`` and ``DELETE /v1/responses/{id}`` and its input items are
    answered by the picker from the router's store (no model server kept
    the turn), for the tenant whose API key stored it; to another tenant
    the turn does not exist, as a chain link either."""
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"apiVersion": "toposerve.io/v1", "kind": "APIKeys",
                                    "tenants": {"red": ["sk-red-1"], "blue": ["sk-blue-1"]}}))
    sim = procs.sim()
    picker = start_picker(procs, [sim.url], {
        "flowControl": {"tenants": {"keys": {"file": str(keys)}}}})
    envoy = start_envoy(procs, picker.extra["grpc"])
    red, blue = (openai.OpenAI(base_url=envoy.url + "/v1", api_key=k, max_retries=0)
                 for k in ("sk-red-1", "sk-blue-1"))
    turn = red.responses.create(model=MODEL, input="remember this", max_output_tokens=3)
    raw = red.responses.with_raw_response.retrieve(turn.id)
    assert "x-toposerve-endpoint" not in raw.headers  # no model server was asked
    fetched = raw.parse()
    assert fetched.id == turn.id and fetched.output_text == turn.output_text
    items = red.responses.input_items.list(turn.id).model_dump()["data"]
    assert [[c["text"] for c in i["content"]] for i in items] == [["remember this"]]
    with pytest.raises(openai.NotFoundError):
        blue.responses.retrieve(turn.id)
    with pytest.raises(openai.NotFoundError):
        blue.responses.create(model=MODEL, input="and?", previous_response_id=turn.id)
    with pytest.raises(openai.NotFoundError):
        blue.responses.delete(turn.id)
    red.responses.delete(turn.id)
    with pytest.raises(openai.NotFoundError):
        red.responses.retrieve(turn.id)
    assert sim.metric("vllm:request_success_total") == 1
