"""A router state of four healthy endpoints serving one model, in process:
what the scheduling tests and the in-process router benches start from."""

from __future__ import annotations

import time

from toposerve.router.config import RouterConfig
from toposerve.router.pool.endpoints import Endpoint, LoadSample
from toposerve.router.state import RouterState

MODEL = "m"


def make_state(scorers: list[dict[str, object]] | None = None) -> RouterState:
    """``scorers``: the profile's, or the default profile's when None."""
    doc: dict[str, object] = {"apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
                              "discovery": {"static": [{"url": "http://e0:8000"}]}}
    if scorers is not None:
        doc["profile"] = {"scorers": scorers}
    state = RouterState(RouterConfig.model_validate(doc))
    for i in range(4):
        ep = state.pool.upsert(Endpoint(url=f"http://e{i}:8000", models=frozenset({MODEL})))
        ep.healthy = True
        ep.load = LoadSample(at=time.monotonic())
    return state
