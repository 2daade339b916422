"""The replica's role as a label on its own pod, for a Service that
selects the leader by it: a pod's readiness cannot carry the role, since
a Deployment counts a standby that is never ready as unavailable and
would hold every rolling update (and a PodDisruptionBudget every drain)
forever. The pod is named by the downward API (POD_NAME, POD_NAMESPACE)."""

from __future__ import annotations

import os
import threading
import time

import structlog

from toposerve.kubeapi import JsonApi

log = structlog.get_logger("router.ha")
ROLE_LABEL = "toposerve.io/router-role"


class PodLabel:
    """Writes the latest role from a thread of its own, so a slow API never
    holds up the election (whose renewals must not wait)."""

    def __init__(self, api: JsonApi, namespace: str, name: str) -> None:
        self.api, self.namespace, self.name = api, namespace, name
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
            self.api.request("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{self.name}",
                             body={"metadata": {"labels": {ROLE_LABEL: role}}}, timeout=2.0,
                             content_type="application/strategic-merge-patch+json")
            return True
        except Exception as err:  # the Service keeps its old view; readiness still guards it
            log.warning("pod role label not written", pod=self.name, role=role,
                        error=repr(err))
            return False


def from_env(api: JsonApi) -> PodLabel | None:
    name, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    return PodLabel(api, namespace, name) if name and namespace else None
