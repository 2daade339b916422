"""Scorers: each returns a score in [0, 1] per endpoint."""

from __future__ import annotations

import statistics
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import ClassVar, Generic, NamedTuple, TypeVar

from toposerve.router.pool.endpoints import Endpoint, fresh_loads
from toposerve.router.prefix.index import PrefixIndex
from toposerve.router.prefix.kv_index import KVIndex
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.cycle import CycleState, PrefixMatch, StateKey
from toposerve.router.scheduling.scoring import Wait, lower_is_better
from toposerve.router.state import RouterState
from toposerve.topology.distance import node_tier
from toposerve.topology.model import Tier
from toposerve.wire.tokens import BYTES_PER_TOKEN

T = TypeVar("T")
PREFILL_TOKENS = attrgetter("prefill_tokens")
INFLIGHT_TOKENS = attrgetter("inflight_tokens")


@dataclass(frozen=True)
class Remembered(Generic[T]):
    """A scorer's answer for a candidate list (held, so its id is not
    reused) and what it was computed from, kept for the next request: the
    index and the live counts move at one endpoint a request if at all, and
    the same inputs give the same scores (a copy is handed out, never it)."""

    eps: list[Endpoint]
    of: T
    scores: dict[Endpoint, float]


class Stateless:
    """A scorer that reads state but records nothing about the choice."""

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        return None


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

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        return approx_match(self.state, ctx, cycle, eps, self.block_bytes)

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        remember(self.state, ctx, cycle, ep, self.block_bytes)


# Tokens of prefill below which differences between endpoints hardly matter.
PREFILL_SLACK_TOKENS = 2048
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
        stale_after, now = self.state.config.scrape.stale_after_s, time.monotonic()
        loads = fresh_loads(eps, stale_after, now)
        fresh = {e: s.waiting + 0.1 * s.running + e.inflight
                 for e, s in zip(eps, loads, strict=True) if s is not None}
        out = dict.fromkeys(eps, 0.0)
        out.update(lower_is_better(fresh))
        return out


@dataclass
class KVUsageScorer(Stateless):
    state: RouterState
    name: ClassVar[str] = "kv-usage"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        stale_after, now = self.state.config.scrape.stale_after_s, time.monotonic()
        loads = fresh_loads(eps, stale_after, now)
        return {e: 0.0 if s is None else max(0.0, 1.0 - s.kv_usage)
                for e, s in zip(eps, loads, strict=True)}


@dataclass
class InflightTokensScorer(Stateless):
    """The router's own count of prompt tokens in flight per endpoint:
    reacts before the next scrape does."""

    state: RouterState
    name: ClassVar[str] = "inflight-tokens"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        return lower_is_better(dict(zip(eps, map(INFLIGHT_TOKENS, eps), strict=True)))


