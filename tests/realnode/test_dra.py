"""The GPU driver (``toposerve driver gpu``) on the real node, with a fake
sysfs tree for the hardware: the real kubelet registers it, prepares a
claim when a pod starts (the container's environment shows the CDI edits),
unprepares when the pod goes, and both stay consistent when the driver or
the kubelet restarts; slices come back after a restarting kubelet wipes
them."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client

from harness.waiting import wait_for
from tests.conftest import Cluster
from tests.realnode.conftest import PodMaker, ensure_started, gpu_driver_running, wait_phase
from toposerve.dra_driver.gpu.driver import CDI_CLASS, CDI_VENDOR
from toposerve.dra_driver.kubeletplugin.cdi import CdiSpecs
from toposerve.dra_driver.kubeletplugin.checkpoint import Checkpoint, ClaimState, read_boot_id
from toposerve.localcluster.clusters import kubeconfig_path
from toposerve.localcluster.realnode import node as realnode
from toposerve.localcluster.realnode.gpu_driver import CDI_ROOT, DRIVER, PLUGIN_DIR, GpuDriver
from toposerve.localcluster.realnode.paths import NODE_NAME, default_layout
from toposerve.localcluster.realnode.pods import busybox_pod

pytestmark = [pytest.mark.cluster, pytest.mark.realnode]

CLASS = "realnode-gpu"
TEMPLATE = "realnode-one-gpu"


@dataclass
class Env:
    cluster: Cluster
    core: Any
    res: Any
    driver: GpuDriver
    cdi: CdiSpecs


@pytest.fixture(scope="module")
def env(real_node_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    ensure_started(real_node_cluster)
    core: Any = client.CoreV1Api(real_node_cluster.api)
    res: Any = client.ResourceV1Api(real_node_cluster.api)
    driver = GpuDriver(kubeconfig_path(real_node_cluster.name),
                       tmp_path_factory.mktemp("realnode-dra"))
    with gpu_driver_running(res, driver, CLASS, TEMPLATE):
        yield Env(cluster=real_node_cluster, core=core, res=res, driver=driver,
                  cdi=CdiSpecs(CDI_ROOT, CDI_VENDOR, CDI_CLASS))


def _attr(device: Any, name: str) -> Any:
    """An attribute of the driver's own domain (a slice may name it short)."""
    attrs = device.attributes or {}
    got = attrs.get(name) or attrs.get(f"{DRIVER}/{name}")
    return got.string if got is not None else None


def _gpus(env: Env) -> dict[str, str]:
    """Published whole GPUs of the real node: device name -> UUID."""
    slices = env.res.list_resource_slice(
        field_selector=f"spec.nodeName={NODE_NAME},spec.driver={DRIVER}").items
    return {d.name: _attr(d, "uuid") for s in slices for d in s.spec.devices or []
            if _attr(d, "type") == "gpu"}


def _slice_uids(env: Env) -> set[str]:
    return {s.metadata.uid for s in env.res.list_resource_slice(
        field_selector=f"spec.nodeName={NODE_NAME},spec.driver={DRIVER}").items}


def _checkpoint() -> dict[str, ClaimState]:
    data, _ = Checkpoint(PLUGIN_DIR / "checkpoint.json", read_boot_id()).load()
    return {uid: e.state for uid, e in data.claims.items()}


@dataclass
class GpuPod:
    name: str
    claim_uid: str
    device: str


def _gpu_pod(env: Env, make_pod: PodMaker, name: str) -> GpuPod:
    make_pod(busybox_pod(name, "env; ls /dev; sleep 3600",
                         claims=[{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}]))
    pod = wait_phase(env.core, name, {"Running"})
    claim_name = pod.status.resource_claim_statuses[0].resource_claim_name
    claim = env.res.read_namespaced_resource_claim(claim_name, "default")
    return GpuPod(name=name, claim_uid=claim.metadata.uid,
                  device=claim.status.allocation.devices.results[0].device)


def _log_shows(env: Env, pod: str, *lines: str) -> bool:
    got = set(env.core.read_namespaced_pod_log(pod, "default").splitlines())
    return all(line in got for line in lines)


