"""Which endpoint holds which prefix blocks: a per-endpoint LRU of block
keys plus a reverse map from key to endpoints, so a lookup walks only the
blocks a request shares with somebody. Prompts on their way to an endpoint
(sent, not yet answered) count as held there too: requests that arrive
together with the same prefix (an agent's turn and the sub-agents it forks)
then follow the first instead of each prefilling it cold elsewhere."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Container, Iterable
from dataclasses import dataclass
from functools import cached_property

DEFAULT_CAPACITY = 200_000
# how long a sent prompt counts as held without an answer: one whose every
# attempt failed is forgotten after this (an answered one at once)
SENT_HOLD_S = 10.0


@dataclass(eq=False)
class Sent:
    """A prompt's chain sent to ``url`` and not yet answered."""

    index: PrefixIndex
    url: str
    keys: list[int]
    until: float
    new: int  # its blocks ``url`` did not hold when it was sent
    done: bool = False

    def settle(self) -> None:
        """Answered (``add`` records where) or given up: no longer held."""
        self.index.settle(self)

    @cached_property
    def key_set(self) -> frozenset[int]:
        """``keys`` as a set, made only when a removal there asks (the
        engine's events): a removal of few blocks then costs a look-up
        each, and the requests that never meet one pay nothing."""
        return frozenset(self.keys)


def _held_prefix(lru: Container[int], keys: list[int], lo: int = 0) -> int:
    """Leading ``keys`` in ``lru``, knowing the first ``lo`` are: what an
    endpoint holds of a chain is a prefix of it (its blocks are added, and
    so evicted, together, the head last), so a binary search."""
    hi = len(keys) + 1  # keys[:lo] held; keys[:hi] not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if keys[mid - 1] in lru:
            lo = mid
        else:
            hi = mid
    return lo


def common_prefix(a: list[int], b: list[int]) -> int:
    """Leading keys two chains share. Keys are chained hashes, so equal
    keys at a position mean equal chains up to it: a binary search."""
    lo, hi = 0, min(len(a), len(b)) + 1  # a[:lo] == b[:lo]; a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[mid - 1] == b[mid - 1]:
            lo = mid
        else:
            hi = mid
    return lo


