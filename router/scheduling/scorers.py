"""Scorers: each returns a score in [0, 1] per endpoint."""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ClassVar

from router.pool.endpoints import Endpoint
from router.prefix.index import PrefixIndex
from router.prefix.kv_index import KVIndex
from router.request import RequestContext
from router.scheduling.cycle import CycleState, PrefixMatch, StateKey, candidates_key
from router.scheduling.scoring import lower_is_better
from router.state import RouterState
from topology.distance import node_tier
from topology.model import Tier
from wire.tokens import BYTES_PER_TOKEN


class Stateless:
    """A scorer that reads state but records nothing about the choice."""

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        return None


def match_shares(index: PrefixIndex, ctx: RequestContext, cycle: CycleState,
                 eps: list[Endpoint], keys: list[int]) -> dict[Endpoint, float]:
    """Share of the prompt's leading blocks each endpoint holds in ``index``;
    the whole match (with the uncached tokens each endpoint would prefill)
    becomes the cycle's ``prefix``, which the proxy and metrics read."""
    if keys:
        matched = index.match(keys, (e.url for e in eps))
        frac = {e: matched.get(e.url, 0) / len(keys) for e in eps}
    else:
        matched, frac = {}, dict.fromkeys(eps, 0.0)
    cycle.prefix = PrefixMatch(
        frac, matched, len(keys),
        {e.url: int(ctx.token_estimate * (1 - f)) for e, f in frac.items()})
    return frac


# block size of the approximate prefix index unless a scorer says otherwise
APPROX_BLOCK_BYTES = 1024
# the approximate match, per (block size, candidates)
APPROX_MATCH: StateKey[dict[Endpoint, float]] = StateKey("approx-match")
# the approximate index has been told where the prompt went, per (block size, endpoint)
APPROX_REMEMBERED: StateKey[bool] = StateKey("approx-remembered")


def approx_match(state: RouterState, ctx: RequestContext, cycle: CycleState,
                 eps: list[Endpoint], block_bytes: int) -> dict[Endpoint, float]:
    """Share of the prompt each endpoint probably holds: computed once per
    cycle, block size and candidate set, whichever scorer asks first."""
    keys = cycle.approx_keys[block_bytes] = ctx.byte_blocks(block_bytes)
    return cycle.memo(APPROX_MATCH, (block_bytes, candidates_key(eps)),
                      lambda: match_shares(state.approx, ctx, cycle, eps, keys))


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

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        return approx_match(self.state, ctx, cycle, eps, self.block_bytes)

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        remember(self.state, ctx, cycle, ep, self.block_bytes)


# Tokens of prefill below which differences between endpoints hardly matter.
PREFILL_SLACK_TOKENS = 2048


@dataclass
class PrefillCostScorer:
    """The work that stands between the request and its first token on each
    endpoint: prompt tokens already sent there and still being prefilled,
    plus this prompt's tokens the endpoint does not hold. Prefix affinity and
    load in one physical quantity; the cheapest endpoint scores 1."""

    state: RouterState
    block_bytes: int = APPROX_BLOCK_BYTES
    name: ClassVar[str] = "prefill-cost"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        frac = approx_match(self.state, ctx, cycle, eps, self.block_bytes)
        cost = {e: e.prefill_tokens + ctx.token_estimate * (1 - frac[e]) for e in eps}
        best = min(cost.values())
        return {e: (best + PREFILL_SLACK_TOKENS) / (c + PREFILL_SLACK_TOKENS)
                for e, c in cost.items()}

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        remember(self.state, ctx, cycle, ep, self.block_bytes)


@dataclass
class PrecisePrefixScorer:
    """Share of the prompt's token blocks the endpoint reported holding in
    its KV events. Without a tokenizer it falls back to the approximate
    scorer."""

    state: RouterState
    kv: KVIndex | None
    fallback: ApproxPrefixScorer
    name: ClassVar[str] = "prefix-precise"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        if self.kv is None:
            return self.fallback.score(ctx, cycle, eps)
        return match_shares(self.state.precise, ctx, cycle, eps, self.kv.request_keys(ctx))

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        if self.kv is None:
            self.fallback.picked(ctx, cycle, ep)


@dataclass
class QueueScorer(Stateless):
    """Fewer waiting (and running) requests score higher; stale metrics 0."""

    state: RouterState
    name: ClassVar[str] = "queue"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        stale_after = self.state.config.scrape.stale_after_s
        fresh = {e: e.load.waiting + 0.1 * e.load.running + e.inflight
                 for e in eps if not e.stale(stale_after)}
        out = lower_is_better(fresh)
        return {e: out.get(e, 0.0) for e in eps}


