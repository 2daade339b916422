"""Binding conditions on the real node (DRADeviceBindingConditions, on by
default in 1.37): the real scheduler waits in PreBind until our driver
says the allocated device is ready, and sends the pod back when it says
the device failed.

The NIC driver (``--binding-conditions``) with veth stand-ins: a pod whose
NIC is not brought up stays unbound (no node, a BindingConditionsPending
event, ``LinkReady`` False) until the test sets the link up, then binds
and runs with the NIC; a NIC whose fabric end is down (no carrier) gets
``LinkFailed`` True, the binding fails (FailedScheduling: device binding
failed), the claim is deallocated, and once the fabric end is up again
the pod binds and runs. The GPU driver on the gb200-nvl72 tree with the
fake NVML: a GPU whose NVLink fabric registration is in progress holds
its pod until it completes; one whose registration failed sends its pod
back to scheduling."""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness import fake_nvml
from harness.waiting import wait_for
from tests.conftest import Cluster
from tests.realnode.conftest import PodMaker, ensure_started, wait_phase
from toposerve.dra_driver.gpu.binding import CONDITIONS as GPU_CONDITIONS
from toposerve.dra_driver.net.binding import CONDITIONS as NIC_CONDITIONS
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster.clusters import kubeconfig_path
from toposerve.localcluster.realnode import nics
from toposerve.localcluster.realnode.gpu_driver import DRIVER as GPU_DRIVER
from toposerve.localcluster.realnode.gpu_driver import GpuDriver
from toposerve.localcluster.realnode.net_driver import DRIVER as NIC_DRIVER
from toposerve.localcluster.realnode.net_driver import NetDriver
from toposerve.localcluster.realnode.paths import NODE_NAME
from toposerve.localcluster.realnode.pods import busybox_pod
from toposerve.topology.profiles import load_profile

pytestmark = [pytest.mark.cluster, pytest.mark.realnode]

NIC_CLASS, GPU_CLASS = "realnode-bind-nic", "realnode-bind-gpu"
FAIL_AFTER = "1"  # seconds a failure must last: short, so the test is
SCHEDULER_POLL_S = 5  # how often PreBind reads the conditions (upstream, fixed)
GB200 = "gb200-nvl72"


def _with_binding(args: list[str]) -> list[str]:
    return [*args, "--binding-conditions", "--binding-failure-after", FAIL_AFTER]


@dataclass
class BindingNetDriver(NetDriver):
    def driver_args(self) -> list[str]:
        return _with_binding(super().driver_args())


@dataclass
class FabricGpuDriver(GpuDriver):
    """On the gb200 tree (NVML: the fake library, its scenario in ``env``)."""

    profile: str = GB200

    def driver_args(self) -> list[str]:
        return _with_binding(super().driver_args())


@dataclass
class ClaimWatch:
    """Every version of one claim the apiserver sends, from creation on:
    states between two polls (the deallocation, the failure condition)
    are not missed."""

    rest: JsonApi
    name: str
    seen: list[dict[str, Any]] = field(default_factory=list)
    error: str = ""
    _resp: Any = None
    _stopped: bool = False

    def start(self) -> None:
        threading.Thread(target=self._run, daemon=True).start()

    def _opened(self, resp: Any) -> None:
        self._resp = resp

    def _run(self) -> None:
        query = [("fieldSelector", f"metadata.name={self.name}"), ("watch", "true"),
                 ("timeoutSeconds", 300)]
        try:
            for ev in self.rest.stream("/apis/resource.k8s.io/v1/namespaces/default/"
                                       "resourceclaims", query, 330, self._opened):
                self.seen.append(ev.get("object") or {})
        except ApiError as err:
            self.error = "" if self._stopped else str(err)

    def stop(self) -> None:
        self._stopped = True
        if self._resp is not None:
            self._resp.shutdown()

    def conditions(self, types: set[str]) -> list[dict[str, str]]:
        """Each version's conditions of these types, by type: status/reason."""
        return [{c["type"]: f"{c['status']}/{c['reason']}"
                 for d in (o.get("status") or {}).get("devices") or []
                 for c in d.get("conditions") or [] if c["type"] in types}
                for o in self.seen]

    def deallocated_after_allocation(self) -> bool:
        assert not self.error, self.error
        allocated = [bool((o.get("status") or {}).get("allocation")) for o in self.seen]
        return any(a and not b for a, b in itertools.pairwise(allocated))