def _delete_and_wait_unprepared(env: Env, p: GpuPod) -> None:
    env.core.delete_namespaced_pod(p.name, "default", grace_period_seconds=1)
    wait_for(f"pod {p.name} gone", lambda: not env.core.list_namespaced_pod(
        "default", field_selector=f"metadata.name={p.name}").items, timeout=60)
    assert not env.cdi.path(p.claim_uid).exists()
    assert p.claim_uid not in _checkpoint()


def test_kubelet_registers_the_driver(env: Env) -> None:
    assert env.driver.registrations() >= 1
    kubelet_log = (default_layout().logs / "kubelet.log").read_text()
    assert f'driverName="{DRIVER}"' in kubelet_log and "connected=true" in kubelet_log
    wait_for("8 GPUs published for the real node", lambda: len(_gpus(env)) == 8, timeout=30)
    assert sorted(_gpus(env)) == [f"gpu-{i}" for i in range(8)]


def test_pod_with_a_claim_sees_the_cdi_edits_and_unprepares(env: Env, make_pod: PodMaker) -> None:
    p = _gpu_pod(env, make_pod, "rn-gpu")
    uuid = _gpus(env)[p.device]
    index = p.device.removeprefix("gpu-")
    wait_for("the container's env and devices in its log", lambda: _log_shows(
        env, p.name, f"NVIDIA_VISIBLE_DEVICES={uuid}", f"CUDA_VISIBLE_DEVICES={uuid}",
        f"nvidia{index}", "nvidiactl"))
    log = env.core.read_namespaced_pod_log(p.name, "default")
    assert any(x.startswith("TOPOSERVE_GPU_NUMA_NODES=") for x in log.splitlines())
    assert env.cdi.path(p.claim_uid).exists()
    assert _checkpoint()[p.claim_uid] == ClaimState.PREPARE_COMPLETED
    _delete_and_wait_unprepared(env, p)


def test_driver_restarted_between_prepare_and_unprepare(env: Env, make_pod: PodMaker) -> None:
    p = _gpu_pod(env, make_pod, "rn-gpu-drv")
    assert env.driver.stop() == 0
    try:
        env.core.delete_namespaced_pod(p.name, "default", grace_period_seconds=1)

        def container_gone() -> bool:
            pod = env.core.read_namespaced_pod(p.name, "default")
            return all(s.state.terminated for s in pod.status.container_statuses or [])

        wait_for("the container stopped", container_gone, timeout=30)
        # nobody to unprepare: the claim stays prepared, the pod waits for it
        assert env.cdi.path(p.claim_uid).exists()
        assert _checkpoint()[p.claim_uid] == ClaimState.PREPARE_COMPLETED
    finally:
        env.driver.start()
    _delete_and_wait_unprepared(env, p)


def test_kubelet_restarted_under_a_running_pod(env: Env, make_pod: PodMaker) -> None:
    p = _gpu_pod(env, make_pod, "rn-gpu-kubelet")
    before = env.core.read_namespaced_pod(p.name, "default").status.container_statuses[0]
    registrations = env.driver.registrations()
    realnode.restart_kubelet()
    wait_for("the new kubelet to register the driver",
             lambda: env.driver.registrations() > registrations, timeout=30)
    wait_for("the node Ready again", lambda: any(
        c.type == "Ready" and c.status == "True"
        for c in env.core.read_node(NODE_NAME).status.conditions), timeout=30)
    after = env.core.read_namespaced_pod(p.name, "default")
    status = after.status.container_statuses[0]
    assert after.status.phase == "Running"
    assert status.container_id == before.container_id and status.restart_count == 0
    assert _checkpoint()[p.claim_uid] == ClaimState.PREPARE_COMPLETED
    assert env.cdi.path(p.claim_uid).exists()
    _delete_and_wait_unprepared(env, p)


def test_slices_come_back_after_the_kubelet_wipes_them(env: Env) -> None:
    wait_for("8 GPUs published", lambda: len(_gpus(env)) == 8, timeout=30)
    old = _slice_uids(env)
    realnode.restart_kubelet()  # a starting kubelet deletes every slice of its node
    wait_for("the slices republished after the wipe", lambda: len(_gpus(env)) == 8 and
             not _slice_uids(env) & old, timeout=60)
