"""A router state of four healthy endpoints serving model ``m``, and
requests for it: what the scheduling tests share."""

from __future__ import annotations

import time

from toposerve.router.config import RouterConfig
from toposerve.router.pool.endpoints import Endpoint, LoadSample
from toposerve.router.request import RequestContext
from toposerve.router.state import RouterState


def make_state(scorers: list[dict[str, object]] | None = None) -> RouterState:
    doc: dict[str, object] = {"apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
                              "discovery": {"static": [{"url": "http://e:1"}]}}
    if scorers is not None:
        doc["profile"] = {"scorers": scorers}
    state = RouterState(RouterConfig.model_validate(doc))
    for i in range(4):
        ep = state.pool.upsert(Endpoint(url=f"http://e{i}:8000", models=frozenset({"m"})))
        ep.healthy = True
        ep.load = LoadSample(at=time.monotonic())
    return state


def ctx(prompt: str) -> RequestContext:
    return RequestContext(model="m", prompt=prompt.encode())


LONG = "shared system prompt " * 2000
