"""The simulator bounds what it reads of a request, as every server of ours
does: a body over --max-body-bytes is a 413 (it read 256 MiB before)."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.test_utils import TestClient, TestServer

from toposerve.simulator.config import SimConfig
from toposerve.simulator.server import build_app

pytestmark = pytest.mark.unit


def test_a_body_over_the_bound_is_413() -> None:
    async def go() -> None:
        client = TestClient(TestServer(build_app(SimConfig(max_body_bytes=4096)),
                                       host="127.0.0.1"))
        await client.start_server()
        try:
            small = await client.post("/v1/completions", json={
                "model": "toposerve/sim-model", "prompt": "hi", "max_tokens": 1})
            assert small.status == 200
            big = await client.post("/v1/completions", json={
                "model": "toposerve/sim-model", "prompt": "x" * 8192, "max_tokens": 1})
            assert big.status == 413
            assert "detail" in await big.json()
        finally:
            await client.close()
    asyncio.run(go())
