"""GPU and NIC on one PCIe root, as a claim asks for it with
``matchAttribute: resource.kubernetes.io/pcieRoot`` across the two
drivers: the real kube-scheduler allocates from ``driver simulate``'s slices
on kwok nodes, every allocation is aligned (by the published attributes
and by the topology model), and a claim no root can hold stays pending
with the scheduler's reason.

The environment (simulated slices, classes, namespace) and the pod runs
are ``test_dra_allocation``'s; the RDMA NIC class is made here as the
install's DeviceClass selects it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from harness.waiting import wait_for
from tests.dra import test_dra_allocation as alloc
from tests.dra.test_dra_allocation import (
    NET,
    RES,
    STD,
    Env,
    Run,
    _all_scheduled,
    _delete,
    _request,
    _run,
)
from toposerve.topology.model import DeviceKind
from toposerve.topology.profiles import load_profile

pytestmark = pytest.mark.cluster
env, runs = alloc.env, alloc.runs  # its fixtures, here by name
HGX = {"topology.toposerve.io/profile": "hgx-h100"}
ROOT = f"{STD}/pcieRoot"
ATTRS = f"device.attributes['{NET}']"


@pytest.fixture(scope="module")
def rdma_class(env: Env) -> Iterator[str]:
    """The RDMA NIC class as ``manifests/templates/device-classes.yaml.j2`` writes it."""
    name = f"ts-align-rdma-{uuid.uuid4().hex[:6]}"
    env.rest.request("POST", f"{RES}/deviceclasses", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{NET}'"}},
                               {"cel": {"expression": f"'rdma' in {ATTRS} && "
                                                      f"{ATTRS}.rdma == true"}}]}})
    try:
        yield name
    finally:
        _delete(env.rest, f"{RES}/deviceclasses/{name}")


def test_two_gpus_and_two_fast_rdma_nics_per_root(env: Env, runs: list[Run],
                                                  rdma_class: str) -> None:
    # 4 hgx-h100 nodes x 4 roots of 2 GPUs + 2 400G NICs: only exact quartets fit all 16 pods
    fast = f"device.capacity['{NET}'].linkSpeed.compareTo(quantity('200G')) >= 0"
    run = _run(env, runs, 16, [_request("gpu", env.classes["gpu"], count=2),
                               _request("nic", rdma_class, count=2, selector=fast)],
               [{"requests": ["gpu", "nic"], "matchAttribute": ROOT}], HGX)
    hw = load_profile("hgx-h100").hardware()
    roots_used: set[tuple[str, str]] = set()
    for results in _all_scheduled(run, timeout=120).values():
        assert sorted(r["request"] for r in results) == ["gpu", "gpu", "nic", "nic"]
        (pool,) = {r["pool"] for r in results}
        roots = {run.attr(r, ROOT) for r in results}
        assert len(roots) == 1, results
        # the model agrees: the devices sit under that root, NICs are RDMA NICs
        places = [hw.place(r["device"]) for r in results]
        assert {p.root for p in places} == roots
        nics = [p.device for p in places if p.device.kind == DeviceKind.NIC]
        assert len(nics) == 2 and all(n.rdma_device for n in nics)
        assert all(r["driver"] == NET for r in results if r["request"] == "nic")
        roots_used.add((pool, roots.pop()))
    assert len(roots_used) == 16  # every root of every node, once


def test_unalignable_claim_stays_pending_with_reason(env: Env, runs: list[Run]) -> None:
    # a root holds two NICs, never three
    run = _run(env, runs, 1, [_request("gpu", env.classes["gpu"]),
                              _request("nic", env.classes["nic"], count=3)],
               [{"requests": ["gpu", "nic"], "matchAttribute": ROOT}], HGX)
    (msg,) = wait_for("FailedScheduling", lambda: list(run.unschedulable().values()),
                      timeout=60, interval=0.5)
    assert "cannot allocate all claims" in msg, msg
    pod = env.rest.request("GET", f"/api/v1/namespaces/{env.ns}/pods/{run.pods[0]}")
    cond = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert (cond["status"], cond["reason"]) == ("False", "Unschedulable")
    assert not run.scheduled() and not run.allocations()
