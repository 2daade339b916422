"""The real kube-scheduler allocates claims from ``driver simulate``'s
slices: GPUs on one PCIe switch, on one NUMA node, in one NVLink domain, a
GPU and a NIC on one PCIe root, partitions that are never double-booked,
each constraint honoured across many pods, and claims that cannot be met
left pending with the scheduler's reason.

The DeviceClasses are made here under names of this module's own; the
namespace and every simulated slice go away at the end."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from harness.waiting import wait_for
from tests.conftest import Cluster
from toposerve.dra_driver.simulate import LABELS, Simulator
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster.nodes import KWOK_TOLERATION
from toposerve.topology.profiles import load_profile

pytestmark = pytest.mark.cluster
RES = "/apis/resource.k8s.io/v1"
STD = "resource.kubernetes.io"
GPU, NET = "gpu.toposerve.io", "net.toposerve.io"


@dataclass
class Env:
    rest: JsonApi
    ns: str
    classes: dict[str, str]          # kind -> DeviceClass name
    attrs: dict[tuple[str, str, str], dict[str, Any]]   # (driver, pool, device) -> attributes


def _slices(rest: JsonApi, driver: str) -> list[dict[str, Any]]:
    sel = ",".join(f"{k}={v}" for k, v in LABELS.items())
    return list(rest.request("GET", f"{RES}/resourceslices", [
        ("fieldSelector", f"spec.driver={driver}"), ("labelSelector", sel)])["items"])


def _expected_slices(cluster: Cluster) -> dict[str, int]:
    # hgx-h100 GPUs come with partitions: a counter slice and two device slices
    gpu = sum(c * (3 if p == "hgx-h100" else 1) for p, c in cluster.groups)
    return {GPU: gpu, NET: sum(c for _, c in cluster.groups)}


@pytest.fixture(scope="module")
def env(cluster: Cluster) -> Iterator[Env]:
    rest = JsonApi(cluster.api)
    sim = Simulator(cluster.api, sync_delay=0.2)
    tag = uuid.uuid4().hex[:6]
    ns = f"dra-alloc-{tag}"
    classes = {"gpu": f"ts-alloc-gpu-{tag}", "mig": f"ts-alloc-mig-{tag}",
               "nic": f"ts-alloc-nic-{tag}"}
    exprs = {"gpu": f"device.driver == '{GPU}' && device.attributes['{GPU}'].type == 'gpu'",
             "mig": f"device.driver == '{GPU}' && device.attributes['{GPU}'].type == 'mig'",
             "nic": f"device.driver == '{NET}'"}
    sim.start()
    try:
        want = _expected_slices(cluster)
        wait_for("simulated slices published", lambda: sim.ready() and all(
            len(_slices(rest, d)) == n for d, n in want.items()), timeout=120, interval=0.5)
        for kind, name in classes.items():
            rest.request("POST", f"{RES}/deviceclasses", body={
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": name},
                "spec": {"selectors": [{"cel": {"expression": exprs[kind]}}]}})
        rest.request("POST", "/api/v1/namespaces", body={
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        wait_for("default service account", lambda: _exists(
            rest, f"/api/v1/namespaces/{ns}/serviceaccounts/default"), timeout=60)
        attrs = {(o["spec"]["driver"], o["spec"]["pool"]["name"], d["name"]): d["attributes"]
                 for drv in (GPU, NET) for o in _slices(rest, drv)
                 for d in o["spec"].get("devices") or ()}
        yield Env(rest=rest, ns=ns, classes=classes, attrs=attrs)
    finally:
        for name in classes.values():
            _delete(rest, f"{RES}/deviceclasses/{name}")
        _delete(rest, f"/api/v1/namespaces/{ns}")
        sim.stop()
        sim.uninstall()
        wait_for("simulated slices gone", lambda: not any(
            _slices(rest, d) for d in (GPU, NET)), timeout=60)


def _exists(rest: JsonApi, path: str) -> bool:
    try:
        rest.request("GET", path)
        return True
    except ApiError as err:
        if err.status == 404:
            return False
        raise


def _delete(rest: JsonApi, path: str) -> None:
    try:
        rest.request("DELETE", path)
    except ApiError as err:
        if err.status != 404:
            raise


def _request(name: str, cls: str, count: int = 1, selector: str | None = None
             ) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {"name": name, "exactly": exactly}


@dataclass
class Run:
    """Pods sharing one claim template, and what the scheduler gave them."""

    env: Env
    name: str
    pods: list[str]

    def _pods(self) -> list[dict[str, Any]]:
        return list(self.env.rest.request("GET", f"/api/v1/namespaces/{self.env.ns}/pods", [
            ("labelSelector", f"run={self.name}")])["items"])

    def scheduled(self) -> list[str]:
        return [p["metadata"]["name"] for p in self._pods() if p["spec"].get("nodeName")]

    def unschedulable(self) -> dict[str, str]:
        """Pods the scheduler reported it cannot place, with its message."""
        events = self.env.rest.request("GET", f"/api/v1/namespaces/{self.env.ns}/events", [
            ("fieldSelector", "reason=FailedScheduling")])["items"]
        pending = set(self.pods) - set(self.scheduled())
        return {e["involvedObject"]["name"]: e.get("message", "") for e in events
                if e["involvedObject"]["name"] in pending}

    def allocations(self) -> dict[str, list[dict[str, Any]]]:
        """Per scheduled pod, its claim's allocation results."""
        claims = self.env.rest.request(
            "GET", f"{RES}/namespaces/{self.env.ns}/resourceclaims")["items"]
        out: dict[str, list[dict[str, Any]]] = {}
        for c in claims:
            owner = next((o["name"] for o in c["metadata"].get("ownerReferences") or ()
                          if o["kind"] == "Pod"), None)
            alloc = (c.get("status") or {}).get("allocation")
            if owner in self.pods and alloc:
                out[owner] = alloc["devices"]["results"]
        return out

    def attr(self, result: dict[str, Any], key: str) -> Any:
        a = self.env.attrs[(result["driver"], result["pool"], result["device"])]
        return next(iter(a[key].values()))


