"""The shapes of scheduling plugins. A profile runs filters, then weighted
scorers (each score in [0, 1]), then one picker. Scorers of one run share
work through its ``CycleState``; each is told, after the request is
answered, which endpoint answered it."""

from __future__ import annotations

from typing import ClassVar, Protocol

from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.cycle import CycleState


class Filter(Protocol):
    def filter(self, ctx: RequestContext, eps: list[Endpoint]) -> list[Endpoint]: ...


class Scorer(Protocol):
    """Scores candidates in [0, 1]. An endpoint left out of the answer
    scores 0: a scorer that names few (the prefix's holders, the session's
    endpoint) costs the totals nothing for the others. A scorer's answer is
    not changed by its readers."""

    name: ClassVar[str]

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]: ...

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        """Told the endpoint that answered, after any failover (e.g. to
        remember where a prefix went)."""


class Picker(Protocol):
    def pick(self, scores: dict[Endpoint, float]) -> list[Endpoint]:
        """Endpoints best first: the first is used, the rest are retry fallbacks."""


class Stateless:
    """A scorer that reads state but records nothing about the choice."""

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        return None
