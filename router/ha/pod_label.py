"""The replica's role as a label on its own pod, for a Service that
selects the leader by it: a pod's readiness cannot carry the role, since
a Deployment counts a standby that is never ready as unavailable and
would hold every rolling update (and a PodDisruptionBudget every drain)
forever. The pod is named by the downward API (POD_NAME, POD_NAMESPACE)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import structlog

log = structlog.get_logger("router.ha")
ROLE_LABEL = "toposerve.io/router-role"


class PodLabel:
    """Writes the latest role from a thread of its own, so a slow API never
    holds up the election (whose renewals must not wait)."""

    def __init__(self, core: Any, namespace: str, name: str) -> None:
        self.core, self.namespace, self.name = core, namespace, name
        self._want: bool | None = None
        self._written: bool | None = None
        self._wake = threading.Condition()
        threading.Thread(target=self._run, name="pod-label", daemon=True).start()

    def set(self, leader: bool) -> None:
        with self._wake:
            self._want = leader
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._want is not None
                                    and self._want != self._written)
                want = bool(self._want)
            if self._write(want):
                self._written = want
            else:
                time.sleep(1.0)  # then try again with whatever is wanted by then

    def _write(self, leader: bool) -> bool:
        role = "leader" if leader else "standby"
        try:
            self.core.patch_namespaced_pod(self.name, self.namespace,
                                           {"metadata": {"labels": {ROLE_LABEL: role}}},
                                           _request_timeout=2.0)
            return True
        except Exception as err:  # the Service keeps its old view; readiness still guards it
            log.warning("pod role label not written", pod=self.name, role=role,
                        error=repr(err))
            return False


def from_env(core: Any) -> PodLabel | None:
    name, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    return PodLabel(core, namespace, name) if name and namespace else None
