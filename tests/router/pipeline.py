"""A router state of four healthy endpoints serving model ``m``, and
requests for it: what the scheduling tests share."""

from __future__ import annotations

from harness.router_state import MODEL, make_state
from toposerve.router.request import RequestContext

__all__ = ["LONG", "ctx", "make_state"]


def ctx(prompt: str) -> RequestContext:
    return RequestContext(model=MODEL, prompt=prompt.encode())


LONG = "shared system prompt " * 2000
