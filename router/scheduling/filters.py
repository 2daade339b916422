"""Filters: drop endpoints that cannot or should not take the request."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from operator import attrgetter
from typing import ClassVar

from toposerve.router.pool.endpoints import CHANGES, Endpoint
from toposerve.router.pool.revisions import Revisions, key_of, ready_capacity
from toposerve.router.pool.saturation import unsaturated
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.plugins import Deps, FromState, Params
from toposerve.router.state import RouterState

_REVISION = attrgetter("revision")  # key_of without a call an endpoint
_LOAD_AT = attrgetter("load.at")


MODELS_KEPT = 16  # the model filter's answers kept, for as many models


def same_or(eps: list[Endpoint], kept: list[Endpoint]) -> list[Endpoint]:
    """``kept``, or ``eps`` itself when nothing was dropped: a list the
    next filter (and the cycle's URL memo) may have seen already."""
    return eps if len(kept) == len(eps) else kept


@dataclass
class ModelFilter(FromState):
    """Endpoints that serve the requested model (unknown model lists pass).
    The answer for a model is reused while the candidates are the same list
    and no endpoint's shape changed (``CHANGES.shape``)."""

    name: ClassVar[str] = "model"
    _memo: dict[str, tuple[list[Endpoint], list[Endpoint]]] = field(
        default_factory=dict, init=False, repr=False)
    _at: int = field(default=-1, init=False, repr=False)

    def filter(self, ctx: RequestContext, eps: list[Endpoint]) -> list[Endpoint]:
        if (model := ctx.model) is None:
            return eps
        if self._at != CHANGES.shape or len(self._memo) >= MODELS_KEPT:
            self._memo.clear()
            self._at = CHANGES.shape
        if (hit := self._memo.get(model)) is not None and hit[0] is eps:
            return hit[1]
        out = same_or(eps, [e for e in eps if not e.models or model in e.models])
        self._memo[model] = (eps, out)  # the input held, so its id is not reused
        return out


@dataclass
class HealthyFilter(FromState):
    """Endpoints healthy and not draining; the answer reused as the model
    filter's is."""

    name: ClassVar[str] = "healthy"
    _memo: tuple[int, list[Endpoint], list[Endpoint]] = field(
        default=(-1, [], []), init=False, repr=False)

    def filter(self, ctx: RequestContext, eps: list[Endpoint]) -> list[Endpoint]:
        at, seen, out = self._memo
        if at == CHANGES.shape and seen is eps:
            return out
        out = same_or(eps, [e for e in eps if e.healthy and not e.draining])
        self._memo = (CHANGES.shape, eps, out)
        return out


class RoleParams(Params):
    role: str = "decode"
    exact: bool = False


@dataclass
class RoleFilter:
    """Endpoints of one role (e.g. decode); endpoints with no role, or both,
    pass unless ``exact``."""

    state: RouterState
    role: str = "decode"
    exact: bool = False
    name: ClassVar[str] = "role"
    params_model: ClassVar[type[RoleParams]] = RoleParams

    @classmethod
    def build(cls, params: RoleParams, deps: Deps) -> RoleFilter:
        return cls(deps.state, params.role, params.exact)

    def filter(self, ctx: RequestContext, eps: list[Endpoint]) -> list[Endpoint]:
        if self.exact:
            return [e for e in eps if e.role == self.role]
        return [e for e in eps if e.role in (None, self.role, "prefill-decode")]


@dataclass(frozen=True)
class _Verdict:
    """The not-saturated filter's answer for one candidate list, and what
    it holds for: the change counts, the config, and until when (the
    oldest load sample it let through must still be fresh)."""

    shape: int
    load: int
    config: object
    eps: list[Endpoint]  # held, so its id is not reused
    out: list[Endpoint]
    # of those let through, the one scraped longest ago (its sample stands
    # while the ``load`` count does); None: none
    oldest: Endpoint | None


@dataclass
class NotSaturatedFilter(FromState):
    """Drop saturated endpoints, unless that would drop them all.

    With the metrics detector the answer depends on the endpoints' load
    samples, the thresholds and the time, so it is reused while the same
    candidate list comes, no sample or shape changed (``CHANGES``) and the
    oldest sample it let through is not yet stale: one look at the clock a
    request, not one an endpoint. A stale sample still counts as saturated
    (fail closed): it is dropped the first request after ``stale_after_s``,
    scrape or none. The concurrency detector reads live in-flight counts:
    it is asked every time."""

    name: ClassVar[str] = "not-saturated"
    _last: _Verdict | None = field(default=None, init=False, repr=False)

    def filter(self, ctx: RequestContext, eps: list[Endpoint]) -> list[Endpoint]:
        cfg = self.state.config
        if cfg.flow_control.saturation.detector == "concurrency":
            return unsaturated(eps, cfg) or eps
        now = time.monotonic()
        v = self._last
        if (v is not None and v.eps is eps and v.shape == CHANGES.shape
                and v.load == CHANGES.load and v.config is cfg
                and (v.oldest is None or not v.oldest.stale(cfg.scrape.stale_after_s, now))):
            return v.out
        ok = unsaturated(eps, cfg, now)
        oldest = min(ok, key=_LOAD_AT) if ok else None
        out = same_or(eps, ok) if ok else eps
        if v is not None and v.out == out:  # the same endpoints: the same list
            out = v.out
        self._last = _Verdict(CHANGES.shape, CHANGES.load, cfg, eps, out, oldest)
        return out


@dataclass
class RevisionFilter:
    """First filter of every profile: the endpoints of the request's
    revision. The revision is chosen once per request (kept on its
    context) and chosen again only if it loses its last ready endpoint
    while the request waits; a decode stage keeps to its prefill's."""

    revisions: Revisions
    # whether a candidate list is of one revision, while no shape changed
    _one: tuple[int, list[Endpoint], bool] = field(default=(-1, [], False), init=False,
                                                   repr=False)

    def one_revision(self, eps: list[Endpoint]) -> bool:
        at, seen, one = self._one
        if at != CHANGES.shape or seen is not eps:
            one = len({r or "" for r in set(map(_REVISION, eps))}) <= 1
            self._one = (CHANGES.shape, eps, one)  # the input held, so its id is not reused
        return one

    def filter(self, ctx: RequestContext, eps: list[Endpoint]) -> list[Endpoint]:
        if ctx.prefill is not None:
            return [e for e in eps if key_of(e) == key_of(ctx.prefill)]
        if self.one_revision(eps):
            return eps  # one revision (the usual case): nothing to choose
        capacity = ready_capacity(eps)
        if ctx.revision is None or capacity.get(ctx.revision, 0) == 0:
            chosen = self.revisions.choose(ctx.session, capacity)
            if chosen is None:
                return eps  # nothing ready in any revision: later filters say so
            ctx.revision = chosen
        return [e for e in eps if key_of(e) == ctx.revision]