@dataclass
class CacheRoomScorer(Stateless):
    """Endpoints holding fewer cached prefixes score higher, so new work
    (which matches nothing) lands where it evicts least and caches stay
    balanced. Read from the approximate index, no extra bookkeeping."""

    state: RouterState
    name: ClassVar[str] = "cache-room"
    _last: Remembered[list[int]] | None = field(default=None, init=False, repr=False)

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        held = self.state.approx.held_of(cycle.urls(eps))
        if (last := self._last) is not None and last.eps is eps and last.of == held:
            return last.scores.copy()  # a request that added no block moved nothing
        lo, hi = min(held, default=0), max(held, default=0)
        if hi == lo:  # lower_is_better, over the list
            out = dict.fromkeys(eps, 1.0)
        else:
            span = hi - lo
            out = dict(zip(eps, [(hi - v) / span for v in held], strict=True))
        self._last = Remembered(eps, held, out.copy())
        return out


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
    reused. An endpoint learned to prefill ``SLOW_FACTOR`` or more times
    slower (or faster) than the candidates' median counts each of its
    conversations that many times over (or under): every turn there takes
    as much longer (or shorter). A known
    conversation scores the same everywhere: this scorer never pulls one
    away from its cache.

    What is live is kept by time over all endpoints (the oldest forgotten
    first, as the window passes it) and by conversation, so a request costs
    a look-up of its own conversation and a count an endpoint, not a walk
    over each endpoint's conversations."""

    state: RouterState
    window_s: float = 300.0
    block_bytes: int = APPROX_BLOCK_BYTES
    clock: Callable[[], float] = time.monotonic
    name: ClassVar[str] = "conversations"
    # url -> conversation -> last seen, oldest first (its len: live there)
    _seen: dict[str, OrderedDict[int, float]] = field(default_factory=dict)
    # (url, conversation) -> last seen, over all endpoints, oldest first
    _order: OrderedDict[tuple[str, int], float] = field(default_factory=OrderedDict)
    _where: dict[int, set[str]] = field(default_factory=dict)  # conversation -> its endpoints
    _last: Remembered[tuple[list[int] | None, dict[Endpoint, float]]] | None = field(
        default=None, init=False, repr=False)

    def _forget(self, url: str, key: int) -> None:
        del self._seen[url][key]
        self._order.pop((url, key), None)
        where = self._where[key]
        where.discard(url)
        if not where:
            del self._where[key]

    def _expire(self, now: float) -> None:
        order = self._order
        while order:
            (url, key), at = next(iter(order.items()))
            if now - at <= self.window_s:
                break
            self._forget(url, key)

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        keys = ctx.byte_blocks(self.block_bytes)
        self._expire(self.clock())
        # a live conversation here: placed already (a walk over its
        # endpoints, which the candidates' dict is asked about)
        odd: dict[Endpoint, float] = {}
        if (keys and (where := self._where.get(keys[0]))
                and not cycle.by_url(eps).keys().isdisjoint(where)):
            live = None
        else:
            # a ratio, not min-max: 3 against 4 conversations is a small
            # difference, 0 against 1 a large one
            live = list(map(len, map(self._seen.get, cycle.urls(eps), repeat(()))))
            odd = pace(cycle, eps).odd
        of = (live, odd)
        if (last := self._last) is not None and last.eps is eps and last.of == of:
            return last.scores.copy()  # the live counts as the last request saw them
        if live is None:
            out = dict.fromkeys(eps, 1.0)
        else:
            # with the new one counted; on a slow endpoint a conversation
            # weighs as much more as each of its turns takes there
            load = [(n + 1.0) * odd.get(e, 1.0) for n, e in zip(live, eps, strict=True)
                    ] if odd else [n + 1.0 for n in live]
            lo = min(load)
            out = dict(zip(eps, [lo / n for n in load], strict=True))
        self._last = Remembered(eps, of, out.copy())
        return out

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        keys = ctx.byte_blocks(self.block_bytes)
        if keys:
            url, key, now = ep.url, keys[0], self.clock()
            seen = self._seen.setdefault(url, OrderedDict())
            seen[key] = now
            seen.move_to_end(key)
            self._order[(url, key)] = now
            self._order.move_to_end((url, key))
            self._where.setdefault(key, set()).add(url)
            while len(seen) > MAX_CONVERSATIONS:
                self._forget(url, next(iter(seen)))


@dataclass
class SessionScorer:
    """Sticks a session (``x-session-id``, or the endpoint that served a
    previous response) to its endpoint until that endpoint saturates."""

    state: RouterState
    name: ClassVar[str] = "session"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        url = ctx.affinity_url or (self.state.sessions.get(ctx.session) if ctx.session else None)
        # the session's endpoint alone (the others are left out: 0)
        if (url is not None and (e := cycle.by_url(eps).get(url)) is not None
                and not self.state.saturated(e)):
            return {e: 1.0}
        return {}

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        if ctx.session:
            self.state.remember_session(ctx.session, ep.url)
