"""Filters: drop endpoints that cannot or should not take the request."""

from __future__ import annotations

from dataclasses import dataclass

from router.pool.endpoints import Endpoint
from router.scheduling.context import RequestContext
from router.state import RouterState


@dataclass
class ModelFilter:
    """Endpoints that serve the requested model (unknown model lists pass)."""

    state: RouterState

    def filter(self, ctx: RequestContext, eps: list[Endpoint]) -> list[Endpoint]:
        if ctx.model is None:
            return eps
        return [e for e in eps if not e.models or ctx.model in e.models]


@dataclass
class HealthyFilter:
    state: RouterState

    def filter(self, ctx: RequestContext, eps: list[Endpoint]) -> list[Endpoint]:
        return [e for e in eps if e.healthy and not e.draining]


@dataclass
class RoleFilter:
    """Endpoints of one role (e.g. decode); endpoints with no role, or both,
    pass unless ``exact``."""

    state: RouterState
    role: str = "decode"
    exact: bool = False

    def filter(self, ctx: RequestContext, eps: list[Endpoint]) -> list[Endpoint]:
        if self.exact:
            return [e for e in eps if e.role == self.role]
        return [e for e in eps if e.role in (None, self.role, "prefill-decode")]


@dataclass
class NotSaturatedFilter:
    """Drop saturated endpoints, unless that would drop them all."""

    state: RouterState

    def filter(self, ctx: RequestContext, eps: list[Endpoint]) -> list[Endpoint]:
        ok = [e for e in eps if not self.state.saturated(e)]
        return ok or eps
