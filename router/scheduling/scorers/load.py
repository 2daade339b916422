"""Spreading the work: fewer queued requests, less KV cache in use, fewer
prompt tokens in flight, fewer cached prefixes, fewer live conversations
score higher."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import repeat
from operator import attrgetter
from typing import ClassVar, Generic, TypeVar

from pydantic import Field

from toposerve.router.pool.endpoints import Endpoint, fresh_loads
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.cycle import CycleState
from toposerve.router.scheduling.plugins import Deps, FromState, Params, Stateless
from toposerve.router.scheduling.scorers.prefill import pace
from toposerve.router.scheduling.scorers.prefix import APPROX_BLOCK_BYTES
from toposerve.router.scheduling.scoring import lower_is_better
from toposerve.router.state import RouterState

T = TypeVar("T")
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


@dataclass
class QueueScorer(FromState, Stateless):
    """Fewer waiting (and running) requests score higher; stale metrics 0."""

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
class KVUsageScorer(FromState, Stateless):
    name: ClassVar[str] = "kv-usage"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        stale_after, now = self.state.config.scrape.stale_after_s, time.monotonic()
        loads = fresh_loads(eps, stale_after, now)
        return {e: 0.0 if s is None else max(0.0, 1.0 - s.kv_usage)
                for e, s in zip(eps, loads, strict=True)}


@dataclass
class InflightTokensScorer(FromState, Stateless):
    """The router's own count of prompt tokens in flight per endpoint:
    reacts before the next scrape does."""

    name: ClassVar[str] = "inflight-tokens"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        return lower_is_better(dict(zip(eps, map(INFLIGHT_TOKENS, eps), strict=True)))


@dataclass
class CacheRoomScorer(FromState, Stateless):
    """Endpoints holding fewer cached prefixes score higher, so new work
    (which matches nothing) lands where it evicts least and caches stay
    balanced. Read from the approximate index, no extra bookkeeping; the
    prompts on their way to an endpoint count as held there, so a burst of
    new conversations routed before any is answered spreads as they would
    one after another rather than all going where least was held."""

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


MAX_CONVERSATIONS = 100_000  # per endpoint, so memory stays bounded


class ConversationParams(Params):
    window_s: float = Field(default=300.0, alias="windowSeconds", gt=0)
    block_bytes: int = Field(default=APPROX_BLOCK_BYTES, alias="blockBytes", ge=16)


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
    params_model: ClassVar[type[ConversationParams]] = ConversationParams
    # url -> conversation -> last seen, oldest first (its len: live there)
    _seen: dict[str, OrderedDict[int, float]] = field(default_factory=dict)
    # (url, conversation) -> last seen, over all endpoints, oldest first
    _order: OrderedDict[tuple[str, int], float] = field(default_factory=OrderedDict)
    _where: dict[int, set[str]] = field(default_factory=dict)  # conversation -> its endpoints
    _last: Remembered[tuple[list[int] | None, dict[Endpoint, float]]] | None = field(
        default=None, init=False, repr=False)

    @classmethod
    def build(cls, params: ConversationParams, deps: Deps) -> ConversationsScorer:
        return cls(deps.state, params.window_s, params.block_bytes)

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
