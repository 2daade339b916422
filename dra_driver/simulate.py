"""``toposerve driver simulate``: one process publishes GPU and NIC
ResourceSlices (``gpu.toposerve.io``, ``net.toposerve.io``; or one driver's
alone, ``--drivers``) for every kwok fake node of a cluster, from the profile
``cluster up`` recorded on the node (label ``topology.toposerve.io/profile``)
or ``--profile``, with the same publisher (and device builders) the real
drivers use. It follows nodes as they come and go through one watch, and the
real scheduler then allocates claims from the slices, at scale.

Its slices carry the label ``dra.toposerve.io/publisher=simulate`` and its
watches select it, so it never touches the slices of a real node's driver.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import cache
from typing import Any

import orjson
import structlog

from toposerve.dra_driver.gpu.devices import DRIVER as GPU_DRIVER
from toposerve.dra_driver.gpu.devices import PARTITIONS_LABEL, gpu_pool, partitions_wanted
from toposerve.dra_driver.kubeletplugin.liveness import HttpEndpoints, metrics_route
from toposerve.dra_driver.net.devices import DRIVER as NET_DRIVER
from toposerve.dra_driver.net.devices import nic_pool
from toposerve.dra_driver.resourceslice import Pool, SlicePublisher
from toposerve.kubeapi import ApiError, JsonApi, Reflector
from toposerve.kubeapi.typed import CoreV1Api
from toposerve.topology.config_file import ConfigError
from toposerve.topology.labels import PRESETS, PROFILE_LABEL, DialectName, from_labels
from toposerve.topology.model import DomainPath, NodeHardware, NodeTopology
from toposerve.topology.profiles import load_profile

log = structlog.get_logger("toposerve.dra.simulate")

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
PUBLISHER_LABEL = "dra.toposerve.io/publisher"
LABELS = {PUBLISHER_LABEL: "simulate"}
NODES_PATH = "/api/v1/nodes"


@dataclass(frozen=True)
class SimNode:
    """What decides a fake node's pools."""

    name: str
    uid: str
    profile: str
    path: DomainPath
    partitions: bool = True  # devices.PARTITIONS_LABEL


def sim_node(obj: Mapping[str, Any], profile: str | None,
             dialect: DialectName) -> SimNode | str | None:
    """The node's pool inputs; ``None`` for a node that is not a kwok fake
    node (left alone), a reason string for a fake node we cannot publish."""
    meta = obj.get("metadata") or {}
    if (meta.get("annotations") or {}).get(KWOK_ANNOTATION) != "fake":
        return None
    labels = meta.get("labels") or {}
    name = meta["name"]
    chosen = profile or labels.get(PROFILE_LABEL)
    if not chosen:
        return f"node {name} has no {PROFILE_LABEL} label; give --profile"
    return SimNode(name=name, uid=meta.get("uid", ""), profile=chosen,
                   path=from_labels(name, labels, PRESETS[dialect]),
                   partitions=partitions_wanted(labels))


@cache
def _hardware(profile: str) -> NodeHardware:
    return load_profile(profile).hardware()


def _gpu(topo: NodeTopology, node: SimNode) -> Pool:
    return gpu_pool(topo, node_uid=node.uid, partitions=node.partitions)


def _nics(topo: NodeTopology, node: SimNode) -> Pool:
    return nic_pool(topo, node_uid=node.uid)


# What each simulated driver publishes for a node. A cluster may run either
# driver alone; every device of a node is one more the scheduler's
# allocator converts and matches on each node it filters (docs/scale.md).
POOLS: dict[str, Callable[[NodeTopology, SimNode], Pool]] = {GPU_DRIVER: _gpu,
                                                             NET_DRIVER: _nics}


