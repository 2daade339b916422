"""The pure parts of device health and placement (``router.pool.devices``):
which claims a pod uses, what a claim was allocated, a node's slices by
pool generation with their taints; and that the pool routes to no endpoint
holding a tainted device, while its requests in flight go on."""

from __future__ import annotations

from typing import Any

import pytest

from toposerve.dra_driver.gpu.devices import DRIVER as GPU
from toposerve.dra_driver.gpu.devices import gpu_pool
from toposerve.router.pool.devices import (
    DeviceTaint,
    NodeSlices,
    allocated,
    pod_claims,
    rule_of,
)
from toposerve.router.pool.endpoints import Endpoint, Pool
from toposerve.topology.model import DomainPath, NodeTopology
from toposerve.topology.profiles import load_profile

pytestmark = pytest.mark.unit


def test_claims_named_and_made_from_templates() -> None:
    pod = {"spec": {"resourceClaims": [
        {"name": "gpu", "resourceClaimTemplateName": "one-gpu"},
        {"name": "shared", "resourceClaimName": "fabric"},
        {"name": "later", "resourceClaimTemplateName": "nic"},  # not made yet
        "junk"]},
        "status": {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu-x7"},
                                             {"name": "later"}]}}
    assert pod_claims(pod) == ["p-gpu-x7", "fabric"]
    assert pod_claims({}) == []


def test_allocation_results() -> None:
    assert allocated({"status": {}}) is None
    claim = {"status": {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": GPU, "pool": "n1", "device": "gpu-3"}, 7]}}}}
    assert allocated(claim) == ((GPU, "n1", "gpu-3"),)


def _slice(name: str, pool: str, generation: int, devices: list[dict[str, Any]]
           ) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {
        "driver": GPU, "nodeName": pool, "pool": {"name": pool, "generation": generation,
                                                  "resourceSliceCount": 1},
        "devices": devices}}


def gpus(node: str) -> list[dict[str, Any]]:
    """An HGX node's GPUs as the GPU driver publishes them."""
    n = NodeTopology(name=node, path=DomainPath(host=node), profile="hgx-h100",
                     hardware=load_profile("hgx-h100").hardware())
    return [dict(d) for d in gpu_pool(n, partitions=False).devices]


def test_the_newest_generation_its_place_and_taints_that_stop_routing() -> None:
    devices = gpus("n1")
    slices = NodeSlices()
    slices.listed([_slice("n1-gpu-a", "n1", 1, devices)])
    ref = (GPU, "n1", "gpu-1")
    held = slices.holding([ref, (GPU, "n2", "gpu-0")])  # another node's pool: not here
    assert [d.name for d in held.devices.devices] == ["gpu-1"]
    assert held.devices.devices[0].pcie_root == "pci0000:15" and held.taints == ()
    # republished as generation 2 with taints: the old slice lingers a moment
    tainted = [{**d, "taints": [{"key": f"{GPU}/xid", "value": "79", "effect": "NoSchedule"},
                                {"key": "note", "effect": "None"}]}
               if d["name"] == "gpu-1" else d for d in devices]
    slices.event("ADDED", _slice("n1-gpu-b", "n1", 2, tainted))
    assert slices.holding([ref]).taints == (
        DeviceTaint(f"{GPU}/n1/gpu-1", f"{GPU}/xid", "79", "NoSchedule"),)
    assert str(slices.holding([ref]).taints[0]) == f"{GPU}/n1/gpu-1 {GPU}/xid=79:NoSchedule"
    slices.event("DELETED", _slice("n1-gpu-b", "n1", 2, []))
    assert slices.holding([ref]).taints == ()
    slices.event("MODIFIED", {"metadata": {}})  # no name: ignored
    slices.listed([])
    assert slices.holding([ref]).devices.devices == ()


def test_device_taint_rules_select_by_driver_pool_and_name() -> None:
    slices = NodeSlices()
    slices.listed([_slice("s", "n1", 1, gpus("n1"))])

    def rule(effect: str, **selector: str) -> dict[str, Any]:
        return {"metadata": {"name": "r"}, "spec": {
            "deviceSelector": selector, "taint": {"key": "drain", "effect": effect}}}

    assert rule_of(rule("None", pool="n1")) is None  # does not stop routing
    assert rule_of({"spec": {"deviceSelector": "x", "taint": {}}}) is None
    whole_pool = rule_of(rule("NoExecute", pool="n1"))
    one = rule_of(rule("NoSchedule", driver=GPU, device="gpu-2"))
    other = rule_of(rule("NoSchedule", driver="net.toposerve.io"))
    assert whole_pool and one and other
    rules = [whole_pool, one, other]
    assert slices.holding([(GPU, "n1", "gpu-2")], rules).taints == (
        DeviceTaint(f"{GPU}/n1/gpu-2", "drain", "", "NoExecute"),
        DeviceTaint(f"{GPU}/n1/gpu-2", "drain", "", "NoSchedule"))
    assert [t.effect for t in slices.holding([(GPU, "n1", "gpu-1")], rules).taints] == [
        "NoExecute"]
    assert slices.holding([(GPU, "n1", "gpu-1")], [one, other]).taints == ()


def test_a_tainted_endpoint_leaves_rotation_and_comes_back() -> None:
    pool = Pool()
    a = pool.upsert(Endpoint(url="http://a:1", models=frozenset({"m"})))
    b = pool.upsert(Endpoint(url="http://b:1", models=frozenset({"m"})))
    a.begin(10, 10)  # a request in flight there
    a.taints = (DeviceTaint("d/p/gpu-0", "k", "", "NoExecute"),)
    assert pool.routable() == [b]
    b.taints = a.taints
    # the model is still served, by servers out of rotation: 503, not 404
    assert pool.routable() == [] and pool.may_serve("m")
    a.end(10, 10)  # the request finished: the endpoint stays, out of rotation
    assert pool.get(a.url) is a
    a.taints = b.taints = ()
    assert pool.routable() == [a, b]
    # discovery's next view keeps what the device watch said
    pool.upsert(Endpoint(url="http://a:1", taints=(DeviceTaint("d/p/gpu-0", "k", "", "x"),)))
    assert pool.routable() == [b]
