"""An Event on an object, as ``kubectl describe`` shows it: a Warning for
what an operator must see beside the log (withheld GPUs, a claim the driver
gave up on, a model server taken out of rotation), a Normal one for its
end. An Event is a courtesy: a failure to write one is logged and never
stops the caller."""

from __future__ import annotations

import datetime
from typing import Any, Literal

import structlog

from toposerve.kubeapi.typed import CoreV1Api

log = structlog.get_logger("kubeapi.events")


def warn(api: Any, involved: dict[str, Any], reason: str, message: str, component: str,
         host: str) -> bool:
    """Create a Warning Event in ``involved``'s namespace (``default`` for a
    cluster-scoped object); whether it was written."""
    return _create(api, involved, reason, message, component, host, "Warning")


def normal(api: Any, involved: dict[str, Any], reason: str, message: str, component: str,
           host: str) -> bool:
    """As ``warn``, a Normal Event (a condition warned of is over)."""
    return _create(api, involved, reason, message, component, host, "Normal")


def _create(api: Any, involved: dict[str, Any], reason: str, message: str, component: str,
            host: str, type_: Literal["Warning", "Normal"]) -> bool:
    namespace = involved.get("namespace") or "default"
    now = datetime.datetime.now(datetime.UTC).isoformat()
    body: Any = {
        "metadata": {"generateName": f"{involved['name']}.{reason.lower()}."[:200]},
        "involvedObject": involved, "reason": reason, "message": message[:1024],
        "type": type_, "source": {"component": component, "host": host},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1}
    try:
        CoreV1Api(api).create_namespaced_event(namespace, body, _request_timeout=20)
    except Exception as err:  # the log line the caller wrote says it all
        log.warning("cannot write the event", reason=reason, object=involved.get("name"),
                    error=str(err)[:300])
        return False
    return True
