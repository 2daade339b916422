"""Endpoints from an ``InferencePool`` (``inference.networking.k8s.io/v1``, the
Gateway API Inference Extension's), read as the extension's reference
endpoint picker reads one: the pool's ``spec.selector.matchLabels`` picks
pods in the pool's namespace; each ready pod (Ready condition true, not
terminating) with an IP is an endpoint on each of ``spec.targetPorts``
(``ip:port``), narrowed by the pod's ``inference.networking.k8s.io/active-ports``
annotation where it has one. A change of selector or ports lists the pods
again; what the new list no longer holds drains. A pool deleted (or being
deleted) drains every endpoint until it is back. ``endpointPickerRef`` is the
gateway's business; it is logged, not used.

The pool is watched by name (a field selector) with the same
``kubeapi.Reflector`` as the pods, in a thread of its own, under the
router's supervisor: a pool that cannot be read (an object the CRD's schema
would refuse, from a hand-made or loosened CRD) is logged once a streak and
counted in ``toposerve_router_loop_errors_total{loop="discovery"}``, and the
last pool read stays in use until a readable one comes."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import structlog

from toposerve.kubeapi import Reflector, connect
from toposerve.router.config import InferencePoolDiscovery
from toposerve.router.pool.endpoints import Endpoint, Pool
from toposerve.router.pool.kubernetes import CountedApi, KubernetesWatcher, Target
from toposerve.router.supervise import Streak, in_thread, supervise

log = structlog.get_logger("router.pool.inference_pool")

GROUP_VERSION = "inference.networking.k8s.io/v1"
MAX_TARGET_PORTS = 8  # the CRD's bound
# a label's key ([DNS-subdomain prefix/]name) and value, as Kubernetes checks them
_NAME = r"([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9]"
_LABEL_KEY = re.compile(rf"([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        rf"{_NAME}")
_LABEL_VALUE = re.compile(rf"({_NAME})?")


class PoolUnreadable(ValueError):
    """The pool's spec is not one the v1 CRD allows; says where, for a person."""


def pool_target(obj: Any) -> Target | None:
    """The pods and ports an InferencePool (raw JSON) names; None for a pool
    being deleted. PoolUnreadable for one whose spec is not an InferencePool's."""
    if not isinstance(obj, dict):
        raise PoolUnreadable(f"expected an object, got {type(obj).__name__}")
    meta = obj.get("metadata")
    if isinstance(meta, dict) and meta.get("deletionTimestamp") is not None:
        return None
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        raise PoolUnreadable("spec: missing or not a mapping")
    selector = spec.get("selector")
    labels = selector.get("matchLabels") if isinstance(selector, dict) else None
    if not isinstance(labels, dict) or not labels:
        raise PoolUnreadable("spec.selector.matchLabels: expected a non-empty mapping of "
                             f"label to value, got {labels!r:.80}")
    for k, v in labels.items():
        if not (isinstance(k, str) and len(k) <= 316 and _LABEL_KEY.fullmatch(k)
                and isinstance(v, str) and _LABEL_VALUE.fullmatch(v)):
            raise PoolUnreadable(f"spec.selector.matchLabels: {k!r:.80}: {v!r:.80} is not a "
                                 "Kubernetes label and value")
    ports = spec.get("targetPorts")
    if not isinstance(ports, list) or not 1 <= len(ports) <= MAX_TARGET_PORTS:
        raise PoolUnreadable(f"spec.targetPorts: expected 1 to {MAX_TARGET_PORTS} ports, "
                             f"got {ports!r:.80}")
    numbers: list[int] = []
    for i, p in enumerate(ports):
        n = p.get("number") if isinstance(p, dict) else None
        if type(n) is not int or not 1 <= n <= 65535:
            raise PoolUnreadable(f"spec.targetPorts[{i}].number: expected a port 1-65535, "
                                 f"got {n!r:.80}")
        if n in numbers:
            raise PoolUnreadable(f"spec.targetPorts[{i}].number: {n} is given twice")
        numbers.append(n)
    return Target(",".join(f"{k}={v}" for k, v in sorted(labels.items())), tuple(numbers),
                  active_ports=True)


