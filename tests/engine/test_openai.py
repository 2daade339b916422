"""The official ``openai`` client through our router to two real vLLM
servers: chat, completions and Responses, streamed and not, with the usage
the engine reports (``prompt_tokens_details`` included), and /v1/models."""

from __future__ import annotations

import uuid
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from harness.procs import Proc, Procs
from harness.vllm import BLOCK_SIZE, MODEL, VllmServer, router_config

pytestmark = pytest.mark.engine
# random weights: the end-of-sequence token may come at any step
FIXED = {"ignore_eos": True}


@pytest.fixture
def router(procs: Procs, engines: list[VllmServer], model_dir: Path) -> Proc:
    return procs.router(router_config(engines, model_dir))


@pytest.fixture
def client(router: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)


def test_models_lists_the_engines_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_chat_both_ways_with_cached_tokens(client: openai.OpenAI,
                                           engines: list[VllmServer]) -> None:
    # several KiB: the default profile's approximate index keys 1 KiB blocks
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": f"{uuid.uuid4()} " + "You answer briefly. " * 120},
        {"role": "user", "content": "Say something."}]
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=7, extra_body=FIXED)
    r = raw.parse()
    assert raw.headers["x-toposerve-endpoint"] in {s.hostport for s in engines}
    assert r.object == "chat.completion" and r.model == MODEL
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 7
    assert r.usage.prompt_tokens > 2 * BLOCK_SIZE
    first = r.usage.prompt_tokens_details
    assert first is not None and first.cached_tokens == 0  # a new prompt
    # the same prompt again, streamed: the router sends it where it is
    # cached, and the engine's usage (the last chunk) says how much was
    with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=messages, max_tokens=5, stream=True,
            stream_options={"include_usage": True}, extra_body=FIXED) as streamed:
        assert streamed.headers["x-toposerve-endpoint"] == raw.headers["x-toposerve-endpoint"]
        chunks = list(streamed.parse())
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 5
    assert usage.prompt_tokens == r.usage.prompt_tokens
    assert usage.prompt_tokens_details is not None
    assert usage.prompt_tokens_details.cached_tokens == (
        usage.prompt_tokens // BLOCK_SIZE * BLOCK_SIZE)


def test_completions_both_ways(client: openai.OpenAI) -> None:
    prompt = f"{uuid.uuid4()} once upon a time " * 20
    r = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, extra_body=FIXED)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.choices[0].finish_reason == "length"
    assert r.usage is not None and r.usage.completion_tokens == 6
    assert r.usage.prompt_tokens_details is not None
    chunks = list(client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=4, stream=True,
        stream_options={"include_usage": True}, extra_body=FIXED))
    assert "".join(c.choices[0].text for c in chunks if c.choices)
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 4
    assert usage.prompt_tokens == r.usage.prompt_tokens
    assert usage.prompt_tokens_details is not None
    cached = usage.prompt_tokens_details.cached_tokens
    assert cached is not None and cached >= BLOCK_SIZE


def test_responses_both_ways(client: openai.OpenAI) -> None:
    r = client.responses.create(model=MODEL, input=f"{uuid.uuid4()} tell me a story",
                                max_output_tokens=8)
    assert r.object == "response" and r.status in {"completed", "incomplete"}
    assert r.output_text
    assert r.usage is not None and 0 < r.usage.output_tokens <= 8
    assert r.usage.input_tokens > 0 and r.usage.input_tokens_details is not None
    # the chain goes on from the router's stored turn, streamed
    events = list(client.responses.create(model=MODEL, input="and then?", stream=True,
                                          previous_response_id=r.id, max_output_tokens=6))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created"
    assert "response.output_text.delta" in kinds
    done = events[-1]
    assert done.type in {"response.completed", "response.incomplete"}
    final = done.response
    assert final.usage is not None and final.usage.input_tokens > r.usage.input_tokens
    assert final.output_text