@dataclass
class Env:
    core: Any
    res: Any
    rest: JsonApi

    def create_claim(self, name: str, device_class: str, cel: str) -> ClaimWatch:
        """Compact, key-sorted JSON (as kubectl sends it); watched from now."""
        seen = ClaimWatch(self.rest, name)
        seen.start()
        body = json.loads(json.dumps({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [{"name": "dev", "exactly": {
                "deviceClassName": device_class,
                "selectors": [{"cel": {"expression": cel}}]}}]}}}, sort_keys=True))
        self.rest.request("POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims",
                          body=body)
        return seen

    def pod(self, make_pod: PodMaker, name: str, claim: str) -> None:
        make_pod(busybox_pod(name, "echo READY; sleep 3600",
                             claims=[{"name": "dev", "resourceClaimName": claim}]))

    def node_of(self, pod: str) -> str | None:
        got = self.core.read_namespaced_pod(pod, "default")
        return str(got.spec.node_name) if got.spec.node_name else None

    def events(self, pod: str) -> list[tuple[str, str]]:
        return [(e.reason, e.message or "") for e in self.core.list_namespaced_event(
            "default", field_selector=f"involvedObject.name={pod}").items]

    def condition(self, claim: str, kind: str) -> tuple[str, str] | None:
        got = self.res.read_namespaced_resource_claim(claim, "default")
        for d in got.status.devices or [] if got.status else []:
            for c in d.conditions or []:
                if c.type == kind:
                    return str(c.status), str(c.reason)
        return None

    def delete_claim(self, name: str) -> None:
        with contextlib.suppress(ApiException):
            self.res.delete_namespaced_resource_claim(name, "default")

    def delete_pod(self, name: str) -> None:
        self.core.delete_namespaced_pod(name, "default", grace_period_seconds=1)
        wait_for(f"pod {name} gone", lambda: not self.core.list_namespaced_pod(
            "default", field_selector=f"metadata.name={name}").items, timeout=60)


@pytest.fixture(scope="module")
def env(real_node_cluster: Cluster) -> Iterator[Env]:
    ensure_started(real_node_cluster)
    core: Any = client.CoreV1Api(real_node_cluster.api)
    res: Any = client.ResourceV1Api(real_node_cluster.api)
    for name, of in ((NIC_CLASS, NIC_DRIVER), (GPU_CLASS, GPU_DRIVER)):
        res.create_device_class({"metadata": {"name": name}, "spec": {"selectors": [
            {"cel": {"expression": f"device.driver == '{of}'"}}]}})
    try:
        yield Env(core=core, res=res, rest=JsonApi(real_node_cluster.api))
    finally:
        for name in (NIC_CLASS, GPU_CLASS):
            with contextlib.suppress(ApiException):
                res.delete_device_class(name)


def _held(env: Env, pod: str, kind: str, reason: str) -> None:
    """The pod waits in PreBind: the claim says why (``kind`` False for
    ``reason``) and the pod has no node, through another scheduler read."""
    wait_for(f"{kind} False, {reason}", lambda: env.condition(pod, kind) == ("False", reason),
             timeout=60)
    wait_for("the scheduler waiting in PreBind", lambda: any(
        r == "BindingConditionsPending" for r, _ in env.events(pod)), timeout=30)
    time.sleep(SCHEDULER_POLL_S + 1)
    assert env.node_of(pod) is None


def _binds(env: Env, pod: str, kind: str, reason: str, timeout: float = 30) -> None:
    """The pod bound and running, its claim saying ``kind`` True for ``reason``."""
    wait_for("the pod bound", lambda: env.node_of(pod), timeout=timeout)
    wait_phase(env.core, pod, {"Running"})
    assert env.condition(pod, kind) == ("True", reason)


