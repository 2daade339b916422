"""What the engine tier's tests ask of the servers and read of the router:
requests straight to a server or through the router, and the router's
view of one server (its health, its load, its blocks in the precise
index) from the router's /metrics."""

from __future__ import annotations

import time
from typing import Any

import httpx

from harness.procs import Proc
from harness.vllm import MODEL, VllmServer

FIXED = {"ignore_eos": True}  # random weights: the end-of-sequence token may come at any step


def precise_only(seed: int) -> dict[str, Any]:
    """A router profile that scores by the engines' KV events alone (the
    precise index), ties broken by ``seed``."""
    return {"scorers": [{"type": "prefix-precise", "weight": 1}],
            "picker": {"type": "max-score", "params": {"seed": seed}}}


def chat(url: str, content: str, max_tokens: int = 2) -> httpx.Response:
    r = httpx.post(url + "/v1/chat/completions", timeout=60, json={
        "model": MODEL, "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens, **FIXED})
    assert r.status_code == 200, r.text
    return r


def complete(url: str, prompt: str) -> httpx.Response:
    r = httpx.post(url + "/v1/completions", timeout=60, json={
        "model": MODEL, "prompt": prompt, "max_tokens": 1})
    assert r.status_code == 200, r.text
    return r


def endpoint_metric(router: Proc, name: str, engine: VllmServer, **labels: str) -> float:
    return router.metric(name, endpoint=engine.hostport, **labels)


def held(router: Proc, engine: VllmServer) -> float:
    """The engine's blocks in the router's precise index."""
    return endpoint_metric(router, "toposerve_router_endpoint_prefix_blocks", engine,
                           index="precise")


def settled(router: Proc, engine: VllmServer) -> list[float]:
    """``held`` (in a list: 0 counts) once two readings half a second apart
    agree (nothing else sends the engine work meanwhile)."""
    first = held(router, engine)
    time.sleep(0.5)
    return [first] if held(router, engine) == first else []


def healthy(router: Proc, engine: VllmServer) -> bool:
    return endpoint_metric(router, "toposerve_router_endpoint_healthy", engine) == 1
