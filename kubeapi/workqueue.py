"""A work queue of keys, like client-go's."""

from __future__ import annotations

import heapq
import threading
from collections import deque
from collections.abc import Callable

__all__ = ["WorkQueue"]


class WorkQueue:
    """Keys to sync (the publisher's are pool names): each key at most once
    in the queue and never with two workers at once, like client-go's
    workqueue, with delayed adds."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._cv = threading.Condition()
        self._ready: deque[str] = deque()
        self._queued: set[str] = set()
        self._busy: set[str] = set()
        self._again: set[str] = set()
        self._later: list[tuple[float, int, str]] = []
        self._seq = 0
        self._clock = clock
        self.closed = False

    def _push(self, pool: str) -> None:
        """Ready now, or again once its worker is done (the lock is held)."""
        if pool in self._busy:
            self._again.add(pool)
        elif pool not in self._queued:
            self._queued.add(pool)
            self._ready.append(pool)
            self._cv.notify()

    def add(self, pool: str, delay: float = 0) -> None:
        with self._cv:
            if delay > 0:
                self._seq += 1
                heapq.heappush(self._later, (self._clock() + delay, self._seq, pool))
                self._cv.notify()
            else:
                self._push(pool)

    def get(self) -> str | None:
        with self._cv:
            while not self.closed:
                now = self._clock()
                while self._later and self._later[0][0] <= now:
                    self._push(heapq.heappop(self._later)[2])
                if self._ready:
                    pool = self._ready.popleft()
                    self._queued.discard(pool)
                    self._busy.add(pool)
                    return pool
                wait = self._later[0][0] - now if self._later else None
                self._cv.wait(timeout=wait)
            return None

    def done(self, pool: str) -> None:
        with self._cv:
            self._busy.discard(pool)
            if pool in self._again:
                self._again.discard(pool)
                self._push(pool)

    def depth(self) -> int:
        with self._cv:
            return len(self._ready) + len(self._busy)

    def close(self) -> None:
        with self._cv:
            self.closed = True
            self._cv.notify_all()
