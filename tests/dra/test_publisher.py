"""The slice publisher against the real apiserver: splitting, owner
references, steady state without writes, generation bumps, self-healing
after deletion, edits and a kubelet-style wipe, a watch that resumes
instead of relisting, an apiserver outage, a dropped field named by its
gate, and uninstall. Each test publishes under a driver name of its own."""

from __future__ import annotations

import contextlib
import copy
import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
from kubernetes import client

from harness.waiting import wait_for
from tests.conftest import Cluster
from toposerve.dra_driver.gpu.devices import gpu_pool
from toposerve.dra_driver.resourceslice import Pool, SlicePublisher
from toposerve.kubeapi import JsonApi
from toposerve.topology.model import DomainPath, NodeTopology
from toposerve.topology.profiles import load_profile

pytestmark = pytest.mark.cluster
NODE = "hgx-h100-0000"
PATH = "/apis/resource.k8s.io/v1/resourceslices"


def _devices(n: int, tag: str = "") -> tuple[dict[str, Any], ...]:
    return tuple({"name": f"dev-{i}", "attributes": {"index": {"int": i},
                                                     "tag": {"string": tag or "t"}},
                  "capacity": {"memory": {"value": "1Gi"}}} for i in range(n))


@pytest.fixture
def driver() -> str:
    return f"pub-{uuid.uuid4().hex[:8]}.test.toposerve.io"


def _slices(api: Any, driver: str) -> list[dict[str, Any]]:
    items = JsonApi(api).request("GET", PATH, [("fieldSelector", f"spec.driver={driver}")])
    return sorted(items["items"], key=lambda o: o["metadata"]["name"])


def _versions(items: list[dict[str, Any]]) -> dict[str, str]:
    return {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in items}


@pytest.fixture
def publisher(cluster: Cluster, driver: str) -> Iterator[SlicePublisher]:
    p = SlicePublisher(cluster.api, driver, sync_delay=0.1, workers=4)
    try:
        yield p
    finally:
        p.stop()
        p.uninstall()


def _published(cluster: Cluster, driver: str, count: int, generation: int | None = None
               ) -> list[dict[str, Any]]:
    """The driver's slices once there are ``count`` of one generation, else []."""
    items = _slices(cluster.api, driver)
    if len(items) != count:
        return []
    gens = {o["spec"]["pool"]["generation"] for o in items}
    if len(gens) != 1 or (generation is not None and gens != {generation}):
        return []
    return items


