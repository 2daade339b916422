"""A Responses-API chain that moves between the two real vLLM servers:
each turn lands on the server the other did not (a profile that spreads
by cache room), so the server answering a follow-up never saw the turns it
follows. The chain is the router's: it sends the whole conversation (vLLM
would refuse a ``previous_response_id`` it never stored), and when the
chain comes back to its first server the engine finds the first turn's
prompt cached (``cached_tokens``), so the router rebuilt it token for
token."""

from __future__ import annotations

import uuid
from pathlib import Path

import openai
import pytest

from harness.procs import Procs
from harness.vllm import BLOCK_SIZE, MODEL, VllmServer, router_config

pytestmark = pytest.mark.engine
# over the approximate index's 1 KiB blocks, so cache room tells the servers apart
# (about 240 tokens: three turns of it stay well within the model's 2048)
CONTEXT = "The software is provided as is, without warranty of any kind. " * 20


def test_a_chain_goes_on_on_the_other_server(procs: Procs, engines: list[VllmServer],
                                             model_dir: Path) -> None:
    router = procs.router({**router_config(engines, model_dir), "profile": {
        "scorers": [{"type": "cache-room", "weight": 2}, {"type": "prefix-approx", "weight": 1}],
        "picker": {"type": "max-score", "params": {"seed": 3}}}})
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0,
                           timeout=60)
    salt = uuid.uuid4().hex
    raw = client.responses.with_raw_response.create(
        model=MODEL, input=f"[{salt}] {CONTEXT} Begin.", max_output_tokens=6)
    first, first_at = raw.parse(), raw.headers["x-toposerve-endpoint"]
    assert first.usage is not None and first.output_text
    # the follow-up, streamed, on the other server
    with client.responses.with_streaming_response.create(
            model=MODEL, input=f"{CONTEXT} Go on.", previous_response_id=first.id,
            max_output_tokens=6, stream=True) as streamed:
        second_at = streamed.headers["x-toposerve-endpoint"]
        events = list(streamed.parse())
    assert second_at != first_at
    done = events[-1]
    assert done.type in {"response.completed", "response.incomplete"}, [e.type for e in events]
    second = done.response
    assert second.previous_response_id == first.id and second.output_text
    assert second.usage is not None
    # the whole conversation went to a server that had seen none of it
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens
    raw = client.responses.with_raw_response.create(
        model=MODEL, input="And last?", previous_response_id=second.id, max_output_tokens=6)
    third = raw.parse()
    assert raw.headers["x-toposerve-endpoint"] == first_at
    assert third.previous_response_id == second.id and third.output_text
    assert third.usage is not None and third.usage.input_tokens_details is not None
    cached = third.usage.input_tokens_details.cached_tokens
    assert cached >= (first.usage.input_tokens // BLOCK_SIZE - 1) * BLOCK_SIZE, (
        cached, first.usage.input_tokens)
    # each stored turn reads back from the router, wherever it ran
    assert client.responses.retrieve(second.id).output_text == second.output_text