def picker_ref(obj: dict[str, Any]) -> str | None:
    """``spec.endpointPickerRef`` as the log says it (kind/name:port)."""
    ref = (obj.get("spec") or {}).get("endpointPickerRef")
    if not isinstance(ref, dict):
        return None
    port = ref.get("port")
    number = port.get("number") if isinstance(port, dict) else None
    return f"{ref.get('kind') or 'Service'}/{ref.get('name')}" + (
        f":{number}" if number is not None else "")


class InferencePoolWatcher:
    """The pool's watch, retargeting a ``KubernetesWatcher`` of its pods."""

    def __init__(self, cfg: InferencePoolDiscovery, pool: Pool, drain_timeout_s: float,
                 on_add: Callable[[Endpoint], None] | None = None,
                 on_remove: Callable[[str], None] | None = None,
                 requests: Callable[[str], None] = lambda verb: None) -> None:
        self.cfg, self.requests = cfg, requests
        self.name = f"{cfg.namespace}/{cfg.name}"
        self.pods = KubernetesWatcher(cfg, pool, drain_timeout_s, on_add, on_remove, requests,
                                      what={"inferencePool": self.name, "watch": "pods"})
        self._streak = Streak("discovery", self._effect, inferencePool=self.name,
                              watch="InferencePool")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[None] | None = None
        self._reflector: Reflector | None = None
        self._absent: str | None = None  # why there is no pool, as last logged

    @property
    def synced(self) -> asyncio.Event:
        """Set once the pool was read (or found absent) and its pods listed."""
        return self.pods.synced

    def start(self) -> None:
        """Finds the credentials now, so that missing ones fail the start."""
        api = connect(self.cfg.kubeconfig)
        self.pods.start()
        self._loop = asyncio.get_running_loop()
        self._task = asyncio.create_task(supervise(self._streak, lambda: self._watch(api)))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self._reflector is not None:
            self._reflector.stop()
        self.pods.stop()

    def _effect(self) -> str:
        return ("the pool's last readable selector and ports stay in use"
                if self.pods.target is not None else "no endpoints until the pool is read")

    # runs on the loop
    def _set(self, target: Target, picker: str | None) -> None:
        self._absent = None
        if target != self.pods.target:
            log.info("InferencePool read; routing to the pods it selects",
                     inferencePool=self.name, selector=target.selector,
                     targetPorts=list(target.ports), endpointPickerRef=picker)
            self.pods.retarget(target)

    def _gone(self, why: str) -> None:
        if why != self._absent:
            self._absent = why
            n = self.pods.endpoint_count()
            log.warning("InferencePool " + why + (
                "; its endpoints drain, none are added until it is back" if n
                else "; no endpoints until it is created"), inferencePool=self.name,
                endpoints=n)
        self.pods.retarget(None)

    def _unreadable(self) -> None:
        if self.pods.target is None:  # nothing to route yet, and nothing to list: done
            self.pods.synced.set()

    # runs in the thread
    def _read(self, obj: Any) -> None:
        assert self._loop is not None
        try:
            target = pool_target(obj)
        except PoolUnreadable as err:
            self._streak.failed(err)
            self._loop.call_soon_threadsafe(self._unreadable)
            return
        self._streak.ok()
        if target is None:
            self._loop.call_soon_threadsafe(self._gone, "is being deleted")
        else:
            self._loop.call_soon_threadsafe(self._set, target, picker_ref(obj))

    async def _watch(self, api: Any) -> None:
        """One reflector's run: until stopped, or until it raises (the
        supervisor then starts a fresh one, which lists again)."""
        assert self._loop is not None
        loop = self._loop

        def listed(pools: list[Any], _rv: int) -> None:
            if pools:
                self._read(pools[0])
            else:
                self._streak.ok()
                loop.call_soon_threadsafe(self._gone, "not found")

        def event(kind: str, obj: dict[str, Any]) -> None:
            if kind == "DELETED":
                self._streak.ok()
                loop.call_soon_threadsafe(self._gone, "deleted")
            else:
                self._read(obj)

        self._reflector = reflector = Reflector(
            CountedApi(api, self.requests),
            f"/apis/{GROUP_VERSION}/namespaces/{self.cfg.namespace}/inferencepools",
            [("fieldSelector", f"metadata.name={self.cfg.name}")], listed, event,
            self._streak.failed, timeout=self.cfg.watch_timeout_s)
        try:
            await in_thread(reflector.run, "inferencepool-watch")
        finally:
            reflector.stop()
