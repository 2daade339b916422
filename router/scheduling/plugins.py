"""The shapes of scheduling plugins. A profile runs filters, then weighted
scorers (each score in [0, 1]), then one picker."""

from __future__ import annotations

from typing import ClassVar, Protocol

from router.endpoints import Endpoint
from router.scheduling.context import RequestContext


class Filter(Protocol):
    def filter(self, ctx: RequestContext, eps: list[Endpoint]) -> list[Endpoint]: ...


class Scorer(Protocol):
    name: ClassVar[str]

    def score(self, ctx: RequestContext, eps: list[Endpoint]) -> dict[Endpoint, float]: ...

    def picked(self, ctx: RequestContext, ep: Endpoint) -> None:
        """Told the final choice (e.g. to remember where a prefix went)."""


class Picker(Protocol):
    def pick(self, scores: dict[Endpoint, float]) -> list[Endpoint]:
        """Endpoints best first: the first is used, the rest are retry fallbacks."""
