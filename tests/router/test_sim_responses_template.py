"""The simulator prefills a Responses request as vLLM does: its
instructions and input through the model's chat template, the same tokens
as the chat messages they stand for (it used the canonical ``<|role|>``
text, so with a real tokenizer its ``input_tokens`` and cached blocks
differed from vLLM's; found by tests/engine/test_sim_vs_engine.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from tests.wire.test_chat_template import CHATML, write_model
from toposerve.simulator.config import SimConfig
from toposerve.simulator.server import build_app

pytestmark = pytest.mark.unit
MODEL = "toposerve/sim-model"


def test_responses_input_goes_through_the_chat_template(tmp_path: Path) -> None:
    tokenizer = write_model(tmp_path, CHATML, None)
    cfg = SimConfig(tokenizer=str(tokenizer), time_scale=0.001)

    async def go() -> tuple[int, int, int]:
        client = TestClient(TestServer(build_app(cfg), host="127.0.0.1"))
        await client.start_server()
        try:
            r = await client.post("/v1/responses", json={
                "model": MODEL, "instructions": "You are terse.",
                "input": "What is the weather in Paris today?", "max_output_tokens": 2})
            assert r.status == 200, await r.text()
            usage = (await r.json())["usage"]
            tok = await client.post("/tokenize", json={"model": MODEL, "messages": [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is the weather in Paris today?"}]})
            chat = await client.post("/v1/chat/completions", json={
                "model": MODEL, "max_tokens": 2, "messages": [
                    {"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "What is the weather in Paris today?"}]})
            return (usage["input_tokens"], (await tok.json())["count"],
                    (await chat.json())["usage"]["prompt_tokens"])
        finally:
            await client.close()
    responses, tokenized, chat = asyncio.run(go())
    assert responses == tokenized == chat > 0