class PrefixIndex:
    def __init__(self, default_capacity: int = DEFAULT_CAPACITY,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._where: dict[int, set[str]] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}
        self.default_capacity = default_capacity
        self.clock = clock
        self._sent: dict[int, list[Sent]] = {}  # by first key
        self._sent_order: deque[Sent] = deque()  # oldest first, to forget the unanswered
        # by endpoint, then last key: found again when that block is stored there
        self._sent_to: dict[str, dict[int, list[Sent]]] = {}
        self._sent_new: dict[str, int] = {}  # by endpoint: blocks on their way there

    def __len__(self) -> int:
        return sum(len(x) for x in self._lru.values())

    def held(self, url: str) -> int:
        """Blocks the index believes ``url`` holds."""
        return len(self._lru.get(url, ()))

    def set_capacity(self, url: str, blocks: int) -> None:
        self._capacity[url] = max(1, blocks)
        self._evict(url)

    def held_of(self, urls: Iterable[str]) -> list[int]:
        """Blocks each URL holds or has on their way to it (sent, not yet
        answered, that it did not hold), in order, without a call a URL:
        requests routed together count each other's prompts, as they will
        be held once answered."""
        lru, new = self._lru, self._sent_new
        return [len(lru.get(u, ())) + new.get(u, 0) for u in urls]

    def match(self, keys: list[int], urls: Iterable[str]) -> dict[str, int]:
        """Leading blocks of ``keys`` each endpoint holds (0 for none)."""
        matched = dict.fromkeys(urls, 0)
        matched.update(self.hits(keys, matched))
        return matched

    def hits(self, keys: list[int], among: Container[str]) -> dict[str, int]:
        """Leading blocks of ``keys`` held by each endpoint of ``among``
        that holds any (the others are left out): a walk over the holders
        of the first block and the prompts sent with it, not over
        ``among``. A prompt's blocks are added (and so evicted) together,
        its head last, so what an endpoint holds of a chain is a prefix of
        it: a binary search per holder finds its length."""
        out: dict[str, int] = {}
        if not keys:
            return out
        if sent := self._sent.get(keys[0]):
            now = self.clock()
            for s in sent:
                if s.url in among and s.until > now:
                    n = common_prefix(s.keys, keys)
                    if n > out.get(s.url, 0):
                        out[s.url] = n
        first = self._where.get(keys[0])
        if not first:
            return out
        whole = len(keys)
        for url in first:
            if url not in among or (had := out.get(url, 0)) == whole:
                continue  # not a candidate, or all of it on its way there
            lru = self._lru[url]
            out[url] = max(had, _held_prefix(lru, keys, 1))
        return out

    def send(self, url: str, keys: list[int], hold_s: float = SENT_HOLD_S) -> Sent | None:
        """``keys`` are on their way to ``url``: held there for ``match``
        until ``settle`` (or ``hold_s``), or until ``url`` is known to hold
        them (``add``) or to have lost some (``remove``, ``clear``). None
        when there is nothing to hold: no keys, or ``url`` holds them all."""
        now = self.clock()
        order = self._sent_order
        # forgotten oldest first; a hold shorter than the one before it waits
        # behind it, but still stops counting when its time is up (``hits``)
        while order and (order[0].done or order[0].until <= now):
            self.settle(order.popleft())
        lru: Container[int] = self._lru.get(url, ())
        if not keys or keys[-1] in lru:
            return None
        s = Sent(self, url, keys, now + hold_s, len(keys) - _held_prefix(lru, keys))
        self._sent_new[url] = self._sent_new.get(url, 0) + s.new
        self._sent.setdefault(keys[0], []).append(s)
        self._sent_to.setdefault(url, {}).setdefault(keys[-1], []).append(s)
        order.append(s)
        return s

    def settle(self, s: Sent) -> None:
        if s.done:
            return
        s.done = True
        sent = self._sent[s.keys[0]]
        sent.remove(s)
        if not sent:
            del self._sent[s.keys[0]]
        if left := self._sent_new[s.url] - s.new:
            self._sent_new[s.url] = left
        else:
            del self._sent_new[s.url]
        to = self._sent_to[s.url]
        last = to[s.keys[-1]]
        last.remove(s)
        if not last:
            del to[s.keys[-1]]
            if not to:
                del self._sent_to[s.url]

    def _settle_at(self, url: str, which: Callable[[Sent], bool]) -> None:
        for s in [s for same in self._sent_to.get(url, {}).values() for s in same if which(s)]:
            self.settle(s)

    def add(self, url: str, keys: list[int]) -> None:
        """Record ``keys`` (a prompt's chain) as held by ``url``, most recently
        used first at its head, as engines free a finished sequence's blocks
        tail first: under pressure the tail is forgotten before the head."""
        lru = self._lru.setdefault(url, OrderedDict())
        for k in reversed(keys):
            if k in lru:
                lru.move_to_end(k)
            else:
                lru[k] = None
                self._where.setdefault(k, set()).add(url)
        self._evict(url)
        # prompts on their way there that it now holds whole: the index says so
        if to := self._sent_to.get(url):
            for s in [s for k in keys if k in lru for s in to.get(k, ())]:
                self.settle(s)

    def remove(self, url: str, keys: Iterable[int]) -> None:
        gone = set(keys)
        # a prompt on its way there whose blocks it dropped: no longer held whole
        self._settle_at(url, lambda s: not gone.isdisjoint(s.key_set))
        lru = self._lru.get(url)
        if lru is None:
            return
        for k in gone:
            if k in lru:
                del lru[k]
                self._drop_holder(k, url)

    def clear(self, url: str) -> None:
        self._settle_at(url, lambda s: True)
        for k in self._lru.pop(url, OrderedDict()):
            self._drop_holder(k, url)
        self._capacity.pop(url, None)

    def _drop_holder(self, k: int, url: str) -> None:
        holders = self._where.get(k)
        if holders is not None:
            holders.discard(url)
            if not holders:
                del self._where[k]

    def _evict(self, url: str) -> None:
        lru = self._lru.get(url)
        if lru is None:
            return
        cap = self._capacity.get(url, self.default_capacity)
        while len(lru) > cap:
            k, _ = lru.popitem(last=False)
            self._drop_holder(k, url)
