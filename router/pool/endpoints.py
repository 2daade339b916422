"""The pool of model-server endpoints the router can send to, and what it
knows of each: identity (from discovery), health and load (from scraping),
and the requests in flight to it: this process's own, plus those the other
router processes sharing its view report (``toposerve.router.ha.peers``)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from toposerve.router.pool.devices import DeviceTaint
from toposerve.topology.model import DomainPath
from toposerve.topology.transfer import NO_DEVICES, DeviceSet

# A first byte teaches the endpoint's prefill speed only when at least this
# much prefill stood before it, so fixed costs (HTTP, scheduling, one decode
# step) do not pass for speed; each such sample moves the estimate this far
# (``Endpoint.learn_prefill``).
LEARN_MIN_TOKENS = 2048
LEARN_RATE = 0.25


# frozen: a sample is replaced whole (which ``Endpoint`` counts), never changed
@dataclass(frozen=True, slots=True)  # read for every candidate of every request: no instance dict
class LoadSample:
    waiting: float = 0.0
    running: float = 0.0
    kv_usage: float = 0.0
    at: float = 0.0  # monotonic time of the scrape; 0 = never


class Changes:
    """Counts of changes to what the filters read of the endpoints, over
    every endpoint of the process: ``shape`` for the pool's membership and
    an endpoint's models, role, revision, health or draining; ``load`` for
    a new load sample. A list derived from the pool (the routable ones, a
    filter's answer) is reused while the counts it was made at stand.
    ``own`` counts changes to this process's in-flight counts, which the
    other router processes are told of when it moves."""

    __slots__ = ("load", "own", "shape")

    def __init__(self) -> None:
        self.shape = 0
        self.load = 0
        self.own = 0


CHANGES = Changes()
_SHAPE = frozenset({"models", "role", "revision", "healthy", "draining", "taints"})


@dataclass(eq=False, slots=True)  # identity: one object per URL, hashed in C; no dict
class Endpoint:
    url: str
    role: str | None = None
    revision: str | None = None
    models: frozenset[str] = frozenset()
    path: DomainPath | None = None  # its node's place in the topology (host: the node)
    devices: DeviceSet = NO_DEVICES  # what its pod's claims hold (``pool.devices``)
    taints: tuple[DeviceTaint, ...] = ()  # on those devices: not routed while any
    bootstrap_port: int | None = None  # SGLang prefill servers: their bootstrap port
    kv_events: str | None = None
    kv_events_replay: str | None = None
    healthy: bool = False
    scraped: bool = False  # asked once, whatever the answer: its health is known
    draining: bool = False
    load: LoadSample = field(default_factory=LoadSample)
    scrape_failures: int = 0
    block_size: int | None = None  # from vllm:cache_config_info
    num_gpu_blocks: int | None = None
    started_at: float | None = None  # its process' start, where /metrics tells it
    # in flight to it from every router process sharing this view: this
    # one's (own_*) plus what the others last reported (peer_*); what the
    # filters, scorers and flow control read
    inflight: int = 0
    inflight_tokens: int = 0
    prefill_tokens: int = 0  # uncached prompt tokens sent but not yet answered
    own_inflight: int = 0
    own_inflight_tokens: int = 0
    own_prefill_tokens: int = 0
    peer_inflight: int = 0
    peer_inflight_tokens: int = 0
    peer_prefill_tokens: int = 0
    # seconds a token of prefill holds back a first byte, learned from this
    # endpoint's streamed answers (0: none yet): how slow it is, queueing for
    # a free slot included
    prefill_s_per_token: float = 0.0
    idle: asyncio.Event = field(default_factory=asyncio.Event)

    def __post_init__(self) -> None:
        self.idle.set()

    def __setattr__(self, name: str, value: object) -> None:
        # every write is seen, whoever makes it (the scrape, discovery, a
        # test): a list made before it is not reused after it
        object.__setattr__(self, name, value)
        if name == "load":
            CHANGES.load += 1
        elif name in _SHAPE:
            CHANGES.shape += 1

    @property
    def name(self) -> str:
        return self.url.removeprefix("http://").removeprefix("https://")

    def begin(self, tokens: int, prefill: int) -> None:
        self.own_inflight += 1
        self.own_inflight_tokens += tokens
        self.own_prefill_tokens += prefill
        self.inflight += 1
        self.inflight_tokens += tokens
        self.prefill_tokens += prefill
        CHANGES.own += 1
        self.idle.clear()

    def first_byte(self, prefill: int) -> None:
        """The prompt is processed: its prefill no longer queues others."""
        self.own_prefill_tokens -= prefill
        self.prefill_tokens -= prefill
        CHANGES.own += 1

    def learn_prefill(self, seconds: float, tokens: int, backlog: int) -> None:
        """A first byte came ``seconds`` after the request was sent, with
        ``tokens`` of prefill then before it: its own, and ``backlog`` of
        other requests' still being prefilled there.

        Engines differ in what a backlog costs a newcomer: vLLM's steps
        share a token budget, so it waits behind the backlog; a simulator
        that prices each request alone makes it wait for none of it. So
        only a sample with no backlog measures the speed. One with a
        backlog bounds it from below (as if all of the backlog went first),
        and only raises an estimate that is already under that bound. On
        llm-d-inference-sim, samples with a backlog read 0.1-20 us a token
        where the speed was 20, and like servers were learned up to 60x
        apart (docs/benchmarks.md, "Sixth pass")."""
        if tokens < LEARN_MIN_TOKENS:
            return  # mostly fixed overhead: would make the endpoint look fast
        sample = seconds / tokens
        old = self.prefill_s_per_token
        if backlog and not 0 < old < sample:
            return  # a lower bound: nothing learned yet, or the estimate is above it
        self.prefill_s_per_token = sample if old == 0 else old + LEARN_RATE * (sample - old)

    def end(self, tokens: int, prefill: int) -> None:
        """The answer is over; ``prefill`` is what ``first_byte`` has not yet
        released (all of it when no byte came)."""
        self.own_prefill_tokens -= prefill
        self.own_inflight -= 1
        self.own_inflight_tokens -= tokens
        self.prefill_tokens -= prefill
        self.inflight -= 1
        self.inflight_tokens -= tokens
        CHANGES.own += 1
        if self.own_inflight == 0:  # drain waits for this process's own
            self.idle.set()

    def own(self) -> tuple[int, int, int]:
        """This process's requests, prompt tokens and prefill tokens in flight here."""
        return self.own_inflight, self.own_inflight_tokens, self.own_prefill_tokens

    def shared(self, inflight: int, tokens: int, prefill: int) -> None:
        """What the other router processes sharing this view have in flight
        here, as they last reported it."""
        self.peer_inflight, self.peer_inflight_tokens, self.peer_prefill_tokens = (
            inflight, tokens, prefill)
        self.inflight = self.own_inflight + inflight
        self.inflight_tokens = self.own_inflight_tokens + tokens
        self.prefill_tokens = self.own_prefill_tokens + prefill

    def stale(self, stale_after_s: float, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        return fresh_loads((self,), stale_after_s, now)[0] is None


def fresh_loads(eps: Iterable[Endpoint], stale_after_s: float, now: float
                ) -> list[LoadSample | None]:
    """Each endpoint's load sample, or None where it is stale: never
    scraped, or scraped more than ``stale_after_s`` before ``now``. The one
    test of staleness, made for a candidate list in one comprehension, as
    the scheduling path needs: no call an endpoint, one look at the clock."""
    return [s if (s := e.load).at != 0 and now - s.at <= stale_after_s else None for e in eps]


@dataclass
class Work:
    """How much a request weighs on an endpoint: its prompt tokens, and how
    many of them that endpoint must prefill (it may hold the rest); and
    whom to tell which endpoint answered (the scheduler's decision)."""

    tokens: int
    uncached: dict[str, int]
    answered: Callable[[Endpoint], None] | None = None

    def prefill(self, ep: Endpoint) -> int:
        return self.uncached.get(ep.url, self.tokens)


class Pool:
    """Endpoints by URL. Discovery adds and drains; the proxy reads."""

    def __init__(self) -> None:
        self._eps: dict[str, Endpoint] = {}
        self.changed = asyncio.Event()
        self._routable: tuple[int, list[Endpoint]] = (-1, [])

    def __iter__(self) -> Iterator[Endpoint]:
        return iter(list(self._eps.values()))  # a copy: discovery may change the pool

    def __len__(self) -> int:
        return len(self._eps)

    def get(self, url: str) -> Endpoint | None:
        return self._eps.get(url)

    def upsert(self, ep: Endpoint) -> Endpoint:
        cur = self._eps.get(ep.url)
        if cur is None:
            self._eps[ep.url] = ep
            CHANGES.shape += 1
            self.changed.set()
            return ep
        cur.role, cur.revision, cur.path = ep.role, ep.revision, ep.path
        cur.devices, cur.taints = ep.devices, ep.taints
        cur.bootstrap_port = ep.bootstrap_port
        cur.kv_events, cur.kv_events_replay = ep.kv_events, ep.kv_events_replay
        cur.draining = False
        return cur

    def routable(self) -> list[Endpoint]:
        """The endpoints not draining and holding no tainted device: the
        same list object until the pool or an endpoint's shape changes
        (``CHANGES``), so the filters' and scorers' answers for it are
        reused too. Not to be changed."""
        at, eps = self._routable
        if at != CHANGES.shape:
            at = CHANGES.shape
            eps = [e for e in self._eps.values() if not e.draining and not e.taints]
            self._routable = (at, eps)
        return eps

    def may_serve(self, model: str) -> bool:
        """Some endpoint not draining serves ``model`` or has not said what it
        serves yet (one out of rotation for a tainted device still serves it:
        the model exists, its servers are unwell): a walk that stops at the
        first, with no list made."""
        return any(not e.draining and (not e.models or model in e.models)
                   for e in self._eps.values())

    async def drain(self, url: str, timeout_s: float) -> None:
        """No new requests; remove once in-flight ones finish (or time runs out)."""
        ep = self._eps.get(url)
        if ep is None:
            return
        ep.draining = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ep.idle.wait(), timeout_s)
        if self._eps.get(url) is ep and ep.draining:
            del self._eps[url]
            CHANGES.shape += 1
            self.changed.set()
