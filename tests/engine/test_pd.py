"""Prefill/decode disaggregation on two real vLLM servers: NixlConnector
moving KV between CPU buffers over UCX (``make engines`` installs NIXL
beside the venv), our router splitting each request the NIXL way (a
one-token prefill, its ``kv_transfer_params`` handed to the decode server).
The engines' own counters say where each prompt token came from; the pair
is this module's (a KV connector on the shared servers would be on every
other test's path)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from harness.procs import Proc, Procs
from harness.vllm import MODEL, VllmServer, router_config
from tests.engine.conftest import vllm_pair

pytestmark = pytest.mark.engine
FIXED = {"ignore_eos": True}
SOURCE = "vllm:prompt_tokens_by_source_total"  # prompt tokens by where their KV came from


@pytest.fixture(scope="module")
def pd_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmServer]]:
    """A prefill server and a decode server, both with NixlConnector."""
    with vllm_pair(tmp_path_factory.mktemp("vllm-pd"), nixl=True) as servers:
        yield servers


@pytest.fixture
def router(procs: Procs, pd_pair: list[VllmServer]) -> Proc:
    cfg = router_config(pd_pair, Path(pd_pair[0].extra["model"]))
    for entry, role in zip(cfg["discovery"]["static"], ("prefill", "decode"), strict=True):
        entry["role"] = role
    return procs.router({**cfg, "disaggregation": {"enabled": True}})


@pytest.fixture
def client(router: Proc) -> openai.OpenAI:
    return openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0)


def counts(s: VllmServer) -> dict[str, float]:
    """The engine's own word: prompt tokens by source, tokens generated,
    NIXL transfers that failed, requests finished."""
    p = Proc(s.url, s.popen, s.log)
    out = {src: p.metric(SOURCE, source=src)
           for src in ("local_compute", "local_cache_hit", "external_kv_transfer")}
    for name in ("vllm:generation_tokens_total", "vllm:nixl_num_failed_transfers_total",
                 "vllm:request_success_total"):
        out[name] = p.metric(name)
    return out


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {k: after[k] - before[k] for k in after}


def test_split_requests_decode_from_transferred_kv(client: openai.OpenAI, router: Proc,
                                                   pd_pair: list[VllmServer]) -> None:
    prefill, decode = pd_pair
    where = {"x-toposerve-prefill-endpoint": prefill.hostport,
             "x-toposerve-endpoint": decode.hostport}
    p0, d0 = counts(prefill), counts(decode)
    tag = uuid.uuid4()
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": f"{tag} You answer briefly. " * 40},
        {"role": "user", "content": "Say something."}]
    prompt_tokens = generated = 0

    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, max_tokens=6, extra_body=FIXED)
    chat = raw.parse()
    assert {k: raw.headers[k] for k in where} == where
    assert chat.choices[0].finish_reason == "length" and chat.usage is not None
    assert chat.usage.completion_tokens == 6
    prompt_tokens, generated = chat.usage.prompt_tokens, 6

    with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=[*messages, {"role": "user", "content": "More."}],
            max_tokens=5, stream=True, stream_options={"include_usage": True},
            extra_body=FIXED) as streamed:
        assert {k: streamed.headers[k] for k in where} == where
        chunks = list(streamed.parse())
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == 5
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    prompt_tokens, generated = prompt_tokens + usage.prompt_tokens, generated + 5

    done = client.completions.create(model=MODEL, prompt=f"{tag} once upon a time " * 30,
                                     max_tokens=4, extra_body=FIXED)
    assert done.usage is not None and done.usage.completion_tokens == 4
    prompt_tokens, generated = prompt_tokens + done.usage.prompt_tokens, generated + 4

    answer = client.responses.create(model=MODEL, input=f"{tag} tell me a story " * 20,
                                     max_output_tokens=3, extra_body=FIXED)
    assert answer.incomplete_details is not None  # cut at max_output_tokens, as asked
    assert answer.incomplete_details.reason == "max_output_tokens"
    assert answer.usage is not None
    assert answer.usage.output_tokens == 3
    prompt_tokens += answer.usage.input_tokens
    generated += 3

    p, d = delta(counts(prefill), p0), delta(counts(decode), d0)
    # the prefill server ran each prompt for one token; the decode server
    # computed none of any prompt: every token's KV was pulled over NIXL or
    # already in its cache (the two chat turns share a prefix)
    assert p["vllm:generation_tokens_total"] == 4
    assert p["vllm:request_success_total"] == 4
    assert d["local_compute"] == 0
    assert d["external_kv_transfer"] > 0
    assert d["external_kv_transfer"] + d["local_cache_hit"] == prompt_tokens
    assert d["vllm:generation_tokens_total"] == generated
    assert d["vllm:nixl_num_failed_transfers_total"] == 0
    assert router.metric("toposerve_router_disaggregation_total", outcome="split") == 4


def test_a_prompt_the_prefill_refuses_comes_back_as_vllm_said(
        client: openai.OpenAI, router: Proc, pd_pair: list[VllmServer]) -> None:
    d0 = counts(pd_pair[1])
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="word " * 3000, max_tokens=4)
    body = err.value.body
    assert isinstance(body, dict) and body["type"] == "BadRequestError"
    assert "maximum context length" in body["message"]
    assert router.metric("toposerve_router_disaggregation_total", outcome="refused") == 1
    assert counts(pd_pair[1]) == d0  # never sent on to decode


# last in the module: it leaves the prefill server dead
def test_prefill_server_killed_the_decode_server_prefills_itself(
        client: openai.OpenAI, router: Proc, pd_pair: list[VllmServer]) -> None:
    prefill, decode = pd_pair
    prefill.kill()
    d0 = counts(decode)
    raw = client.completions.with_raw_response.create(
        model=MODEL, prompt=f"{uuid.uuid4()} after the prefill died " * 20, max_tokens=4,
        extra_body=FIXED)
    done = raw.parse()
    assert raw.headers["x-toposerve-endpoint"] == decode.hostport
    assert done.usage is not None and done.usage.completion_tokens == 4
    d = delta(counts(decode), d0)
    assert d["external_kv_transfer"] == 0
    assert d["local_compute"] + d["local_cache_hit"] == done.usage.prompt_tokens
    assert d["local_compute"] > 0
    assert router.metric("toposerve_router_disaggregation_total", outcome="split") == 0
