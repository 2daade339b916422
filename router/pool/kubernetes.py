"""Endpoints from a Kubernetes pod watch: ready pods matching a label
selector become endpoints (role and revision from labels, URL from the pod
IP and each port of the target: one, or an InferencePool's target ports;
models from the server's own /v1/models, since a model name such as
``org/model`` cannot be a label value); a pod that goes away or turns
unready is drained, so no new request goes to it and the ones in flight
finish. An InferencePool (``inference_pool``) retargets the watch when its
selector or ports change.

The watch is a ``kubeapi.Reflector`` over raw JSON in a thread, handing pod
states to the event loop. It lists once, then watches from the list's
resourceVersion; each watch the server ends is resumed from the last
version seen (bookmarks keep it current while nothing changes), so a quiet
namespace costs one watch request per ``watchTimeoutSeconds``, not a LIST;
only 410 Gone lists again, and errors back off. The watch runs under the
router's supervisor (``toposerve.router.supervise``): an apiserver error or
an answer of a shape not expected is logged once a streak and counted, and
a fresh reflector lists again after a backoff; a pod that cannot be read
is left out (logged once, counted) while the others are routed.

With ``claimDevices``, each routable pod's claimed devices (``devices``)
give its endpoints their place below the node and their health: an
endpoint whose device is tainted leaves rotation (its requests in flight
finish) and comes back when the taint goes, each time with a log line and
an Event on the pod."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import structlog

from toposerve.kubeapi import ApiError, JsonApi, Reflector, connect, events
from toposerve.router.config import KubernetesDiscovery, PodDiscovery
from toposerve.router.pool.devices import NOTHING, DeviceWatch, Holding
from toposerve.router.pool.endpoints import Endpoint, Pool
from toposerve.router.pool.revisions import revision_of
from toposerve.router.supervise import Streak, Streaks, in_thread, supervise
from toposerve.topology.labels import PRESETS, from_labels
from toposerve.topology.model import DomainPath

log = structlog.get_logger("router.pool.kubernetes")


# a pod annotation naming which of an InferencePool's target ports serve now
# (comma-separated numbers; the others are not routed): the reference picker's
ACTIVE_PORTS = "inference.networking.k8s.io/active-ports"


@dataclass(frozen=True)
class Target:
    """Which pods serve and on which ports: a label selector, and each pod's
    ports (numbers, or a container port's name), the Nth its Nth endpoint."""

    selector: str
    ports: tuple[int | str, ...]
    active_ports: bool = False  # the pods' ACTIVE_PORTS annotation narrows ports


def label_target(cfg: KubernetesDiscovery) -> Target:
    return Target(cfg.label_selector, (cfg.port_name or cfg.port,))


class Served(NamedTuple):
    url: str
    kv_events: str | None  # tcp://ip:port when the pods publish KV events


@dataclass(frozen=True)
class PodView:
    name: str
    served: tuple[Served, ...]  # none: not routable (unready, no IP, terminating, no port)
    role: str | None
    revision: str | None
    path: DomainPath | None = None  # where its node sits
    uid: str = ""


def named_port(pod: dict[str, Any], name: str) -> int | None:
    """The container port called ``name``, as a Service's targetPort finds it."""
    for c in (pod.get("spec") or {}).get("containers") or []:
        for p in c.get("ports") or []:
            if p.get("name") == name and isinstance(p.get("containerPort"), int):
                return int(p["containerPort"])
    return None


def _active(meta: dict[str, Any], ports: tuple[int | str, ...]) -> set[int | str]:
    """The ports the pod's ACTIVE_PORTS annotation names (all without one);
    what is not a port number is skipped, as the reference picker does."""
    text = (meta.get("annotations") or {}).get(ACTIVE_PORTS)
    if not isinstance(text, str):
        return set(ports)
    named = {int(p) for p in text.split(",") if p.strip().isdigit()}
    return {p for p in ports if p in named}


def pod_view(pod: dict[str, Any], cfg: PodDiscovery, target: Target,
             path: DomainPath | None = None) -> PodView:
    """The pod as the API gives it (raw JSON)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    labels = meta.get("labels") or {}
    ready = (status.get("phase") == "Running" and meta.get("deletionTimestamp") is None
             and any(c.get("type") == "Ready" and c.get("status") == "True"
                     for c in status.get("conditions") or []))
    ip = status.get("podIP")
    served: list[Served] = []
    if ready and ip:
        host = f"[{ip}]" if ":" in ip else ip
        active = _active(meta, target.ports) if target.active_ports else set(target.ports)
        kv_base = (named_port(pod, cfg.kv_events_port_name) if cfg.kv_events_port_name
                   else cfg.kv_events_port)
        for rank, p in enumerate(target.ports):
            port = named_port(pod, p) if isinstance(p, str) else p
            if port is not None and p in active:
                served.append(Served(f"http://{host}:{port}",
                                     f"tcp://{host}:{kv_base + rank}" if kv_base else None))
    return PodView(name=meta["name"], served=tuple(served), role=labels.get(cfg.role_label),
                   revision=revision_of(labels, cfg.revision_label), path=path,
                   uid=str(meta.get("uid", "")))


class CountedApi(JsonApi):
    """The reflector's requests, each told to ``count``: a LIST (its first
    page; later pages continue it) or a WATCH."""

    def __init__(self, api: Any, count: Callable[[str], None]) -> None:
        super().__init__(api)
        self._count = count

    def request(self, method: str, path: str, query: Sequence[tuple[str, Any]] = (),
                body: Any = None, timeout: float = 30, accept: str = "application/json",
                content_type: str = "application/json") -> Any:
        if not any(k == "continue" for k, _ in query):
            self._count("list")
        return super().request(method, path, query, body, timeout, accept, content_type)

    def stream(self, path: str, query: Sequence[tuple[str, Any]], read_timeout: float,
               opened: Callable[[Any], None]) -> Iterator[dict[str, Any]]:
        self._count("watch")
        return super().stream(path, query, read_timeout, opened)


class KubernetesWatcher:
    """The pods of a ``Target`` as endpoints. A label selector's target is
    fixed; an InferencePool's changes with the pool (``retarget``): the
    watch then lists again with the new selector and ports, and what the new
    list no longer holds drains."""

    def __init__(self, cfg: PodDiscovery, pool: Pool, drain_timeout_s: float,
                 on_add: Callable[[Endpoint], None] | None = None,
                 on_remove: Callable[[str], None] | None = None,
                 requests: Callable[[str], None] = lambda verb: None,
                 what: dict[str, str] | None = None) -> None:
        """``requests`` is told of each LIST and WATCH sent (for metrics);
        ``what`` names the watch in the log (default: its label selector).
        A ``KubernetesDiscovery`` gives the target; otherwise there is none
        until ``retarget``."""
        self.cfg, self.pool, self.drain_timeout_s = cfg, pool, drain_timeout_s
        self.on_add, self.on_remove, self.requests = on_add, on_remove, requests
        self.target = label_target(cfg) if isinstance(cfg, KubernetesDiscovery) else None
        self._by_pod: dict[str, frozenset[str]] = {}  # pod name -> its urls
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._reflector: Reflector | None = None
        # the target's generation: what a reflector of an older one hands over is dropped
        self._gen = 0
        self._retargeted = asyncio.Event()
        self._watch_streak = Streak("discovery", **(what or {
            "pods": f"{cfg.namespace}/{self.target.selector if self.target else ''}"}))
        self._pod_streaks = Streaks("discovery", "pod")  # the watch thread's own
        self._api: Any = None
        self.synced = asyncio.Event()
        self._drains: set[asyncio.Task[None]] = set()
        self._paths: dict[str, DomainPath] = {}  # node name -> its place; nodes do not move
        # pods warned of once, no port of a target's port name (the watch thread's own)
        self._portless: set[str] = set()
        self.devices: DeviceWatch | None = None  # with claimDevices, once started
        self._held: dict[str, tuple[str, Holding]] = {}  # pod name -> (its uid, what it holds)
        self._uids: dict[str, str] = {}  # pod name -> uid, of the pods routed
        self._writes: set[asyncio.Task[bool]] = set()  # Events being written

    def start(self) -> None:
        """Finds the credentials now, so that missing ones fail the start."""
        self._api = connect(self.cfg.kubeconfig)
        self._loop = asyncio.get_running_loop()
        if self.cfg.claim_devices:
            loop = self._loop
            self.devices = DeviceWatch(
                self._api, lambda pod, uid, held: loop.call_soon_threadsafe(
                    self._holds, pod, uid, held), self.cfg.watch_timeout_s)
        self._task = asyncio.create_task(supervise(self._watch_streak, self._watch))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._reflector is not None:
            self._reflector.stop()
        if self.devices is not None:
            self.devices.stop()

    # runs on the loop
    def retarget(self, target: Target | None) -> None:
        """Watch ``target``'s pods from now on; None: no pods (every endpoint
        drains). The same target again changes nothing."""
        if target != self.target:
            self.target = target
            self._gen += 1
            if self._reflector is not None:
                self._reflector.stop()
            for name in list(self._by_pod) if target is None else ():
                self._deleted(name)
            if target is None and self.devices is not None:
                self.devices.keep(())
            self._retargeted.set()
        if target is None:
            self.synced.set()  # nothing to list: discovery is done

    def endpoint_count(self) -> int:
        return sum(map(len, self._by_pod.values()))

    def _current(self, gen: int, fn: Callable[..., None], *args: Any) -> None:
        if gen == self._gen:
            fn(*args)

    def _apply(self, view: PodView) -> None:
        old = self._by_pod.get(view.name, frozenset())
        urls = frozenset(s.url for s in view.served)
        for gone in old - urls:
            self._drain(gone)
        uid, held = self._held.get(view.name, ("", NOTHING))
        if uid != view.uid:
            held = NOTHING
        self._uids[view.name] = view.uid
        for s in view.served:
            ep = self.pool.upsert(Endpoint(url=s.url, role=view.role, revision=view.revision,
                                           path=view.path, kv_events=s.kv_events,
                                           devices=held.devices, taints=held.taints))
            if s.url not in old:
                log.info("endpoint added", pod=view.name, url=s.url)
                if self.on_add:
                    self.on_add(ep)
        if urls:
            self._by_pod[view.name] = urls
        else:
            self._by_pod.pop(view.name, None)

    def _deleted(self, name: str) -> None:
        self._held.pop(name, None)
        self._uids.pop(name, None)
        for url in self._by_pod.pop(name, ()):
            self._drain(url)

    def _holds(self, pod: str, uid: str, held: Holding) -> None:
        """What a pod holds, first known or changed: its endpoints' devices
        and taints; leaving rotation or coming back is logged and told in an
        Event on the pod."""
        before = self._held.get(pod, ("", NOTHING))
        self._held[pod] = (uid, held)
        if self._uids.get(pod, uid) != uid:
            return  # of an older pod of that name: never routed here
        for url in self._by_pod.get(pod, ()):
            if (ep := self.pool.get(url)) is not None:
                ep.devices, ep.taints = held.devices, held.taints
        was = before[1].taints if before[0] == uid else ()
        if held.taints and set(held.taints) != set(was):
            taints = ", ".join(map(str, held.taints))
            log.warning("endpoint out of rotation: a device its pod holds is tainted", pod=pod,
                        taints=taints)
            self._event(events.warn, pod, uid, "DeviceTainted",
                        f"not routed to while a device it holds is tainted: {taints}")
        elif was and not held.taints:
            log.info("endpoint back in rotation: its devices' taints are gone", pod=pod)
            self._event(events.normal, pod, uid, "DeviceTaintsCleared",
                        "routed to again: no device it holds is tainted")

    def _event(self, write: Callable[..., bool], pod: str, uid: str, reason: str,
               message: str) -> None:
        involved = {"apiVersion": "v1", "kind": "Pod", "namespace": self.cfg.namespace,
                    "name": pod, "uid": uid}
        t = asyncio.ensure_future(asyncio.to_thread(
            write, self._api, involved, reason, message, "toposerve-router",
            socket.gethostname()))
        self._writes.add(t)
        t.add_done_callback(self._writes.discard)

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
    def _view(self, rest: JsonApi, pod: dict[str, Any], target: Target) -> PodView:
        """The pod, with its node's place in the topology read from the
        node's labels (once per node; without access, the node name only)."""
        node = (pod.get("spec") or {}).get("nodeName")
        if node and node not in self._paths:
            try:
                labels = rest.request("GET", f"/api/v1/nodes/{node}")["metadata"].get(
                    "labels") or {}
            except ApiError as err:
                log.warning("node labels unreadable; pairing by node name only", node=node,
                            status=err.status)
                labels = {}
            self._paths[node] = from_labels(node, labels, PRESETS[self.cfg.topology_labels])
        view = pod_view(pod, self.cfg, target, self._paths.get(node) if node else None)
        name = view.name
        if self.devices is not None and view.served and node:
            # before the view is applied: a tainted device keeps it out from the start
            self.devices.hold(name, view.uid, node, self.devices.claimed(
                rest, self.cfg.namespace, pod))
        for p in target.ports:
            if isinstance(p, str) and name not in self._portless and named_port(pod, p) is None:
                self._portless.add(name)
                log.warning("pod has no container port of the configured name; not routed",
                            pod=name, portName=p)
        return view

    def _read(self, rest: JsonApi, pod: Any, target: Target) -> PodView | None:
        """The pod's view; None for a pod that cannot be read (logged once
        while it stays so, and counted), so that it stops no other."""
        name = _name(pod)
        try:
            view = self._view(rest, pod, target)
        except Exception as err:
            self._pod_streaks.failed(name, err)
            return None
        self._pod_streaks.ok(name)
        return view

    async def _watch(self) -> None:
        """Reflectors, one a target, while there is one: until stopped, or
        until one raises (a fresh one lists again: what was applied of the
        last list or event is not known then)."""
        rest = JsonApi(self._api)
        while True:
            self._retargeted.clear()
            target, gen = self.target, self._gen
            if target is None:
                await self._retargeted.wait()
                continue
            await self._watch_target(rest, target, gen)

    async def _watch_target(self, rest: JsonApi, target: Target, gen: int) -> None:
        def call(fn: Callable[..., None], *args: Any) -> None:
            assert self._loop is not None
            self._loop.call_soon_threadsafe(self._current, gen, fn, *args)

        def listed(pods: list[Any], _rv: int) -> None:
            views = [v for p in pods if (v := self._read(rest, p, target)) is not None]
            if self.devices is not None:
                self.devices.keep(v.uid for v in views)
            for v in views:
                call(self._apply, v)
            call(self._resync, {v.name for v in views})
            self._pod_streaks.keep(_name(p) for p in pods)
            self._watch_streak.ok()

        def event(kind: str, pod: dict[str, Any]) -> None:
            if kind == "DELETED":
                name = _name(pod)
                self._portless.discard(name)
                if self.devices is not None:
                    self.devices.drop(str((pod.get("metadata") or {}).get("uid", "")))
                self._pod_streaks.ok(name)
                call(self._deleted, name)
            elif (view := self._read(rest, pod, target)) is not None:
                call(self._apply, view)
            self._watch_streak.ok()

        self._reflector = reflector = Reflector(
            CountedApi(self._api, self.requests), f"/api/v1/namespaces/{self.cfg.namespace}/pods",
            [("labelSelector", target.selector)], listed, event,
            self._watch_streak.failed, timeout=self.cfg.watch_timeout_s)
        try:
            await in_thread(reflector.run, "pod-watch")  # returns once stopped
        finally:  # cancelled too: the thread's watch ends with it
            reflector.stop()


def _name(pod: Any) -> str:
    """The pod's name, or what the log says of one that has none."""
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else "(no name)"
