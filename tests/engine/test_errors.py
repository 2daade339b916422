"""Requests the engine refuses, refused through the router as the engine
refuses them: vLLM's own status and JSON error body, byte for byte the
same as asked of the engine directly, and the OpenAI SDK raises the same
error from either. The router's own checks pass these requests (their
fields are the engine's business), so the answer is vLLM's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from harness.procs import Proc, Procs
from harness.vllm import MAX_MODEL_LEN, MODEL, VllmServer, router_config

pytestmark = pytest.mark.engine
HI = [{"role": "user", "content": "hi"}]
REFUSED = [
    pytest.param("/v1/chat/completions", {"messages": HI, "max_tokens": 2 * MAX_MODEL_LEN},
                 id="chat-max-tokens-over-the-context"),
    pytest.param("/v1/chat/completions", {"messages": HI, "max_tokens": 2 * MAX_MODEL_LEN,
                                          "stream": True}, id="chat-streamed-same"),
    pytest.param("/v1/completions", {"prompt": "word " * MAX_MODEL_LEN, "max_tokens": 2},
                 id="completion-prompt-over-the-context"),
    pytest.param("/v1/chat/completions", {"messages": HI, "max_tokens": 2, "temperature": -1},
                 id="chat-negative-temperature"),
    pytest.param("/v1/chat/completions", {"messages": HI, "max_tokens": 2, "logprobs": True,
                                          "top_logprobs": 50}, id="chat-top-logprobs-over-max"),
    pytest.param("/v1/completions", {"prompt": "hi", "max_tokens": 2, "n": 0},
                 id="completion-n-0"),
    pytest.param("/v1/responses", {"input": "hi", "max_output_tokens": 2 * MAX_MODEL_LEN},
                 id="responses-max-output-tokens-over-the-context"),
]


@pytest.fixture(scope="module")
def router(engines: list[VllmServer], tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Proc]:
    # one for the module: refused requests change nothing a later one reads
    procs = Procs(tmp_path_factory.mktemp("router"))
    try:
        yield procs.router(router_config(engines, Path(engines[0].extra["model"])))
    finally:
        procs.close()


@pytest.mark.parametrize(("path", "body"), REFUSED)
def test_the_engines_refusal_comes_through_as_it_is(
        router: Proc, engines: list[VllmServer], path: str, body: dict[str, Any]) -> None:
    body = {"model": MODEL, **body}
    direct = httpx.post(engines[0].url + path, json=body, timeout=30)
    via = httpx.post(router.url + path, json=body, timeout=30)
    assert 400 <= direct.status_code < 500, direct.text
    assert direct.json()["error"]["message"], direct.text
    assert (via.status_code, via.headers["content-type"]) == (
        direct.status_code, direct.headers["content-type"])
    assert via.content == direct.content
    # who refused, and which request: chat, completions and Responses alike
    assert via.headers["x-toposerve-endpoint"] in {e.hostport for e in engines}
    assert via.headers["x-request-id"]


def test_the_sdk_raises_the_engines_error(router: Proc, engines: list[VllmServer]) -> None:
    errors = []
    for base in (engines[0].url, router.url):
        client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0,
                               timeout=30)
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model=MODEL, messages=[{"role": "user",
                                                                   "content": "hi"}],
                                           max_tokens=2, top_p=2.0, stream=True)
        errors.append((err.value.status_code, err.value.body))
    assert errors[0] == errors[1]
    assert errors[1][0] == 400
    assert isinstance(errors[1][1], dict) and errors[1][1]["param"] == "top_p"