def _sent_back(env: Env, pod: str, seen: ClaimWatch, ready: str, failed: str,
               reason: str) -> None:
    """The binding failed for ``reason``: the scheduler says so, the claim
    showed the failure condition True and was deallocated, no node."""
    wait_for("a FailedScheduling event for the failed binding", lambda: any(
        r == "FailedScheduling" and "device binding failed" in m and reason in m
        for r, m in env.events(pod)), timeout=60)
    wait_for("the claim deallocated after the failure",
             seen.deallocated_after_allocation, timeout=30)
    assert {ready: f"False/{reason}", failed: f"True/{reason}"} in seen.conditions(
        {ready, failed})
    assert env.node_of(pod) is None


def _published(env: Env, driver: str, device_attr: str, value: str) -> dict[str, Any]:
    """The slice entry of our node's device whose attribute has this value."""
    def find() -> dict[str, Any]:
        slices = env.rest.request("GET", "/apis/resource.k8s.io/v1/resourceslices", [
            ("fieldSelector", f"spec.nodeName={NODE_NAME},spec.driver={driver}")])
        for s in slices.get("items") or []:
            for d in s["spec"].get("devices") or []:
                got = (d.get("attributes") or {}).get(device_attr) or {}
                if got.get("string") == value:
                    return dict(d)
        return {}
    return wait_for(f"{driver} device with {device_attr}={value} published", find, timeout=30)


def _ip(*args: str, netns: str | None = None) -> None:
    cmd = ["ip", *(["netns", "exec", netns, "ip"] if netns else []), *args]
    subprocess.run(cmd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def nic_driver(env: Env, tmp_path_factory: pytest.TempPathFactory,
               real_node_cluster: Cluster) -> Iterator[BindingNetDriver]:
    driver = BindingNetDriver(kubeconfig_path(real_node_cluster.name),
                              tmp_path_factory.mktemp("realnode-bind-net"))
    driver.start()
    try:
        yield driver
    finally:
        rc = driver.stop()
        driver.remove_stand_ins()
        assert rc == 0, driver.log.read_text()[-1500:]


def _nic_claim(env: Env, name: str, nic: nics.StandIn) -> ClaimWatch:
    entry = _published(env, NIC_DRIVER, "ifName", nic.ifname)
    assert (entry["bindsToNode"], entry["bindingConditions"],
            entry["bindingFailureConditions"]) == (
        True, [NIC_CONDITIONS.ready], [NIC_CONDITIONS.failed])
    return env.create_claim(name, NIC_CLASS,
                            f"device.attributes['{NIC_DRIVER}'].ifName == '{nic.ifname}'")


def test_a_pod_binds_only_once_its_nic_is_up(env: Env, nic_driver: BindingNetDriver,
                                             make_pod: PodMaker) -> None:
    nic = nic_driver.stand_ins()[4]  # down on the host, as made; its fabric end up
    seen = _nic_claim(env, "rn-bind-up", nic)
    try:
        env.pod(make_pod, "rn-bind-up", "rn-bind-up")
        _held(env, "rn-bind-up", NIC_CONDITIONS.ready, "LinkNotUp")
        _ip("link", "set", nic.ifname, "up")
        up = time.monotonic()
        wait_for("the pod bound", lambda: env.node_of("rn-bind-up"), timeout=30)
        bound_s = time.monotonic() - up
        _binds(env, "rn-bind-up", NIC_CONDITIONS.ready, "LinkUp")
        # prepare's Ready (the driver's field manager) beside LinkReady (the binding one's)
        assert env.condition("rn-bind-up", "Ready") == ("True", "Prepared")
        assert env.condition("rn-bind-up", NIC_CONDITIONS.failed) == ("False", "LinkUp")
        print(f"bound {bound_s:.1f}s after the link came up")
        env.delete_pod("rn-bind-up")
    finally:
        seen.stop()
        env.delete_claim("rn-bind-up")


def test_a_nic_without_carrier_sends_its_pod_back(env: Env, nic_driver: BindingNetDriver,
                                                  make_pod: PodMaker) -> None:
    nic = nic_driver.stand_ins()[5]
    far = f"{nic.ifname}{nics.FABRIC_SUFFIX}"
    fabric = nics.FABRIC_NETNS.name
    _ip("link", "set", far, "down", netns=fabric)  # the switch port goes: no carrier
    _ip("link", "set", nic.ifname, "up")
    seen = _nic_claim(env, "rn-bind-down", nic)
    try:
        env.pod(make_pod, "rn-bind-down", "rn-bind-down")
        _sent_back(env, "rn-bind-down", seen, NIC_CONDITIONS.ready, NIC_CONDITIONS.failed,
                   "LinkDown")
        _ip("link", "set", far, "up", netns=fabric)  # the port is back
        _binds(env, "rn-bind-down", NIC_CONDITIONS.ready, "LinkUp", timeout=60)
        env.delete_pod("rn-bind-down")
    finally:
        seen.stop()
        env.delete_claim("rn-bind-down")
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "set", far, "up", netns=fabric)


