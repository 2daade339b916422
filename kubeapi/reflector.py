"""List-and-watch, the way client-go's reflector does it."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from toposerve.kubeapi.errors import ApiError
from toposerve.kubeapi.rest import JsonApi

__all__ = ["Reflector", "backoff"]

log = structlog.get_logger("toposerve.kubeapi.reflector")


def backoff(failures: int, cap: float) -> float:
    """Exponential from 0.25 s to ``cap``, jittered so retries spread out."""
    base: float = min(cap, 0.25 * 2 ** min(max(failures, 1) - 1, 16))
    return base * (0.5 + random.random() / 2)


class Reflector:
    """LIST, then WATCH from the list's resourceVersion: a watch that ends
    (server timeout, dropped connection) resumes from the last version
    seen, with bookmarks keeping it fresh; only 410 Gone relists. Errors
    back off, forever: an apiserver outage is waited out."""

    def __init__(self, rest: JsonApi, path: str, query: Sequence[tuple[str, Any]],
                 on_list: Callable[[list[Any], int], None],
                 on_event: Callable[[str, dict[str, Any]], None],
                 on_error: Callable[[Exception], None], *, timeout: int = 300,
                 max_backoff: float = 30.0,
                 keep: Callable[[dict[str, Any]], Any] = lambda obj: obj) -> None:
        self._rest = rest
        self._keep = keep  # what of each listed object to keep, page by page
        self._path = path
        self._query = list(query)
        self._on_list = on_list
        self._on_event = on_event
        self._on_error = on_error
        self._timeout = timeout
        self._max_backoff = max_backoff
        self._resp: Any = None
        self._rv = ""
        self._stopping = threading.Event()
        self.watching = False
        self.lists = 0      # LISTs made: one, and one more per 410 Gone
        self.watches = 0    # watch requests made (each resumes from the last version)

    def list(self) -> tuple[list[Any], int]:
        items: list[Any] = []
        cont = ""
        while True:
            q = [*self._query, ("limit", 500)] + ([("continue", cont)] if cont else [])
            data = self._rest.request("GET", self._path, q, timeout=60)
            items += [self._keep(o) for o in data.get("items") or ()]
            cont = data.get("metadata", {}).get("continue", "")
            if not cont:
                return items, int(data.get("metadata", {}).get("resourceVersion") or 0)

    def relist(self) -> None:
        items, rv = self.list()
        self.lists += 1
        self._rv = str(rv)
        self._on_list(items, rv)

    def run(self) -> None:
        failures = 0
        while not self._stopping.is_set():
            try:
                if not self._rv:
                    self.relist()
                self._watch()
                failures = 0
            except ApiError as err:
                self.watching = False
                if self._stopping.is_set():
                    break
                if err.status == 410:
                    log.info("watch expired; relisting", path=self._path)
                    self._rv = ""
                    continue
                failures += 1
                self._on_error(err)
                self._stopping.wait(backoff(failures, self._max_backoff))
        self.watching = False

    def stop(self) -> None:
        self._stopping.set()
        resp = self._resp
        if resp is not None:
            resp.shutdown()

    def _watch(self) -> None:
        q = [*self._query, ("watch", "true"), ("allowWatchBookmarks", "true"),
             ("resourceVersion", self._rv), ("timeoutSeconds", self._timeout)]

        def opened(resp: Any) -> None:
            self._resp = resp
            if self._stopping.is_set():
                resp.shutdown()

        self.watching = True
        self.watches += 1
        for ev in self._rest.stream(self._path, q, self._timeout + 30, opened):
            kind, obj = str(ev.get("type")), ev.get("object") or {}
            if kind == "ERROR":
                raise ApiError(int(obj.get("code") or 0), obj.get("message", "watch error"))
            rv = (obj.get("metadata") or {}).get("resourceVersion")
            if rv:
                self._rv = rv
            if kind != "BOOKMARK":
                self._on_event(kind, obj)