@pytest.fixture
def runs(env: Env) -> Iterator[list[Run]]:
    made: list[Run] = []
    yield made
    rest = env.rest
    for r in made:
        for pod in r.pods:
            _delete(rest, f"/api/v1/namespaces/{env.ns}/pods/{pod}?gracePeriodSeconds=0")
        _delete(rest, f"{RES}/namespaces/{env.ns}/resourceclaimtemplates/{r.name}")
    # the claims go with their pods; wait so the next test finds every device free
    wait_for("claims released", lambda: not rest.request(
        "GET", f"{RES}/namespaces/{env.ns}/resourceclaims")["items"], timeout=60)


def _run(env: Env, runs: list[Run], pods: int, requests: list[dict[str, Any]],
         constraints: list[dict[str, Any]], node_selector: dict[str, str]) -> Run:
    name = f"r{len(runs)}-{uuid.uuid4().hex[:5]}"
    env.rest.request("POST", f"{RES}/namespaces/{env.ns}/resourceclaimtemplates", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": requests, "constraints": constraints}}}})
    run = Run(env=env, name=name, pods=[f"{name}-{i}" for i in range(pods)])
    runs.append(run)
    for pod in run.pods:
        env.rest.request("POST", f"/api/v1/namespaces/{env.ns}/pods", body={
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "labels": {"run": name}},
            "spec": {"nodeSelector": node_selector, "tolerations": [KWOK_TOLERATION],
                     "resourceClaims": [{"name": "devs", "resourceClaimTemplateName": name}],
                     "containers": [{"name": "main", "image": "registry.invalid/sim:0",
                                     "resources": {"claims": [{"name": "devs"}]}}]}})
    return run


def _all_scheduled(run: Run, timeout: float = 90) -> dict[str, list[dict[str, Any]]]:
    wait_for(f"{len(run.pods)} pods of {run.name} scheduled",
             lambda: len(run.scheduled()) == len(run.pods), timeout=timeout, interval=0.5)
    allocs = run.allocations()
    assert set(allocs) == set(run.pods)
    used = [(r["pool"], r["device"]) for results in allocs.values() for r in results]
    assert len(used) == len(set(used)), "a device was given to two claims"
    return allocs


HGX = {"topology.toposerve.io/profile": "hgx-h100"}


@pytest.mark.parametrize(("attribute", "pods"), [
    (f"{GPU}/pcieSwitch", 16),          # 4 nodes x 4 switches of 2 GPUs: every pair used
    (f"{STD}/numaNode", 8),
])
def test_gpu_pairs_share_the_attribute(env: Env, runs: list[Run], attribute: str,
                                       pods: int) -> None:
    run = _run(env, runs, pods, [_request("gpus", env.classes["gpu"], count=2)],
               [{"requests": ["gpus"], "matchAttribute": attribute}], HGX)
    hw = load_profile("hgx-h100").hardware()
    for results in _all_scheduled(run).values():
        assert len(results) == 2 and results[0]["pool"] == results[1]["pool"]
        # the driver's own attributes are published unprefixed
        key = attribute if attribute.startswith(STD) else attribute.split("/", 1)[1]
        assert run.attr(results[0], key) == run.attr(results[1], key)
        a, b = (hw.place(r["device"]) for r in results)  # the model agrees
        assert (a.switch == b.switch) if key == "pcieSwitch" else (a.numa == b.numa)


