"""Device health on the real node (issue 46): the GPU driver as a host
process reading the fake NVML library (``harness.fake_nvml``), a critical
XID injected under the GPU a pod's claim holds, then the GPU reset (lost,
then answering again).

- The real kubelet reads the driver's ``DRAResourceHealth`` stream into
  the pod's status (KEP-4680, gate ``ResourceHealthStatus``, on by
  default): ``containerStatuses[].allocatedResourcesStatus`` names the
  container's claim and request and lists the device by its CDI device ID,
  Unhealthy with the driver's message after the XID, Healthy after the
  reset.
- The router (a host process, pod discovery with claimDevices) in front of
  two ``toposerve sim`` pods of the installed image, each holding a GPU,
  takes the one whose GPU carries the XID's taint out of rotation while a
  client keeps sending, every request answered; the reset brings it back."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from harness import fake_nvml
from harness.device_health import Traffic, Victim, xid_round
from harness.fake_nvml import Scenario, gpus_of, inject_xid, set_lost
from harness.images import make_images
from harness.procs import MODEL, Procs
from harness.waiting import wait_for
from tests.conftest import Cluster
from tests.realnode.conftest import (
    PodMaker,
    ensure_started,
    gpu_driver_running,
    sim_pod,
    wait_phase,
)
from toposerve.dra_driver.gpu.driver import CDI_CLASS, CDI_VENDOR
from toposerve.dra_driver.kubeletplugin.cdi import CdiSpecs
from toposerve.kubeapi import JsonApi
from toposerve.localcluster import install as inst
from toposerve.localcluster.clusters import kubeconfig_path
from toposerve.localcluster.ports import free_port
from toposerve.localcluster.realnode.gpu_driver import CDI_ROOT, DRIVER, GpuDriver
from toposerve.localcluster.realnode.paths import NODE_NAME
from toposerve.localcluster.realnode.pods import busybox_pod
from toposerve.topology.profiles import load_profile

pytestmark = [pytest.mark.cluster, pytest.mark.realnode]

PREFIX = "rn-health"  # names of this module's own
PROFILE = "hgx-h100"
CLASS = f"{PREFIX}-gpu"
TEMPLATE = f"{PREFIX}-one-gpu"
WITHIN_S = 2.0  # an XID takes its endpoint out of rotation within this
POD_STATUS_S = 10.0  # and shows in the pod's status within this (the kubelet's resync is 1 min)


@dataclass
class Env:
    cluster: Cluster
    core: Any
    res: Any
    scenario: Path
    image: str  # the installed toposerve image: the model servers run it


@pytest.fixture(scope="module")
def env(real_node_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    """The GPU driver on the real node with the fake NVML library, a
    DeviceClass and a one-GPU claim template of this module's, and this
    tree's toposerve image in the node's containerd."""
    ensure_started(real_node_cluster)
    images = make_images()
    image = next(ref for ref in images if inst._image_name(ref) == "toposerve")
    inst.import_images([images[image]])
    core: Any = client.CoreV1Api(real_node_cluster.api)
    res: Any = client.ResourceV1Api(real_node_cluster.api)
    workdir = tmp_path_factory.mktemp(PREFIX)
    # the fake's GPUs on the bus ids of the driver's sysfs tree (one profile)
    scenario = Scenario(gpus_of(load_profile(PROFILE).hardware())).write(workdir / "scenario")
    driver = GpuDriver(kubeconfig_path(real_node_cluster.name), workdir,
                       env={fake_nvml.ENV: str(scenario)}, profile=PROFILE,
                       nvml_library=fake_nvml.build(), health_interval_s=1)
    with gpu_driver_running(res, driver, CLASS, TEMPLATE):
        wait_for("8 GPUs published", lambda: sum(
            1 for s in res.list_resource_slice(
                field_selector=f"spec.nodeName={NODE_NAME},spec.driver={DRIVER}").items
            for _ in s.spec.devices or []) >= 8, timeout=30)
        yield Env(cluster=real_node_cluster, core=core, res=res, scenario=scenario,
                  image=image)


def _with_gpu(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod``, its container using request ``gpu`` of a claim made from
    the template."""
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu", "request": "gpu"}]}
    return pod


