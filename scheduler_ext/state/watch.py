"""The watches that feed ``ClusterState``: one reflector (LIST, then WATCH
resumed from the last resourceVersion; relist only on 410 Gone) per kind,
each on its own thread, through the raw-JSON client the DRA publisher uses.
And what the extender writes: a group's decision and retry mark onto its
pods, and a Warning Event on a group's pod that another scheduler places."""

from __future__ import annotations

import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import orjson
import structlog

from toposerve.kubeapi import ApiError, JsonApi, Reflector, events
from toposerve.scheduler_ext.placement.model import Decision, Group
from toposerve.scheduler_ext.state.cache import ClusterState
from toposerve.scheduler_ext.state.facts import (
    PLACEMENT_ANNOTATION,
    SIZE_SEEN_ANNOTATION,
    PodFacts,
    decision_annotation,
)

log = structlog.get_logger("toposerve.extender.watch")

PATHS = {
    "nodes": ("/api/v1/nodes", []),
    # finished pods hold nothing: the server leaves them out
    "pods": ("/api/v1/pods", [("fieldSelector",
                               "status.phase!=Succeeded,status.phase!=Failed")]),
    "slices": ("/apis/resource.k8s.io/v1/resourceslices", []),
    "claims": ("/apis/resource.k8s.io/v1/resourceclaims", []),
    "templates": ("/apis/resource.k8s.io/v1/resourceclaimtemplates", []),
    "classes": ("/apis/resource.k8s.io/v1/deviceclasses", []),
    "podgroups": ("/apis/scheduling.k8s.io/v1beta1/podgroups", []),
    "lws": ("/apis/leaderworkerset.x-k8s.io/v1/leaderworkersets", []),
}
# served only with scheduling.k8s.io/v1beta1 enabled, or the LWS CRDs installed;
# DeviceClasses: a role without them still counts the configured classes
OPTIONAL = {"podgroups", "lws", "classes"}


class Watches:
    def __init__(self, api: Any, state: ClusterState) -> None:
        self.api = api
        self.rest = JsonApi(api)
        self.state = state
        self.errors: dict[str, int] = dict.fromkeys(PATHS, 0)
        self._threads: list[threading.Thread] = []
        self.reflectors = {kind: self._reflector(kind) for kind in PATHS}
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="nudge")
        state.on_size_known = self.nudge
        state.on_elsewhere = self.elsewhere

    def _reflector(self, kind: str) -> Reflector:
        path, query = PATHS[kind]

        def on_error(err: Exception) -> None:
            self.errors[kind] += 1
            if kind in OPTIONAL and isinstance(err, ApiError) and err.status in (403, 404):
                log.info("API not served or not permitted; not watching it", kind=kind,
                         path=path, status=err.status)
                with self.state.lock:
                    self.state.synced.add(kind)
                self.reflectors[kind].stop()
                return
            log.warning("watch failed; retrying", kind=kind, error=str(err))

        return Reflector(self.rest, path, query,
                         on_list=lambda items, _rv: self.state.relist(kind, items),
                         on_event=self.state.handler(kind), on_error=on_error)

    def _served(self, kind: str) -> bool:
        """Whether the API of an optional kind is there at all: an API group
        nobody installed answers a plain-text 404, not a watchable list."""
        group_version = PATHS[kind][0].rsplit("/", 1)[0]
        try:
            self.rest.request("GET", group_version)
        except ApiError as err:
            return err.status not in (403, 404)  # else: unsure, let the watch retry
        except orjson.JSONDecodeError:
            return False
        return True

    def start(self) -> None:
        for kind, r in self.reflectors.items():
            if kind in OPTIONAL and not self._served(kind):
                log.info("API not served; not watching it", kind=kind, path=PATHS[kind][0])
                with self.state.lock:
                    self.state.synced.add(kind)
                continue
            t = threading.Thread(target=r.run, name=f"watch-{kind}", daemon=True)
            t.start()
            self._threads.append(t)

    def stop(self) -> None:
        for r in self.reflectors.values():
            r.stop()
        for t in self._threads:
            t.join(timeout=5)
        self._writer.shutdown(wait=False, cancel_futures=True)

    def missing(self) -> list[str]:
        """Kinds whose first list has not arrived (not ready until none)."""
        with self.state.lock:
            return [k for k in PATHS if k not in self.state.synced]

    def persist(self, namespace: str, pod: str, decision: Decision) -> None:
        """Write the group's decision on one of its pods (merge patch), so
        that a restarted or second extender finds it in its pod watch."""
        self._annotate(namespace, pod, PLACEMENT_ANNOTATION,
                       decision_annotation(decision, self.state.key), decision.group,
                       "could not record the group's placement on its pod")

    def nudge(self, group: Group, pods: list[tuple[str, str]]) -> None:
        """The group's size is known now: annotate its waiting pods (off the
        watch thread), so that the scheduler tries them again at once. A pod
        an extender rejected waits for any cluster event, and an update of the
        pod itself is one (kube-scheduler queues such pods on every event);
        else it would wait for the next event or the 5-minute flush."""
        seen = orjson.dumps({"size": group.size, "at": time.time()}).decode()
        log.info("group size known; retrying its pods", group=group.key, pods=len(pods))
        for namespace, pod in pods:
            self._writer.submit(self._annotate, namespace, pod, SIZE_SEEN_ANNOTATION, seen,
                                group.key, "could not mark the pod for a retry")

    def elsewhere(self, pod: PodFacts, scheduler: str) -> None:
        """A group's pod another scheduler places: logged, and a Warning
        Event on it (off the watch thread), where its author looks."""
        wanted = self.state.cfg.scheduler_name
        group = pod.ref.key if pod.ref else ""
        log.warning("a group's pod names another scheduler; it is not placed with its group",
                    pod=f"{pod.namespace}/{pod.name}", group=group, scheduler=scheduler,
                    wanted=wanted)
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace,
                    "name": pod.name, "uid": pod.uid}
        self._writer.submit(
            events.warn, self.api, involved, "NotScheduledAsGroup",
            f"this pod belongs to group {group}, but its spec.schedulerName is {scheduler!r}: "
            f"that scheduler will place it without regard to its group; set "
            f"spec.schedulerName: {wanted} to have the group placed whole",
            "toposerve-extender", socket.gethostname())

    def _annotate(self, namespace: str, pod: str, key: str, value: str, group: str,
                  failure: str) -> None:
        from toposerve.kubeapi.typed import ApiException, CoreV1Api

        try:
            CoreV1Api(self.api).patch_namespaced_pod(
                pod, namespace, {"metadata": {"annotations": {key: value}}},
                _content_type="application/merge-patch+json")
        except ApiException as err:
            log.warning(failure, pod=pod, group=group, status=err.status, error=str(err.reason))
