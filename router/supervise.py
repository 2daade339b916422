"""Keeping the router's background loops running whatever they read.

Each loop, and each thing one loop serves apart (an endpoint it scrapes,
a pod it routes, the Secret it reads), has a ``Streak`` of failures: every
failure is counted (``toposerve_router_loop_errors_total{loop}``), the
first of a streak is logged with the loop's name and what failed, the next
try waits a bounded exponential backoff, and the next success ends the
streak (and says so). ``supervise`` runs a loop's body under its streak:
whatever it raises is a failure, and the body runs again after the
backoff; only cancellation stops it. ``in_thread`` lets a blocking loop
(a Kubernetes watch) be supervised the same way.

The counts are the process's: the loops are started in places no metrics
object reaches, and a process runs one router."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Literal, get_args

import structlog
from prometheus_client import Counter

from toposerve.kubeapi import backoff

log = structlog.get_logger("router.supervise")

Loop = Literal["scrape", "discovery", "kv-events", "api-keys", "flow-release",
               "replication-publish", "replication-subscribe", "responses-store", "epp-health"]
LOOPS: tuple[Loop, ...] = get_args(Loop)
BACKOFF_CAP_S = 10.0
ERROR_CHARS = 500  # of an error's text in the log: an answer quoted whole could be megabytes


class _Errors:
    """Failures per loop, from the event loop and from watch threads: a
    Counter in no registry, which each RouterMetrics registers in its own
    (with ``server.workers`` its value is summed over the workers, as the
    other counters are)."""

    def __init__(self) -> None:
        self.counter = Counter(
            "toposerve_router_loop_errors",
            "Errors the router's background loops went on past, by loop (scrape, discovery, "
            "kv-events, api-keys, flow-release, replication-publish, replication-subscribe, "
            "responses-store, epp-health): a model server's answer that cannot be read (one "
            "that never came shows in toposerve_router_endpoint_healthy), a pod or Secret "
            "that cannot be read, a KV-event batch or replicated decision that is not one, an "
            "apiserver or Redis not answering. The first of each streak is logged, naming the "
            "loop and what failed.", ["loop"], registry=None)
        self._of = {loop: self.counter.labels(loop) for loop in LOOPS}

    def add(self, loop: Loop) -> None:
        self._of[loop].inc()


ERRORS = _Errors()


class Streak:
    """The failures in a row of one loop, or of one thing it serves (``what``:
    the log's fields naming it). ``effect``, if given, says at a streak's
    first failure what the failure means for requests (None: nothing)."""

    def __init__(self, loop: Loop, effect: Callable[[], str | None] | None = None, /,
                 **what: str) -> None:
        self.loop, self.what, self.effect = loop, what, effect
        self.failures = 0
        self.delay = 0.0  # before the next try
        self._retry_at = 0.0

    def failed(self, err: BaseException) -> None:
        self.failures += 1
        ERRORS.add(self.loop)
        self.delay = backoff(self.failures, BACKOFF_CAP_S)
        self._retry_at = time.monotonic() + self.delay
        if self.failures == 1:
            effect = self.effect() if self.effect is not None else None
            log.error("background loop error; further ones are counted in "
                      "toposerve_router_loop_errors_total, not logged, until it recovers",
                      loop=self.loop, **self.what, error=_text(err),
                      **({"effect": effect} if effect else {}))

    def ok(self) -> None:
        if self.failures:
            log.info("background loop recovered", loop=self.loop, **self.what,
                     failures=self.failures)
            self.failures = 0
            self._retry_at = 0.0

    def backing_off(self) -> bool:
        """Whether the next try should wait still (for loops that skip a
        failing item rather than sleep)."""
        return time.monotonic() < self._retry_at


class Streaks:
    """A streak for each item of one loop (an endpoint, a pod), named in
    the log by ``field``; kept while the item fails."""

    def __init__(self, loop: Loop, field: str) -> None:
        self.loop, self.field = loop, field
        self._by: dict[str, Streak] = {}

    def of(self, key: str) -> Streak:
        if (s := self._by.get(key)) is None:
            s = self._by[key] = Streak(self.loop, **{self.field: key})
        return s

    def failed(self, key: str, err: BaseException) -> None:
        self.of(key).failed(err)

    def ok(self, key: str) -> None:
        if (s := self._by.pop(key, None)) is not None:
            s.ok()

    def backing_off(self, key: str) -> bool:
        s = self._by.get(key)
        return s is not None and s.backing_off()

    def keep(self, keys: Iterable[str]) -> None:
        """Forget the items gone (not failing, just gone)."""
        for k in self._by.keys() - set(keys):
            del self._by[k]


async def supervise(streak: Streak, body: Callable[[], Awaitable[None]]) -> None:
    """Runs ``body`` until it returns. What it raises fails ``streak`` and
    ``body`` runs again after the streak's delay. A body that runs for
    good calls ``streak.ok()`` whenever it gets something done, so that
    the next failure starts a new streak (and the backoff starts short)."""
    while True:
        try:
            await body()
            return
        except Exception as err:
            streak.failed(err)
        await asyncio.sleep(streak.delay)


async def in_thread(blocking: Callable[[], None], name: str) -> None:
    """``blocking`` in a daemon thread of its own, awaited: what it raises
    is raised here. Not the loop's executor: a stopping event loop waits for
    its threads, and a watch may hold one for minutes."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def settle(err: Exception | None) -> None:
        if done.done():  # cancelled meanwhile
            return
        if err is None:
            done.set_result(None)
        else:
            done.set_exception(err)

    def run() -> None:
        err: Exception | None = None
        try:
            blocking()
        except Exception as e:
            err = e
        with contextlib.suppress(RuntimeError):  # the event loop closed meanwhile
            loop.call_soon_threadsafe(settle, err)

    threading.Thread(target=run, name=name, daemon=True).start()
    await done


def _text(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}"
    return text if len(text) <= ERROR_CHARS else text[:ERROR_CHARS] + "..."
