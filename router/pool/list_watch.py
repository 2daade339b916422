"""One LIST, then a WATCH resumed from its resourceVersion: the loop both
the pod discovery and the API-key Secret use. A watch that the server ends
(as each does after its timeout) resumes where it stopped; only 410 Gone
(that version was compacted away) lists again."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import structlog

log = structlog.get_logger("router.pool.list_watch")


def list_watch_cycle(list_fn: Callable[..., Any], rv: str | None, stop: threading.Event, *,
                     on_list: Callable[[Any], None], on_event: Callable[[str, Any], None],
                     timeout_s: int, what: str,
                     count: Callable[[str], None] = lambda verb: None,
                     **selectors: Any) -> str | None:
    """One LIST (only when ``rv`` is None: nothing to resume from) and one
    WATCH until the server ends it or ``stop`` is set; returns where the
    next cycle resumes. ``on_list`` gets the list answer, ``on_event`` each
    ADDED/MODIFIED/DELETED event's type and object; ``count`` hears each
    request's verb. Runs in a thread; transient faults wait a second."""
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    try:
        if rv is None:
            count("list")
            found: Any = list_fn(**selectors)
            on_list(found)
            rv = found.metadata.resource_version
        w = watch.Watch()
        count("watch")
        for ev in w.stream(list_fn, resource_version=rv, allow_watch_bookmarks=True,
                           timeout_seconds=timeout_s, **selectors):
            # the client tracks the version of every event, bookmarks included
            rv = w.resource_version or rv
            if stop.is_set():
                w.stop()
                break
            if ev["type"] != "BOOKMARK":
                on_event(ev["type"], ev["object"])
        return rv
    except ApiException as err:
        if err.status == 410:
            return None
        log.warning("watch failed", what=what, status=err.status)
    except Exception as err:  # keep watching through transient faults
        log.warning("watch error", what=what, error=repr(err))
    stop.wait(1.0)
    return rv
