"""Filters: drop endpoints that cannot or should not take the request."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from router.pool.endpoints import Endpoint
from router.pool.revisions import Revisions, key_of, ready_capacity
from router.pool.saturation import unsaturated
from router.request import RequestContext
from router.state import RouterState

_REVISION = attrgetter("revision")  # key_of without a call an endpoint


@dataclass
class ModelFilter:
    """Endpoints that serve the requested model (unknown model lists pass)."""

    state: RouterState

    def filter(self, ctx: RequestContext, eps: list[Endpoint]) -> list[Endpoint]:
        if (model := ctx.model) is None:
            return eps
        return [e for e in eps if not e.models or model in e.models]


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
        ok = unsaturated(eps, self.state.config)
        return ok or eps


@dataclass
class RevisionFilter:
    """First filter of every profile: the endpoints of the request's
    revision. The revision is chosen once per request (kept on its
    context) and chosen again only if it loses its last ready endpoint
    while the request waits; a decode stage keeps to its prefill's."""

    revisions: Revisions

    def filter(self, ctx: RequestContext, eps: list[Endpoint]) -> list[Endpoint]:
        if ctx.prefill is not None:
            return [e for e in eps if key_of(e) == key_of(ctx.prefill)]
        if len({r or "" for r in set(map(_REVISION, eps))}) <= 1:
            return eps  # one revision (the usual case): nothing to choose
        capacity = ready_capacity(eps)
        if ctx.revision is None or capacity.get(ctx.revision, 0) == 0:
            chosen = self.revisions.choose(ctx.session, capacity)
            if chosen is None:
                return eps  # nothing ready in any revision: later filters say so
            ctx.revision = chosen
        return [e for e in eps if key_of(e) == ctx.revision]
