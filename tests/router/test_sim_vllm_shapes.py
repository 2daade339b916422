"""Where the simulator was found to answer otherwise than vLLM 0.32
(tests/engine/test_sim_vs_engine.py), it now answers as vLLM does: a string
for a sampling number is a 400, a prompt over the context alone names
``input_tokens``, a Responses answer echoes the sampling settings and
carries vLLM's usage details, and each model has its permission object."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from toposerve.simulator.config import SimConfig
from toposerve.simulator.server import build_app

pytestmark = pytest.mark.unit
MODEL = "toposerve/sim-model"


def ask(requests: list[tuple[str, str, dict[str, Any] | None]]) -> list[tuple[int, Any]]:
    async def go() -> list[tuple[int, Any]]:
        client = TestClient(TestServer(build_app(SimConfig(time_scale=0.001,
                                                           max_model_len=64)),
                                       host="127.0.0.1"))
        await client.start_server()
        try:
            out = []
            for method, path, body in requests:
                r = await client.request(method, path, json=body)
                out.append((r.status, await r.json()))
            return out
        finally:
            await client.close()
    return asyncio.run(go())


def test_the_simulator_answers_in_vllms_shapes() -> None:
    hot, long, resp, models = ask([
        ("POST", "/v1/chat/completions", {"model": MODEL, "max_tokens": 2, "temperature": "hot",
                                          "messages": [{"role": "user", "content": "hi"}]}),
        ("POST", "/v1/completions", {"model": MODEL, "prompt": "x" * 400, "max_tokens": 2}),
        ("POST", "/v1/responses", {"model": MODEL, "input": "hi", "max_output_tokens": 2,
                                   "temperature": 0}),
        ("GET", "/v1/models", None)])
    assert hot[0] == 400 and hot[1]["error"]["param"] == "temperature"
    assert long[0] == 400 and long[1]["error"]["param"] == "input_tokens"
    assert "100 input tokens" in long[1]["error"]["message"]
    status, body = resp
    assert status == 200
    assert {k: body[k] for k in ("temperature", "top_p", "max_output_tokens", "tool_choice",
                                 "truncation", "service_tier", "background")} == {
        "temperature": 0.0, "top_p": 1.0, "max_output_tokens": 2, "tool_choice": "auto",
        "truncation": "disabled", "service_tier": "auto", "background": False}
    assert body["usage"]["input_tokens_details"]["cache_write_tokens"] == 0
    assert body["usage"]["output_tokens_details"]["tool_output_tokens"] == 0
    (perm,) = models[1]["data"][0]["permission"]
    assert perm["object"] == "model_permission" and perm["allow_sampling"] is True