@dataclass(frozen=True)
class Held:
    claim_uid: str
    device: str  # gpu-<n>: the fake NVML's GPU n (both in bus order)

    @property
    def gpu(self) -> int:
        return int(self.device.rsplit("-", 1)[1])


def _held(env: Env, pod: str) -> Held:
    """The GPU the running ``pod``'s claim was allocated."""
    status = wait_phase(env.core, pod, {"Running"}).status
    claim = env.res.read_namespaced_resource_claim(
        status.resource_claim_statuses[0].resource_claim_name, "default")
    return Held(claim.metadata.uid, claim.status.allocation.devices.results[0].device)


def _allocated_status(core: Any, pod: str) -> dict[str, list[tuple[str, str, str | None]]]:
    """The pod's allocatedResourcesStatus: name -> (resourceID, health, message)."""
    status = core.read_namespaced_pod(pod, "default").status
    return {r.name: [(h.resource_id, h.health, h.message) for h in r.resources or []]
            for c in status.container_statuses or [] for r in c.allocated_resources_status or []}


def test_an_xid_shows_in_the_pod_status_until_the_gpu_is_reset(env: Env,
                                                               make_pod: PodMaker) -> None:
    name = f"{PREFIX}-status"
    make_pod(_with_gpu(busybox_pod(name, "sleep 3600")))
    held = _held(env, name)
    # the kubelet names the container's claim and request, and the device by
    # the first CDI device ID the driver's prepare answered for it
    cdi_id = CdiSpecs(CDI_ROOT, CDI_VENDOR, CDI_CLASS).device_id(held.claim_uid, held.device)

    def shows(health: str, message: str | None) -> Any:
        want = {"claim:gpu/gpu": [(cdi_id, health, message)]}
        return lambda: _allocated_status(env.core, name) == want

    wait_for("Healthy in the pod's status", shows("Healthy", None), timeout=30)
    sent = time.monotonic()
    inject_xid(env.scenario, held.gpu, 79)
    wait_for("Unhealthy after the XID", shows("Unhealthy", "critical XID 79"), timeout=30)
    took = time.monotonic() - sent
    print(f"XID to the pod's status: {took:.2f} s")
    assert took < POD_STATUS_S, f"the pod's status showed the XID after {took:.1f} s"
    set_lost(env.scenario, [held.gpu])  # the GPU reset
    wait_for("lost too", shows("Unhealthy", "critical XID 79; NVML: GPU is lost"), timeout=30)
    set_lost(env.scenario, [])
    wait_for("Healthy after the reset", shows("Healthy", None), timeout=30)


def test_the_router_takes_the_pod_on_an_xid_gpu_out_of_rotation(
        env: Env, make_pod: PodMaker, procs: Procs) -> None:
    app = f"{PREFIX}-sim"
    ports = {f"{app}-{i}": free_port() for i in range(2)}  # host network: a port each
    for name, port in ports.items():
        make_pod(_with_gpu(sim_pod(env.image, name, port, app, MODEL)))
    held = {name: _held(env, name) for name in ports}
    router = procs.router({"discovery": {"kubernetes": {
        "namespace": "default", "labelSelector": f"app={app}", "portName": "http",
        "kubeconfig": str(kubeconfig_path(env.cluster.name))}}})
    wait_for("both model servers in rotation", lambda: sum(
        s.value for s in router.samples()
        if s.name == "toposerve_router_endpoint_healthy") == 2, timeout=60)
    victim = next(iter(ports))
    with Traffic(router) as traffic:
        took = xid_round(traffic, JsonApi(env.cluster.api), env.scenario, Victim(
            namespace="default", pod=victim, endpoint=f"127.0.0.1:{ports[victim]}",
            device=f"{DRIVER}/{NODE_NAME}/{held[victim].device}", gpu=held[victim].gpu),
            WITHIN_S)
    print(f"XID to out of rotation: {took:.2f} s; {len(traffic.sent)} requests")
    assert {s.status for s in traffic.sent} == {200}
