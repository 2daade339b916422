"""Endpoints from a Kubernetes pod watch: ready pods matching a label
selector become endpoints (role and revision from labels, URL from the pod
IP; models from the server's own /v1/models, since a model name such as
``org/model`` cannot be a label value); a pod that goes away or turns unready is drained, so no new
request goes to it and the ones in flight finish.

The watch runs on the synchronous ``kubernetes`` client in a thread and
hands pod states to the event loop. It lists once, then watches from the
list's resourceVersion; each watch the server ends is resumed from the last
version seen (bookmarks keep it current while nothing changes), so a quiet
namespace costs one watch request per ``watchTimeoutSeconds``, not a LIST."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import structlog

from router.config import KubernetesDiscovery
from router.pool.endpoints import Endpoint, Pool
from router.pool.list_watch import list_watch_cycle
from router.pool.revisions import revision_of
from topology.labels import PRESETS, from_labels
from topology.model import DomainPath

log = structlog.get_logger("router.pool.kubernetes")


@dataclass(frozen=True)
class PodView:
    name: str
    url: str | None  # None: not routable (unready, no IP, terminating)
    role: str | None
    revision: str | None
    path: DomainPath | None = None  # where its node sits


def pod_view(pod: Any, cfg: KubernetesDiscovery, path: DomainPath | None = None) -> PodView:
    labels = pod.metadata.labels or {}
    ready = (pod.status.phase == "Running" and pod.metadata.deletion_timestamp is None
             and any(c.type == "Ready" and c.status == "True"
                     for c in pod.status.conditions or []))
    ip = pod.status.pod_ip
    return PodView(name=pod.metadata.name, url=f"http://{ip}:{cfg.port}" if ready and ip else None,
                   role=labels.get(cfg.role_label),
                   revision=revision_of(labels, cfg.revision_label), path=path)


def api_client(kubeconfig: str | None) -> Any:
    """A client from ``kubeconfig``, or the pod's own service account."""
    from kubernetes import client, config

    if kubeconfig:
        return config.new_client_from_config(config_file=kubeconfig)
    config.load_incluster_config()
    return client.ApiClient()


class KubernetesWatcher:
    def __init__(self, cfg: KubernetesDiscovery, pool: Pool, drain_timeout_s: float,
                 on_add: Callable[[Endpoint], None] | None = None,
                 on_remove: Callable[[str], None] | None = None,
                 requests: Callable[[str], None] = lambda verb: None) -> None:
        """``requests`` is told of each LIST and WATCH sent (for metrics)."""
        self.cfg, self.pool, self.drain_timeout_s = cfg, pool, drain_timeout_s
        self.on_add, self.on_remove, self.requests = on_add, on_remove, requests
        self._by_pod: dict[str, str] = {}  # pod name -> url
        self._stop = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.synced = asyncio.Event()
        self._drains: set[asyncio.Task[None]] = set()
        self._paths: dict[str, DomainPath] = {}  # node name -> its place; nodes do not move

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="pod-watch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    # runs on the loop
    def _apply(self, view: PodView) -> None:
        old = self._by_pod.get(view.name)
        if old is not None and old != view.url:
            self._drain(old)
            del self._by_pod[view.name]
        if view.url is not None:
            kv = f"tcp://{view.url.split('//')[1].rsplit(':', 1)[0]}:{self.cfg.kv_events_port}" \
                if self.cfg.kv_events_port else None
            ep = self.pool.upsert(Endpoint(url=view.url, role=view.role, revision=view.revision,
                                           path=view.path, kv_events=kv))
            if old != view.url:
                log.info("endpoint added", pod=view.name, url=view.url)
                if self.on_add:
                    self.on_add(ep)
            self._by_pod[view.name] = view.url

    def _deleted(self, name: str) -> None:
        url = self._by_pod.pop(name, None)
        if url:
            self._drain(url)

    def _resync(self, names: set[str]) -> None:
        for gone in set(self._by_pod) - names:
            self._deleted(gone)
        self.synced.set()

    def _drain(self, url: str) -> None:
        log.info("endpoint draining", url=url)

        async def drain() -> None:
            await self.pool.drain(url, self.drain_timeout_s)
            if self.on_remove and self.pool.get(url) is None:
                self.on_remove(url)

        t = asyncio.ensure_future(drain())
        self._drains.add(t)
        t.add_done_callback(self._drains.discard)

    # runs in the thread
    def _call(self, fn: Callable[..., None], *args: Any) -> None:
        assert self._loop is not None
        self._loop.call_soon_threadsafe(fn, *args)

    def _view(self, core: Any, pod: Any) -> PodView:
        """The pod, with its node's place in the topology read from the
        node's labels (once per node; without access, the node name only)."""
        from kubernetes.client.exceptions import ApiException

        node = pod.spec.node_name
        if node and node not in self._paths:
            try:
                labels = core.read_node(node).metadata.labels or {}
            except ApiException as err:
                log.warning("node labels unreadable; pairing by node name only", node=node,
                            status=err.status)
                labels = {}
            self._paths[node] = from_labels(node, labels, PRESETS[self.cfg.topology_labels])
        return pod_view(pod, self.cfg, self._paths.get(node) if node else None)

    def _run(self) -> None:
        from kubernetes import client

        core = client.CoreV1Api(api_client(self.cfg.kubeconfig))
        rv: str | None = None  # where the next watch resumes; None: list first
        while not self._stop.is_set():
            rv = self._cycle(core, rv)

    def _cycle(self, core: Any, rv: str | None) -> str | None:
        """One list-then-watch cycle (router.pool.list_watch): resumes from
        ``rv``, relists only after 410 Gone."""
        def listed(pods: Any) -> None:
            for p in pods.items:
                self._call(self._apply, self._view(core, p))
            self._call(self._resync, {p.metadata.name for p in pods.items})

        def event(kind: str, pod: Any) -> None:
            if kind == "DELETED":
                self._call(self._deleted, pod.metadata.name)
            else:
                self._call(self._apply, self._view(core, pod))

        return list_watch_cycle(core.list_namespaced_pod, rv, self._stop, on_list=listed,
                                on_event=event, timeout_s=self.cfg.watch_timeout_s,
                                what="pods", count=self.requests,
                                namespace=self.cfg.namespace,
                                label_selector=self.cfg.label_selector)