def test_four_gpus_in_one_nvlink_domain(env: Env, runs: list[Run]) -> None:
    run = _run(env, runs, 6, [_request("gpus", env.classes["gpu"], count=4)],
               [{"requests": ["gpus"], "matchAttribute": f"{GPU}/nvlinkDomain"}],
               {"topology.toposerve.io/profile": "gb200-nvl72"})
    for results in _all_scheduled(run).values():
        assert len(results) == 4
        assert len({run.attr(r, "nvlinkDomain") for r in results}) == 1


def test_gpu_and_nic_on_one_pcie_root(env: Env, runs: list[Run]) -> None:
    # 2 MI300X nodes x 8 roots, one GPU and one NIC each: only exact pairs fit all 16
    run = _run(env, runs, 16, [_request("gpu", env.classes["gpu"]),
                               _request("nic", env.classes["nic"])],
               [{"requests": ["gpu", "nic"], "matchAttribute": f"{STD}/pcieRoot"}],
               {"topology.toposerve.io/profile": "mi300x"})
    hw = load_profile("mi300x").hardware()
    for results in _all_scheduled(run).values():
        by = {r["request"]: r for r in results}
        assert by["gpu"]["driver"] == GPU and by["nic"]["driver"] == NET
        assert run.attr(by["gpu"], f"{STD}/pcieRoot") == run.attr(by["nic"], f"{STD}/pcieRoot")
        assert hw.place(by["gpu"]["device"]).root == hw.place(by["nic"]["device"]).root


def _gpu_of(run: Run, result: dict[str, Any]) -> int:
    return int(run.attr(result, "index"))


def test_partitions_never_double_booked(env: Env, runs: list[Run]) -> None:
    node = {"kubernetes.io/hostname": "hgx-h100-0003"}
    whole = _run(env, runs, 4, [_request("gpu", env.classes["gpu"])], [], node)
    _all_scheduled(whole)
    # the 4 free GPUs hold 28 1g.10gb partitions; 30 are asked for
    small = _run(env, runs, 30, [_request("mig", env.classes["mig"],
                                          selector=f"device.attributes['{GPU}'].profile "
                                                   "== '1g.10gb'")], [], node)
    wait_for("28 scheduled, 2 reported unschedulable", lambda: len(small.scheduled()) == 28
             and len(small.unschedulable()) == 2, timeout=120, interval=0.5)
    # nothing else fits: a 3g.40gb needs 4 free aligned memory slices, a GPU all 8
    big = _run(env, runs, 1, [_request("mig", env.classes["mig"],
                                       selector=f"device.attributes['{GPU}'].profile "
                                                "== '3g.40gb'")], [], node)
    another = _run(env, runs, 1, [_request("gpu", env.classes["gpu"])], [], node)
    wait_for("both reported unschedulable", lambda: len(big.unschedulable()) == 1
             and len(another.unschedulable()) == 1, timeout=60, interval=0.5)
    assert len(small.scheduled()) == 28 and not big.scheduled() and not another.scheduled()
    gpus_whole = {_gpu_of(whole, r) for rs in whole.allocations().values() for r in rs}
    assert len(gpus_whole) == 4
    slices: dict[int, list[int]] = {}
    for rs in small.allocations().values():
        (part,) = rs
        gpu = _gpu_of(small, part)
        assert gpu not in gpus_whole, f"gpu-{gpu} given whole and as {part['device']}"
        slices.setdefault(gpu, []).append(int(small.attr(part, "placementStart")))
    assert all(sorted(v) == list(range(7)) for v in slices.values()) and len(slices) == 4
    for msg in [*small.unschedulable().values(), *big.unschedulable().values()]:
        assert "claim" in msg.lower(), msg


def test_unsatisfiable_claim_stays_pending_with_reason(env: Env, runs: list[Run]) -> None:
    # a PCIe switch holds two GPUs, never three
    run = _run(env, runs, 1, [_request("gpus", env.classes["gpu"], count=3)],
               [{"requests": ["gpus"], "matchAttribute": f"{GPU}/pcieSwitch"}], HGX)
    (msg,) = wait_for("FailedScheduling", lambda: list(run.unschedulable().values()),
                      timeout=60, interval=0.5)
    assert "claim" in msg.lower(), msg
    assert not run.scheduled() and not run.allocations()
