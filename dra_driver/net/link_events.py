"""Rescans on netlink events: a NIC that appears, goes, changes state or
address (and every hand-off move) is published within about a second,
instead of at the next tick of the slow safety-net timer. Bursts (a driver
loading, a pod with several NICs) are debounced into one rescan."""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from toposerve.dra_driver.net.handoff.links import netlink_socket_in

log = structlog.get_logger("toposerve.net.link_events")
POLL_S = 0.5  # how soon stop() is noticed when nothing happens


@dataclass
class Debounce:
    """Fire ``quiet_s`` after the last event, but no later than ``max_wait_s``
    after the first of a burst (an endless stream still gets rescans)."""

    quiet_s: float = 0.2
    max_wait_s: float = 1.0
    first: float | None = None
    last: float | None = None

    def event(self, now: float) -> None:
        if self.first is None:
            self.first = now
        self.last = now

    def wait(self, now: float) -> float | None:
        """Seconds until due (0: due now); None: nothing pending."""
        if self.first is None or self.last is None:
            return None
        return max(0.0, min(self.last + self.quiet_s, self.first + self.max_wait_s) - now)

    def fired(self) -> None:
        self.first = self.last = None


class LinkWatch:
    """Calls ``on_change`` after link and address events in the namespace at
    ``netns`` (a path; None: our own), debounced, on a thread of its own."""

    def __init__(self, on_change: Callable[[], None], netns: str | None = None,
                 debounce: Debounce | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.on_change, self.netns = on_change, netns
        self.debounce = debounce or Debounce()
        self.clock = clock
        self.changes = 0  # rescans it triggered
        self._stop, self._bound = threading.Event(), threading.Event()
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="link-events", daemon=True)

    def start(self) -> LinkWatch:
        """Returns once bound (an event after this is seen)."""
        self._thread.start()
        self._bound.wait()
        if self._error is not None:
            raise self._error
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _bind(self) -> Any:
        from pyroute2 import IPRoute  # type: ignore[import-untyped]
        from pyroute2.netlink.rtnl import (  # type: ignore[import-untyped]
            RTMGRP_IPV4_IFADDR,
            RTMGRP_IPV6_IFADDR,
            RTMGRP_LINK,
        )

        nl = IPRoute() if self.netns is None else IPRoute(fileno=netlink_socket_in(self.netns))
        nl.bind(groups=RTMGRP_LINK | RTMGRP_IPV4_IFADDR | RTMGRP_IPV6_IFADDR)
        return nl

    def _run(self) -> None:
        # pyroute2's socket is used by the thread that made it
        try:
            nl = self._bind()
        except OSError as err:
            self._error = err
            return
        finally:
            self._bound.set()
        try:
            self._loop(nl)
        finally:
            nl.close()

    def _loop(self, nl: Any) -> None:
        fd = nl.fileno()
        while not self._stop.is_set():
            pending = self.debounce.wait(self.clock())
            ready, _, _ = select.select([fd], [], [], POLL_S if pending is None else pending)
            if ready:
                try:
                    nl.get()  # what changed does not matter: the rescan reads it all
                except OSError as err:  # ENOBUFS after a burst: events lost, rescan anyway
                    log.warning("netlink events lost", error=str(err))
                self.debounce.event(self.clock())
            if self.debounce.wait(self.clock()) == 0:
                self.debounce.fired()
                self.changes += 1
                try:
                    self.on_change()
                except Exception as err:  # the timer's rescan is still there
                    log.error("rescan after a link event failed", error=str(err))
