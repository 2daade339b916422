"""Prefix affinity: the share of the prompt each endpoint holds, from the
approximate index (where earlier prompts were sent) or the precise one (the
endpoints' KV events). The approximate match is computed once per cycle,
block size and candidate set, whichever scorer (or the disaggregation
stage) asks first."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from pydantic import Field

from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.prefix.index import PrefixIndex
from toposerve.router.prefix.kv_index import KVIndex
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.cycle import CycleState, PrefixMatch, StateKey
from toposerve.router.scheduling.plugins import Deps, Params
from toposerve.router.state import RouterState
from toposerve.wire.tokens import BYTES_PER_TOKEN


def match_shares(index: PrefixIndex, ctx: RequestContext, cycle: CycleState,
                 eps: list[Endpoint], keys: list[int]) -> dict[Endpoint, float]:
    """Share of the prompt's leading blocks each endpoint that holds some of
    it holds in ``index`` (the others are left out: share 0); the whole
    match (with the uncached tokens each endpoint would prefill) becomes
    the cycle's ``prefix``, which the proxy and metrics read. Work an
    endpoint is done only for those that hold some of the prompt."""
    hits: dict[Endpoint, float] = {}
    matched: dict[str, int] = {}
    if keys:
        by_url = cycle.by_url(eps)
        matched = index.hits(keys, by_url)
        if matched:
            n = len(keys)
            hits = {by_url[u]: m / n for u, m in matched.items()}
    tokens = ctx.token_estimate
    cycle.prefix = PrefixMatch(hits, matched, len(keys),
                               {e.url: int(tokens * (1 - f)) for e, f in hits.items()}, hits)
    return hits


# block size of the approximate prefix index unless a scorer says otherwise
APPROX_BLOCK_BYTES = 1024
# the approximate match, per (block size, candidates)
APPROX_MATCH: StateKey[PrefixMatch] = StateKey("approx-match")
# the approximate index has been told where the prompt went, per (block size, endpoint)
APPROX_REMEMBERED: StateKey[bool] = StateKey("approx-remembered")


class PrefixParams(Params):
    block_bytes: int = Field(default=APPROX_BLOCK_BYTES, alias="blockBytes", ge=16)


# how long a prompt an endpoint has begun to answer counts as held there
# without the engine's events saying so: they come once it has prefilled
PENDING_S = 5.0


class PrecisePrefixParams(PrefixParams):
    pending_s: float = Field(default=PENDING_S, alias="pendingSeconds", ge=0, le=600)


def approx_match(state: RouterState, ctx: RequestContext, cycle: CycleState,
                 eps: list[Endpoint], block_bytes: int) -> dict[Endpoint, float]:
    """Share of the prompt each endpoint probably holds: computed once per
    cycle, block size and candidate set, whichever scorer asks first."""
    return approx_prefix(state, ctx, cycle, eps, block_bytes).shares


def approx_prefix(state: RouterState, ctx: RequestContext, cycle: CycleState,
                  eps: list[Endpoint], block_bytes: int) -> PrefixMatch:
    """``approx_match``, whole: with the candidates that hold some of it."""
    keys = cycle.approx_keys[block_bytes] = ctx.byte_blocks(block_bytes)

    def compute() -> PrefixMatch:
        match_shares(state.approx, ctx, cycle, eps, keys)
        assert cycle.prefix is not None
        return cycle.prefix

    return cycle.memo(APPROX_MATCH, (block_bytes, cycle.urls(eps)), compute)


def remember(state: RouterState, ctx: RequestContext, cycle: CycleState, ep: Endpoint,
             block_bytes: int) -> None:
    """Record that the prompt went to ``ep`` (once per cycle and block size,
    however many scorers read the approximate index)."""
    if cycle.get(APPROX_REMEMBERED, (block_bytes, ep.url)):
        return
    cycle.put(APPROX_REMEMBERED, (block_bytes, ep.url), True)
    if ep.num_gpu_blocks and ep.block_size:
        tokens = ep.num_gpu_blocks * ep.block_size
        state.approx.set_capacity(ep.url, tokens * BYTES_PER_TOKEN // block_bytes)
    state.approx.add(ep.url, ctx.byte_blocks(block_bytes))


@dataclass
class ApproxPrefixScorer:
    """Share of the prompt's leading blocks the endpoint probably holds,
    judged from where earlier prompts were sent. Tokenizer-free."""

    state: RouterState
    block_bytes: int = APPROX_BLOCK_BYTES
    name: ClassVar[str] = "prefix-approx"
    params_model: ClassVar[type[PrefixParams]] = PrefixParams

    @classmethod
    def build(cls, params: PrefixParams, deps: Deps) -> ApproxPrefixScorer:
        return cls(deps.state, params.block_bytes)

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        return approx_match(self.state, ctx, cycle, eps, self.block_bytes)

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        remember(self.state, ctx, cycle, ep, self.block_bytes)


@dataclass
class PrecisePrefixScorer:
    """Share of the prompt's token blocks the endpoint reported holding in
    its KV events, or has been sent since: a prompt counts as held where
    it went while on its way there and ``pending_s`` after that endpoint
    begins to answer, since its events come only once the engine has
    prefilled it. Requests arriving together with a new shared prefix (an
    agent's first turn and the sub-agents it forks) so follow the first,
    as with the approximate index. Without a tokenizer it falls back to
    the approximate scorer."""

    state: RouterState
    kv: KVIndex | None
    fallback: ApproxPrefixScorer
    pending_s: float = PENDING_S
    name: ClassVar[str] = "prefix-precise"
    params_model: ClassVar[type[PrecisePrefixParams]] = PrecisePrefixParams

    @classmethod
    def build(cls, params: PrecisePrefixParams, deps: Deps) -> PrecisePrefixScorer:
        return cls(deps.state, deps.kv, ApproxPrefixScorer.build(params, deps), params.pending_s)

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        if self.kv is None:
            return self.fallback.score(ctx, cycle, eps)
        keys = cycle.precise_keys = self.kv.request_keys(ctx)
        return match_shares(self.state.precise, ctx, cycle, eps, keys)

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        if self.kv is None:
            self.fallback.picked(ctx, cycle, ep)
        elif cycle.precise_keys and self.pending_s:
            # held by time, not settled: the events, not the answer, confirm it
            self.state.precise.send(ep.url, cycle.precise_keys, self.pending_s)
