"""What stands between a request and its first token on each endpoint
(backlog, uncached prompt, the endpoint's learned speed), and, for the
decode stage of a split request, how far an endpoint is from where the
prefill ran."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from operator import attrgetter
from typing import ClassVar, NamedTuple

from pydantic import Field, field_validator

from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.cycle import CycleState, StateKey
from toposerve.router.scheduling.plugins import Deps, FromState, Stateless
from toposerve.router.scheduling.scorers.prefix import (
    APPROX_BLOCK_BYTES,
    PrefixParams,
    approx_prefix,
    remember,
)
from toposerve.router.scheduling.scoring import Wait
from toposerve.router.state import RouterState
from toposerve.topology.transfer import closeness, transfer

# Tokens of prefill below which differences between endpoints hardly matter.
PREFILL_SLACK_TOKENS = 2048
PREFILL_TOKENS = attrgetter("prefill_tokens")
PREFILL_SPEED = attrgetter("prefill_s_per_token")
# Learned speeds of like servers differ by their batches' luck: within
# this factor of the candidates' median an endpoint counts as typical.
SLOW_FACTOR = 1.5


class Pace(NamedTuple):
    """The candidates learned ``SLOW_FACTOR`` or more times slower or
    faster than their median learned prefill speed, by that factor (empty
    on a fleet of like servers, or while none is learned), and that median
    (seconds a token; 0 when ``odd`` is empty)."""

    typical: float
    odd: dict[Endpoint, float]


# the candidates' pace, per candidate set
PACE: StateKey[Pace] = StateKey("pace")


def pace(cycle: CycleState, eps: list[Endpoint]) -> Pace:
    """The candidates' ``Pace``, once per cycle and candidate set (a pass
    over their speeds, no call an endpoint)."""
    def compute() -> Pace:
        speeds = list(map(PREFILL_SPEED, eps))
        known = [v for v in speeds if v]
        if not known or max(known) < SLOW_FACTOR * min(known):
            # none learned, or like servers (none 1.5x another, so none that
            # far from the median): the usual case, without the median
            return Pace(0.0, {})
        ref = statistics.median(known)
        return Pace(ref, {e: r for e, v in zip(eps, speeds, strict=True)
                          if v and ((r := v / ref) >= SLOW_FACTOR or r * SLOW_FACTOR <= 1)})

    return cycle.memo(PACE, cycle.urls(eps), compute)


# An endpoint predicted to take this many times the fastest's wait for a
# first token, and this much longer, is not worth its cache (defaults).
MAX_SLOWDOWN = 3.0
MIN_EXTRA_S = 0.05


class PrefillCostParams(PrefixParams):
    max_slowdown: float = Field(
        default=MAX_SLOWDOWN, alias="maxSlowdown", ge=0,
        description="an endpoint learned 1.5x or more slower than the median, predicted to wait "
                    "this many times the fastest's for a first token (and minExtraSeconds "
                    "longer), goes to the back of the ranking; 0: never")
    min_extra_s: float = Field(default=MIN_EXTRA_S, alias="minExtraSeconds", ge=0)

    @field_validator("max_slowdown")
    @classmethod
    def _slowdown(cls, v: float) -> float:
        if 0 < v < 1:
            raise ValueError("must be 0 (off) or at least 1: the fastest itself waits 1 times "
                             "its own wait")
        return v


@dataclass
class PrefillCostScorer:
    """The work that stands between the request and its first token on each
    endpoint: prompt tokens already sent there and still being prefilled,
    plus this prompt's tokens the endpoint does not hold. Prefix affinity and
    load in one physical quantity; the cheapest endpoint scores 1.

    Where endpoints' learned speeds (``Endpoint.prefill_s_per_token``)
    differ clearly (``pace``), a token of work weighs by its endpoint's
    speed, so a slow server's backlog counts for what it costs; and a
    clearly slow candidate predicted to wait ``max_slowdown`` times the
    fastest's (and ``min_extra_s`` more) goes to the back of the ranking,
    whatever its prefix or session affinity. Between like servers the
    trade of affinity against backlog stays with the profile's weights."""

    state: RouterState
    block_bytes: int = APPROX_BLOCK_BYTES
    max_slowdown: float = MAX_SLOWDOWN
    min_extra_s: float = MIN_EXTRA_S
    name: ClassVar[str] = "prefill-cost"
    params_model: ClassVar[type[PrefillCostParams]] = PrefillCostParams

    @classmethod
    def build(cls, params: PrefillCostParams, deps: Deps) -> PrefillCostScorer:
        return cls(deps.state, params.block_bytes, params.max_slowdown, params.min_extra_s)

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        match = approx_prefix(self.state, ctx, cycle, eps, self.block_bytes)
        tokens = ctx.token_estimate
        # an endpoint that holds none of it: its backlog and the whole prompt
        whole = tokens * 1.0
        cost = dict(zip(eps, [p + whole for p in map(PREFILL_TOKENS, eps)], strict=True))
        for e, f in match.hits.items():
            cost[e] = e.prefill_tokens + tokens * (1 - f)
        if odd := (p := pace(cycle, eps)).odd:  # servers of clearly other speeds: work in time
            cost = {e: c * odd.get(e, 1.0) for e, c in cost.items()}
            if self.max_slowdown and (slow := {e for e, r in odd.items() if r > 1}):
                cycle.wait = Wait({e: c * p.typical for e, c in cost.items()}, slow,
                                  self.max_slowdown, self.min_extra_s)
        k = min(cost.values()) + PREFILL_SLACK_TOKENS
        return dict(zip(eps, [k / (c + PREFILL_SLACK_TOKENS) for c in cost.values()],
                        strict=True))

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        remember(self.state, ctx, cycle, ep, self.block_bytes)


@dataclass
class NearPrefillScorer(FromState, Stateless):
    """For the decode stage of a split request: the nearer a decode endpoint
    sits to the request's prefill endpoint, the higher it scores, by
    ``topology.transfer.closeness``: the node tier first (same node, NVLink
    domain, rack, block, zone, beyond), then inside it how near the devices
    the two pods hold are (GPUs of one NVLink domain, PCIe switch, root,
    NUMA node; between nodes, each GPU's NIC). That is the path its KV
    takes. A pod that holds no claim is placed by its node; an endpoint
    whose node is unknown scores 0."""

    name: ClassVar[str] = "near-prefill"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        src = ctx.prefill
        if src is None or src.path is None:
            return dict.fromkeys(eps, 0.0)
        at, held = src.path, src.devices
        return {e: 0.0 if e.path is None else closeness(transfer(at, held, e.path, e.devices))
                for e in eps}