@dataclass
class KVUsageScorer(Stateless):
    state: RouterState
    name: ClassVar[str] = "kv-usage"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        stale_after = self.state.config.scrape.stale_after_s
        return {e: 0.0 if e.stale(stale_after) else max(0.0, 1.0 - e.load.kv_usage)
                for e in eps}


@dataclass
class InflightTokensScorer(Stateless):
    """The router's own count of prompt tokens in flight per endpoint:
    reacts before the next scrape does."""

    state: RouterState
    name: ClassVar[str] = "inflight-tokens"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        return lower_is_better({e: float(e.inflight_tokens) for e in eps})


@dataclass
class CacheRoomScorer(Stateless):
    """Endpoints holding fewer cached prefixes score higher, so new work
    (which matches nothing) lands where it evicts least and caches stay
    balanced. Read from the approximate index, no extra bookkeeping."""

    state: RouterState
    name: ClassVar[str] = "cache-room"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        return lower_is_better({e: float(self.state.approx.held(e.url)) for e in eps})


@dataclass
class NearPrefillScorer(Stateless):
    """For the decode stage of a split request: the nearer a decode endpoint
    sits to the request's prefill endpoint in the topology, the higher it
    scores (same node 1, same NVLink domain 0.8, rack 0.6, block 0.4, zone
    0.2, else or unknown 0): that is the path its KV takes."""

    state: RouterState
    name: ClassVar[str] = "near-prefill"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        src = ctx.prefill.path if ctx.prefill is not None else None
        return {e: 0.0 if src is None or e.path is None
                else (Tier.BEYOND - node_tier(src, e.path)) / Tier.BEYOND for e in eps}


MAX_CONVERSATIONS = 100_000  # per endpoint, so memory stays bounded


@dataclass
class ConversationsScorer:
    """Places new conversations where fewest are live. A conversation is
    known by its prompt's first block (system prompt and first message:
    every later turn and every sub-agent of it starts the same), live if
    seen within ``window_s``. Turns keep coming back where a conversation
    started, so this predicts an endpoint's load better than the present
    queue does; cached tokens (cache-room) say nothing of how often they are
    reused. A known conversation scores the same everywhere: this scorer
    never pulls one away from its cache."""

    state: RouterState
    window_s: float = 300.0
    block_bytes: int = APPROX_BLOCK_BYTES
    clock: Callable[[], float] = time.monotonic
    name: ClassVar[str] = "conversations"
    _seen: dict[str, OrderedDict[int, float]] = field(default_factory=dict)

    def _live(self, url: str, now: float) -> int:
        seen = self._seen.get(url)
        if not seen:
            return 0
        while seen:
            head, at = next(iter(seen.items()))
            if now - at <= self.window_s and len(seen) <= MAX_CONVERSATIONS:
                break
            del seen[head]
        return len(seen)

    def _last_seen(self, url: str, key: int) -> float:
        seen = self._seen.get(url)
        return seen.get(key, -math.inf) if seen else -math.inf

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        keys = ctx.byte_blocks(self.block_bytes)
        now = self.clock()
        if keys and any(now - self._last_seen(e.url, keys[0]) <= self.window_s for e in eps):
            return dict.fromkeys(eps, 1.0)  # a live conversation: placed already
        # a ratio, not min-max: 3 against 4 conversations is a small
        # difference, 0 against 1 a large one
        live = {e: self._live(e.url, now) for e in eps}
        lo = min(live.values())
        return {e: (lo + 1) / (n + 1) for e, n in live.items()}

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        keys = ctx.byte_blocks(self.block_bytes)
        if keys:
            seen = self._seen.setdefault(ep.url, OrderedDict())
            seen[keys[0]] = self.clock()
            seen.move_to_end(keys[0])


@dataclass
class SessionScorer:
    """Sticks a session (``x-session-id``, or the endpoint that served a
    previous response) to its endpoint until that endpoint saturates."""

    state: RouterState
    name: ClassVar[str] = "session"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        url = ctx.affinity_url or (self.state.sessions.get(ctx.session) if ctx.session else None)
        out = dict.fromkeys(eps, 0.0)
        for e in eps:
            if e.url == url and not self.state.saturated(e):
                out[e] = 1.0
        return out

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        if ctx.session:
            self.state.remember_session(ctx.session, ep.url)
