"""Two tenants (API keys) in one band share a full endpoint equally,
whatever their demand: round-robin by requests, least attained service by
weighted tokens."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from harness.procs import MODEL, Procs

KEYS = {"a": ["sk-a"], "b": ["sk-b"]}


async def _closed_loop(url: str, key: str, clients: int, max_tokens: int,
                       since: float, until: float) -> list[int]:
    """``clients`` callers, each sending its next request when its last is
    answered; returns the output tokens of each answer to a request sent
    from ``since`` on (the first requests find the endpoint empty and go
    before any queue forms)."""
    done: list[int] = []

    async def caller(session: aiohttp.ClientSession) -> None:
        while (sent := time.monotonic()) < until:
            async with session.post(url + "/v1/completions", headers={
                    "Authorization": f"Bearer {key}"}, json={
                    "model": MODEL, "prompt": "hello", "max_tokens": max_tokens}) as r:
                body = await r.json()
                assert r.status == 200, body
                if sent >= since:
                    done.append(body["usage"]["completion_tokens"])

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(caller(session) for _ in range(clients)))
    return done


def _served(procs: Procs, tmp_path: Path, fairness: dict[str, Any],
            demand: dict[str, tuple[int, int]]) -> dict[str, list[int]]:
    keys = tmp_path / "keys.yaml"
    keys.write_text(yaml.safe_dump({"apiVersion": "toposerve.io/v1", "kind": "APIKeys",
                                    "tenants": KEYS}))
    sim = procs.sim(time_scale=1.0, decode_s_per_token=0.01, max_num_seqs=4)
    router = procs.router({"flowControl": {
        "enabled": True, "queueTTLSeconds": 20, "fairness": fairness,
        "saturation": {"detector": "concurrency", "maxConcurrency": 4},
        "tenants": {"keys": {"file": str(keys)}}}}, endpoints=[sim.url])

    async def both() -> list[list[int]]:
        t0 = time.monotonic()
        return list(await asyncio.gather(*(
            _closed_loop(router.url, KEYS[t][0], clients, tokens, t0 + 0.5, t0 + 3.5)
            for t, (clients, tokens) in demand.items())))

    return dict(zip(demand, asyncio.run(both()), strict=True))


def _within(a: float, b: float, share: float) -> bool:
    return abs(a - b) <= share * max(a, b)


def test_round_robin_equal_requests(procs: Procs, tmp_path: Path) -> None:
    # a keeps twice b's requests waiting: each still gets half the slots
    served = _served(procs, tmp_path, {"policy": "round-robin"}, {"a": (16, 10), "b": (8, 10)})
    n = {t: len(v) for t, v in served.items()}
    assert n["a"] > 20 and _within(n["a"], n["b"], 0.10), n


def test_least_attained_equal_tokens(procs: Procs, tmp_path: Path) -> None:
    # b's answers are three times longer: it gets a third of a's requests,
    # and the same number of tokens
    served = _served(procs, tmp_path, {"policy": "least-attained", "inputTokenWeight": 0},
                     {"a": (8, 10), "b": (8, 30)})
    tokens = {t: sum(v) for t, v in served.items()}
    assert len(served["a"]) > 2 * len(served["b"]), served
    assert _within(tokens["a"], tokens["b"], 0.10), tokens