def test_split_owner_and_steady_state(cluster: Cluster, driver: str,
                                      publisher: SlicePublisher) -> None:
    publisher.set_pools([Pool(name=NODE, node_name=NODE, devices=_devices(200))])
    publisher.start()
    items = wait_for("two slices", lambda: _published(cluster, driver, 2, 1), timeout=30)
    node_uid = JsonApi(cluster.api).request("GET", f"/api/v1/nodes/{NODE}")["metadata"]["uid"]
    assert [o["metadata"]["name"] for o in items] == [f"{NODE}-{driver}-00", f"{NODE}-{driver}-01"]
    assert [len(o["spec"]["devices"]) for o in items] == [128, 72]
    for o in items:
        assert o["spec"]["nodeName"] == NODE and o["spec"]["driver"] == driver
        assert o["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 2}
        (owner,) = o["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("Node", NODE, node_uid)
    assert publisher.stats.creates == 2
    wait_for("publisher idle", publisher.idle)
    before = _versions(items)
    writes = publisher.stats.writes
    # steady state: a full pass, and a fresh publisher (a restarted driver), write nothing
    assert publisher.reconcile_once().writes == 0
    again = SlicePublisher(cluster.api, driver)
    again.set_pools([Pool(name=NODE, node_name=NODE, devices=_devices(200))])
    assert again.reconcile_once().writes == 0
    assert publisher.stats.writes == writes
    assert _versions(_slices(cluster.api, driver)) == before


def test_change_bumps_generation(cluster: Cluster, driver: str,
                                 publisher: SlicePublisher) -> None:
    publisher.set_pools([Pool(name=NODE, node_name=NODE, devices=_devices(200))])
    publisher.start()
    wait_for("published", lambda: _published(cluster, driver, 2, 1), timeout=30)
    publisher.set_pools([Pool(name=NODE, node_name=NODE, devices=_devices(200, "changed"))])
    items = wait_for("generation 2", lambda: _published(cluster, driver, 2, 2), timeout=30)
    assert all(d["attributes"]["tag"] == {"string": "changed"}
               for o in items for d in o["spec"]["devices"])
    # fewer devices: one slice, the second deleted
    publisher.set_pools([Pool(name=NODE, node_name=NODE, devices=_devices(10))])
    (only,) = wait_for("one slice", lambda: _published(cluster, driver, 1, 3), timeout=30)
    assert only["spec"]["pool"]["resourceSliceCount"] == 1
    # a pool no longer named is deleted
    publisher.set_pools([])
    wait_for("pool deleted", lambda: not _slices(cluster.api, driver), timeout=30)


def test_self_heals_after_delete_edit_and_wipe(cluster: Cluster, driver: str,
                                               publisher: SlicePublisher) -> None:
    res = client.ResourceV1Api(cluster.api)
    publisher.set_pools([Pool(name=NODE, node_name=NODE, devices=_devices(200))])
    publisher.start()
    first = wait_for("published", lambda: _published(cluster, driver, 2, 1), timeout=30)
    # someone deletes a slice
    res.delete_resource_slice(first[1]["metadata"]["name"])
    healed = wait_for("recreated", lambda: _published(cluster, driver, 2, 2), timeout=30)
    assert healed[1]["metadata"]["uid"] != first[1]["metadata"]["uid"]
    # someone edits a device
    rest = JsonApi(cluster.api)
    name = healed[0]["metadata"]["name"]
    edited = rest.request("GET", f"{PATH}/{name}")
    edited["spec"]["devices"][0]["attributes"]["tag"] = {"string": "tampered"}
    rest.request("PUT", f"{PATH}/{name}", body=edited)
    restored = wait_for("edit undone", lambda: _published(cluster, driver, 2, 3), timeout=30)
    assert restored[0]["spec"]["devices"][0]["attributes"]["tag"] == {"string": "t"}
    # a restarting kubelet wipes the node's slices of the driver
    res.delete_collection_resource_slice(field_selector=f"spec.nodeName={NODE},spec.driver={driver}")
    # the deletions reach the watch one at a time, so the publisher may repair
    # the first before it sees the second: the generation it ends at depends on
    # that order, but the whole pool comes back, new slices of one generation
    gone = {o["metadata"]["uid"] for o in restored}
    wait_for("republished after wipe", lambda: (
        (items := _published(cluster, driver, 2))
        and not gone & {o["metadata"]["uid"] for o in items}), timeout=30)
    assert publisher.watching and publisher._reflector.lists == 1


def test_watch_resumes_without_relisting(cluster: Cluster, driver: str) -> None:
    p = SlicePublisher(cluster.api, driver, sync_delay=0.1, watch_timeout=1)
    try:
        p.set_pools([Pool(name=NODE, node_name=NODE, devices=_devices(3))])
        p.start()
        wait_for("published", lambda: _published(cluster, driver, 1, 1), timeout=30)
        r = p._reflector
        wait_for("three watches", lambda: r.watches >= 3, timeout=30)
        assert r.lists == 1  # each watch resumed from the last resourceVersion
        # and still sees what happens: a deletion between two watches is repaired
        client.ResourceV1Api(cluster.api).delete_collection_resource_slice(
            field_selector=f"spec.driver={driver}")
        wait_for("republished", lambda: _published(cluster, driver, 1), timeout=30)
        assert r.lists == 1
    finally:
        p.stop()
        p.uninstall()


class _Proxy:
    """A TCP relay to the apiserver that a test can cut and restore: an outage
    the publisher cannot tell from a real one."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._srv = socket.create_server(("127.0.0.1", 0))
        self.port = self._srv.getsockname()[1]
        self._conns: list[socket.socket] = []
        self._up = threading.Event()
        self._up.set()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self._srv.accept()
            except OSError:
                return
            if not self._up.is_set():
                c.close()
                continue
            u = socket.create_connection(self.target)
            self._conns += [c, u]
            for a, b in ((c, u), (u, c)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                s.close()

    def cut(self) -> None:
        self._up.clear()
        for s in self._conns:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
        self._conns = []

    def restore(self) -> None:
        self._up.set()

    def close(self) -> None:
        self.cut()
        self._srv.close()


def test_outage_is_retried_with_backoff(cluster: Cluster, driver: str) -> None:
    cfg = cluster.api.configuration
    url = urlparse(cfg.host)
    proxy = _Proxy((url.hostname or "127.0.0.1", url.port or 443))
    pcfg = copy.deepcopy(cfg)
    pcfg.host = f"{url.scheme}://127.0.0.1:{proxy.port}"
    api = client.ApiClient(pcfg)
    p = SlicePublisher(api, driver, sync_delay=0.1, max_backoff=1.0)
    res = client.ResourceV1Api(cluster.api)
    try:
        p.set_pools([Pool(name=NODE, node_name=NODE, devices=_devices(3))])
        p.start()
        (first,) = wait_for("published", lambda: _published(cluster, driver, 1, 1), timeout=30)
        proxy.cut()
        wait_for("watch noticed the outage", lambda: not p.watching, timeout=30)
        res.delete_resource_slice(first["metadata"]["name"])  # drift during the outage
        p.set_pools([Pool(name=NODE, node_name=NODE, devices=_devices(4))])
        wait_for("sync failures counted", lambda: p.status()["failingPools"] == 1, timeout=30)
        proxy.restore()
        # the slice was gone, so the pool starts again at generation 1
        (healed,) = wait_for("published after the outage", lambda: [
            o for o in _published(cluster, driver, 1) if len(o["spec"]["devices"]) == 4],
            timeout=60)
        assert healed["metadata"]["uid"] != first["metadata"]["uid"]
        wait_for("no failing pools", lambda: p.status()["failingPools"] == 0, timeout=30)
    finally:
        p.stop()
        proxy.close()
        SlicePublisher(cluster.api, driver).uninstall()


def test_partitions_taints_and_dropped_field(cluster: Cluster, driver: str,
                                             publisher: SlicePublisher) -> None:
    topo = NodeTopology(name=NODE, path=DomainPath(host=NODE), profile="hgx-h100",
                        hardware=load_profile("hgx-h100").hardware())
    pool = gpu_pool(topo)
    taint = {"key": "gpu.toposerve.io/unhealthy", "effect": "NoSchedule"}
    devices = [dict(d) for d in pool.devices]
    devices[1] = {**devices[1], "taints": [taint]}
    # a field behind a gate that is off in 1.37.2: the apiserver drops it
    devices[2] = {**devices[2], "nodeAllocatableResources": {
        "memory": {"overhead": {"perPod": "1Gi"}}}}
    publisher.set_pools([Pool(name=NODE, node_name=NODE, devices=tuple(devices),
                              shared_counters=pool.shared_counters)])
    publisher.start()
    items = wait_for("three slices", lambda: _published(cluster, driver, 3, 1), timeout=30)
    assert "sharedCounters" in items[0]["spec"] and "devices" not in items[0]["spec"]
    assert len(items[0]["spec"]["sharedCounters"]) == 8
    assert [len(o["spec"]["devices"]) for o in items[1:]] == [64, 16]
    got = items[1]["spec"]["devices"][1]
    assert got["taints"][0]["key"] == taint["key"] and got["taints"][0]["timeAdded"]
    assert got["consumesCounters"][0]["counterSet"] == "gpu-1-counters"
    dropped = publisher.dropped_fields()
    assert dropped == {items[1]["metadata"]["name"]: [
        ("spec.devices[gpu-2].nodeAllocatableResources", "DRANodeAllocatableResources")]}
    # the server's stamps and drops are no reason to write again
    wait_for("idle", publisher.idle)
    writes = publisher.stats.writes
    assert publisher.reconcile_once().writes == 0 and publisher.stats.writes == writes


def test_uninstall_deletes_only_its_own(cluster: Cluster, driver: str) -> None:
    mine = SlicePublisher(cluster.api, driver, labels={"test.toposerve.io/owner": "a"})
    other = SlicePublisher(cluster.api, driver, node_name="hgx-h100-0001")
    try:
        mine.set_pools([Pool(name=NODE, node_name=NODE, devices=_devices(200))])
        other.set_pools([Pool(name="hgx-h100-0001", node_name="hgx-h100-0001",
                              devices=_devices(1))])
        assert mine.reconcile_once().creates == 2 and other.reconcile_once().creates == 1
        # each sees only its scope: neither deletes the other's pool
        assert mine.reconcile_once().writes == 0 and other.reconcile_once().writes == 0
        assert mine.uninstall() == 2
        assert [o["spec"]["nodeName"] for o in _slices(cluster.api, driver)] == ["hgx-h100-0001"]
    finally:
        other.uninstall()
    assert not _slices(cluster.api, driver)