@pytest.fixture(scope="module")
def gpu_driver(env: Env, nic_driver: BindingNetDriver, real_node_cluster: Cluster,
               tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GpuDriver, Path]]:
    """After the NIC tests (it asks for their driver, so they go first):
    GPUs 0 and 1 registering with the fabric, the others registered."""
    work = tmp_path_factory.mktemp("realnode-bind-gpu")
    gpus = fake_nvml.gpus_of(load_profile(GB200).hardware(), name="NVIDIA GB200",
                             memory=199_500_000_000, arch=fake_nvml.BLACKWELL, cc="10.0",
                             pci_device_id="2941",
                             fabric=("7c3d1a52-6f0e-4b8e-9a1d-2b5c8e4f6a10", 1))
    scenario = fake_nvml.Scenario(gpus).write(work / "scenario")
    for i in (0, 1):
        fake_nvml.set_fabric(scenario, i, fake_nvml.FABRIC_IN_PROGRESS)
    driver = FabricGpuDriver(kubeconfig_path(real_node_cluster.name), work / "driver",
                             env={fake_nvml.ENV: str(scenario)},
                             nvml_library=fake_nvml.build())
    driver.start()
    try:
        yield driver, scenario
    finally:
        assert driver.stop() == 0, driver.log.read_text()[-1500:]


def _gpu_claim(env: Env, name: str, bus_id: str) -> ClaimWatch:
    entry = _published(env, GPU_DRIVER, "resource.kubernetes.io/pciBusID", bus_id)
    assert entry["bindingConditions"] == [GPU_CONDITIONS.ready]
    return env.create_claim(
        name, GPU_CLASS, f"device.attributes['resource.kubernetes.io'].pciBusID == '{bus_id}'"
                         f" && device.attributes['{GPU_DRIVER}'].type == 'gpu'")


def test_a_gpu_binds_once_its_fabric_registration_completes(
        env: Env, gpu_driver: tuple[GpuDriver, Path], make_pod: PodMaker) -> None:
    _, scenario = gpu_driver
    gpu = fake_nvml.gpus_of(load_profile(GB200).hardware())[0]
    seen = _gpu_claim(env, "rn-bind-gpu", gpu.bus_id)
    try:
        env.pod(make_pod, "rn-bind-gpu", "rn-bind-gpu")
        _held(env, "rn-bind-gpu", GPU_CONDITIONS.ready, "FabricRegistering")
        fake_nvml.set_fabric(scenario, 0, fake_nvml.FABRIC_COMPLETED)
        _binds(env, "rn-bind-gpu", GPU_CONDITIONS.ready, "FabricRegistered")
        env.delete_pod("rn-bind-gpu")
    finally:
        seen.stop()
        env.delete_claim("rn-bind-gpu")


def test_a_failed_fabric_registration_sends_the_pod_back(
        env: Env, gpu_driver: tuple[GpuDriver, Path], make_pod: PodMaker) -> None:
    _, scenario = gpu_driver
    fake_nvml.set_fabric(scenario, 1, fake_nvml.FABRIC_COMPLETED, status=999)
    gpu = fake_nvml.gpus_of(load_profile(GB200).hardware())[1]
    seen = _gpu_claim(env, "rn-bind-gpu-bad", gpu.bus_id)
    try:
        env.pod(make_pod, "rn-bind-gpu-bad", "rn-bind-gpu-bad")
        _sent_back(env, "rn-bind-gpu-bad", seen, GPU_CONDITIONS.ready, GPU_CONDITIONS.failed,
                   "FabricRegistrationFailed")
    finally:
        seen.stop()
        with contextlib.suppress(ApiException):
            env.core.delete_namespaced_pod("rn-bind-gpu-bad", "default", grace_period_seconds=0)
        env.delete_claim("rn-bind-gpu-bad")
