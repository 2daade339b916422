"""Which endpoint holds which prefix blocks: a per-endpoint LRU of block
keys plus a reverse map from key to endpoints, so a lookup walks only the
blocks a request shares with somebody."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

DEFAULT_CAPACITY = 200_000


class PrefixIndex:
    def __init__(self, default_capacity: int = DEFAULT_CAPACITY) -> None:
        self._where: dict[int, set[str]] = {}
        self._lru: dict[str, OrderedDict[int, None]] = {}
        self._capacity: dict[str, int] = {}
        self.default_capacity = default_capacity

    def __len__(self) -> int:
        return sum(len(x) for x in self._lru.values())

    def held(self, url: str) -> int:
        """Blocks the index believes ``url`` holds."""
        return len(self._lru.get(url, ()))

    def set_capacity(self, url: str, blocks: int) -> None:
        self._capacity[url] = max(1, blocks)
        self._evict(url)

    def match(self, keys: list[int], urls: Iterable[str]) -> dict[str, int]:
        """Leading blocks of ``keys`` each endpoint holds. A prompt's blocks
        are added (and so evicted) together, its head last, so what an
        endpoint holds of a chain is a prefix of it: a binary search per
        endpoint that holds the first block finds its length."""
        matched = dict.fromkeys(urls, 0)
        first = self._where.get(keys[0]) if keys else None
        if not first:
            return matched
        for url in first.intersection(matched):
            lru = self._lru[url]
            lo, hi = 1, len(keys) + 1  # keys[:lo] held; keys[:hi] not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if keys[mid - 1] in lru:
                    lo = mid
                else:
                    hi = mid
            matched[url] = lo
        return matched

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

    def remove(self, url: str, keys: Iterable[int]) -> None:
        lru = self._lru.get(url)
        if lru is None:
            return
        for k in keys:
            if k in lru:
                del lru[k]
                self._drop_holder(k, url)

    def clear(self, url: str) -> None:
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