class Simulator:
    """One publisher per simulated driver and the node watch that feeds them."""

    def __init__(self, api: Any, *, profile: str | None = None,
                 dialect: DialectName = DialectName.TOPOSERVE, workers: int = 8,
                 sync_delay: float = 1.0, watch_timeout: int = 300,
                 drivers: Sequence[str] = tuple(POOLS)) -> None:
        unknown = sorted(set(drivers) - set(POOLS))
        if unknown or not drivers:
            raise ValueError(f"drivers: {', '.join(unknown) or 'none given'}; choose from "
                             f"{', '.join(POOLS)}")
        self._profile = profile
        self._dialect = dialect
        kw: dict[str, Any] = dict(labels=LABELS, workers=workers, sync_delay=sync_delay,
                                  watch_timeout=watch_timeout)
        # driver -> (its pool for a node, its publisher), in POOLS' order
        self._drivers = {d: (build, SlicePublisher(api, d, **kw))
                         for d, build in POOLS.items() if d in drivers}
        self._lock = threading.Lock()
        self._nodes: dict[str, SimNode] = {}
        self._skipped: dict[str, str] = {}
        self._nodes_listed = False
        self._nodes_error = ""
        self._reflector = Reflector(JsonApi(api), NODES_PATH, [], self._on_list,
                                    self._on_event, self._on_error, timeout=watch_timeout)
        self._thread: threading.Thread | None = None

    @property
    def publishers(self) -> tuple[SlicePublisher, ...]:
        return tuple(pub for _, pub in self._drivers.values())

    def start(self) -> None:
        for p in self.publishers:
            p.start()
        self._thread = threading.Thread(target=self._reflector.run, name="sim-nodes",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._reflector.stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for p in self.publishers:
            p.stop()

    def uninstall(self) -> int:
        """Delete every slice this simulator publishes; how many."""
        return sum(p.uninstall() for p in self.publishers)

    def nodes(self) -> dict[str, SimNode]:
        with self._lock:
            return dict(self._nodes)

    def ready(self) -> bool:
        """Every fake node listed and published, nothing left to write."""
        return self._nodes_listed and all(p.wait_synced(0) and p.idle() and
                                          not p.status()["failingPools"]
                                          for p in self.publishers)

    def status(self) -> dict[str, Any]:
        with self._lock:
            nodes, skipped = len(self._nodes), dict(self._skipped)
        return {"nodes": nodes, "skipped": skipped, "nodesWatching": self._reflector.watching,
                "nodesError": self._nodes_error, "ready": self.ready(),
                "publishers": [p.status() for p in self.publishers]}

    def healthy(self) -> str | None:
        """None when the watches are up, else what is wrong."""
        if not self._reflector.watching:
            return f"node watch down: {self._nodes_error or 'starting'}"
        for p in self.publishers:
            if not p.watching:
                return f"{p.driver} slice watch down: {p.last_error or 'starting'}"
        return None

    # -- nodes --------------------------------------------------------------

    @staticmethod
    def _topology(node: SimNode) -> NodeTopology:
        return NodeTopology(name=node.name, path=node.path, profile=node.profile,
                            hardware=_hardware(node.profile))

    def _check(self, obj: Mapping[str, Any]) -> SimNode | None:
        """The node to publish for, or None (not ours, or skipped with a reason)."""
        name = obj["metadata"]["name"]
        got = sim_node(obj, self._profile, self._dialect)
        if isinstance(got, SimNode):
            try:
                _hardware(got.profile)
            except ConfigError as err:
                got = f"node {name}: {str(err).splitlines()[0]}"
        if isinstance(got, str):
            with self._lock:
                first = self._skipped.get(name) != got
                self._skipped[name] = got
            if first:
                log.warning("not publishing for a fake node", error=got)
            return None
        with self._lock:
            self._skipped.pop(name, None)
        return got

    def _apply(self, obj: Mapping[str, Any]) -> None:
        name = obj["metadata"]["name"]
        got = self._check(obj)
        with self._lock:
            before = self._nodes.get(name)
        if got is None:
            self._forget(name)
            return
        if got == before:
            return  # kwok's status heartbeats: nothing of ours changed
        with self._lock:
            self._nodes[name] = got
        topo = self._topology(got)
        for build, pub in self._drivers.values():
            pub.set_pool(build(topo, got))

    def _forget(self, name: str) -> None:
        with self._lock:
            known = self._nodes.pop(name, None) is not None
            self._skipped.pop(name, None)
        if known:
            for p in self.publishers:
                p.remove_pool(name)

    def _on_list(self, items: list[dict[str, Any]], rv: int) -> None:
        """Every node at once: the publishers' whole desired state, so a
        (re)start deletes only what really is gone."""
        nodes = {n.name: n for o in items if (n := self._check(o)) is not None}
        # generators: each node's devices are packed before the next is built
        for build, pub in self._drivers.values():
            pub.set_pools(build(self._topology(n), n) for n in nodes.values())
        with self._lock:
            self._nodes = nodes
            self._skipped = {k: v for k, v in self._skipped.items()
                             if k in {o["metadata"]["name"] for o in items}}
        self._nodes_listed = True
        log.info("nodes listed", fake_nodes=len(self.nodes()))

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "DELETED":
            self._forget(obj["metadata"]["name"])
        else:
            self._apply(obj)

    def _on_error(self, err: Exception) -> None:
        self._nodes_error = str(err)
        log.warning("node watch failed; retrying", error=str(err)[:300])


def label_partitions(api: Any, nodes: Iterable[str], on: bool, workers: int = 16) -> int:
    """Set ``PARTITIONS_LABEL`` on the nodes (``off``: whole GPUs only), as
    an operator labels the nodes whose GPUs run without MIG; how many."""
    core = CoreV1Api(api)
    body = {"metadata": {"labels": {PARTITIONS_LABEL: "on" if on else "off"}}}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return len(list(pool.map(lambda n: core.patch_node(n, body, _request_timeout=30),
                                 nodes)))


def endpoints(host: str, port: int, sim: Simulator) -> HttpEndpoints:
    """``/metrics``, ``/healthz`` (watches up), ``/readyz`` (everything
    published) and ``/status`` (JSON, for people)."""

    def health() -> tuple[int, bytes, str]:
        problem = sim.healthy()
        return (200, b"ok\n", "text/plain") if problem is None else (
            503, f"{problem}\n".encode(), "text/plain")

    def ready() -> tuple[int, bytes, str]:
        return (200, b"ok\n", "text/plain") if sim.ready() else (
            503, b"publishing\n", "text/plain")

    def status() -> tuple[int, bytes, str]:
        return 200, orjson.dumps(sim.status(), option=orjson.OPT_INDENT_2), "application/json"

    return HttpEndpoints(host, port, {"/healthz": health, "/readyz": ready, "/status": status,
                                      "/metrics": metrics_route})


def run(api: Any, *, profile: str | None, dialect: DialectName, workers: int,
        http_address: tuple[str, int] | None, uninstall: bool, stop: threading.Event,
        drivers: Sequence[str] = tuple(POOLS)) -> int:
    """The command: publish until ``stop`` is set (or delete and exit)."""
    if profile is not None:
        try:
            load_profile(profile)
        except ConfigError as err:
            raise ValueError(str(err).splitlines()[0]) from None
    sim = Simulator(api, profile=profile, dialect=dialect, workers=workers, drivers=drivers)
    if uninstall:
        try:
            n = sim.uninstall()
        except ApiError as err:
            raise ValueError(f"cannot delete the simulated slices: {err}") from None
        print(f"deleted {n} simulated ResourceSlices")
        return 0
    try:
        http = endpoints(*http_address, sim) if http_address else None
    except OSError as err:  # before anything is published
        raise ValueError(f"--http-address {':'.join(map(str, http_address or ()))}: cannot "
                         f"listen: {err.strerror or err}; give a free address") from None
    sim.start()
    if http is not None:
        http.start()
    stop.wait()
    log.info("stopping")
    if http is not None:
        http.stop()
    sim.stop()
    return 0
