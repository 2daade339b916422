"""``toposerve driver gpu`` on a kwok node, called as the kubelet calls it
(a gRPC client built from our protos), with claims the real scheduler
allocated from the slices the driver published, and claim status written
under the driver's own service account."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.dra_gpu import (
    DRIVER,
    NAMESPACE,
    NODE,
    SERVICE_ACCOUNT,
    DriverProc,
    GpuEnv,
    allocated_device,
    api_for,
    create_claim,
    delete_claim,
    our_status,
    random_uid,
    token_kubeconfig,
)
from harness.dra_kubelet import Claim
from harness.waiting import wait_for
from toposerve.dra_driver.kubeletplugin.checkpoint import Checkpoint, ClaimState
from toposerve.dra_driver.kubeletplugin.claim_status import DeviceStatus, apply_device_status
from toposerve.dra_driver.kubeletplugin.device_kind import ClaimRef

pytestmark = pytest.mark.cluster
GPU_CONFIG = {"apiVersion": "gpu.toposerve.io/v1", "kind": "GpuConfig"}


def _answer(resp: dict[str, Any]) -> dict[str, Any]:
    return {uid: {"error": r.error, "devices": [
        (list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids))
        for d in r.devices]} for uid, r in resp.items()}


def _get(port: int, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.status, r.read().decode()


def test_prepare_twice_then_unprepare(gpu_env: GpuEnv, gpu_driver: DriverProc) -> None:
    claim = create_claim(gpu_env.api, "two-gpus", count=2)
    try:
        kubelet = gpu_driver.kubelet
        first = _answer(kubelet.prepare([claim]))
        got = first[claim.uid]
        assert got["error"] == ""
        names = sorted(d[2] for d in got["devices"])
        assert len(names) == 2
        assert all(d[0] == ["gpu"] and d[1] == NODE for d in got["devices"])
        assert sorted(d[3][0] for d in got["devices"]) == [
            f"k8s.gpu.toposerve.io/gpu={claim.uid}-{n}" for n in names]
        # the same answer again, and through v1beta1
        assert _answer(kubelet.prepare([claim])) == first
        assert _answer(kubelet.prepare([claim], "v1beta1")) == first

        spec = json.loads(gpu_driver.cdi.path(claim.uid).read_text())
        env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
        assert len(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == 2
        numas = sorted({gpu_env.place(n).numa for n in names})
        assert env["TOPOSERVE_GPU_NUMA_NODES"] == ",".join(map(str, numas))
        assert sorted(d["name"] for d in spec["devices"]) == [f"{claim.uid}-{n}" for n in names]
        assert gpu_driver.checkpoint_claims() == {claim.uid: ClaimState.PREPARE_COMPLETED}

        status = our_status(gpu_env.api, claim)
        assert sorted(s["device"] for s in status) == names
        assert all(s["pool"] == NODE and s["conditions"][0]["type"] == "Ready"
                   and s["conditions"][0]["status"] == "True" for s in status)
        assert {s["data"]["pciBusID"] for s in status} == {
            gpu_env.place(n).device.pci_bus_id for n in names}

        assert _get(gpu_driver.port, "/healthz")[0] == 200
        metrics = _get(gpu_driver.port, "/metrics")[1]
        assert f'toposerve_dra_prepare_seconds_count{{driver="{DRIVER}",result="ok"}} 3.0' \
            in metrics

        assert kubelet.unprepare([claim]) == {claim.uid: ""}
        assert gpu_driver.cdi.claims() == set()
        assert gpu_driver.checkpoint_claims() == {}
        assert our_status(gpu_env.api, claim) == []
        assert kubelet.unprepare([claim], "v1beta1") == {claim.uid: ""}  # idempotent
    finally:
        delete_claim(gpu_env.api, claim)


def test_per_claim_errors(gpu_env: GpuEnv, gpu_driver: DriverProc) -> None:
    good = create_claim(gpu_env.api, "good")
    unallocated = create_claim(gpu_env.api, "unallocated", allocate=False)
    bad_config = create_claim(gpu_env.api, "bad-config",
                              parameters={**GPU_CONFIG, "nicAlignment": "rack"})
    replaced = Claim(NAMESPACE, "good-replaced", random_uid())
    claims = [good, unallocated, bad_config, replaced,
              Claim(NAMESPACE, good.name, random_uid())]
    try:
        resp = _answer(gpu_driver.kubelet.prepare(claims))
        assert set(resp) == {c.uid for c in claims}  # every claim gets an entry
        assert resp[good.uid]["error"] == "" and len(resp[good.uid]["devices"]) == 1
        assert "is not allocated" in resp[unallocated.uid]["error"]
        assert "nicAlignment: Input should be 'switch', 'root', 'numa' or 'none'" in \
            resp[bad_config.uid]["error"]
        assert "not found" in resp[replaced.uid]["error"]
        assert f"the kubelet asked for {claims[4].uid}" in resp[claims[4].uid]["error"]
        assert all(not resp[c.uid]["devices"] for c in claims[1:])
        assert gpu_driver.checkpoint_claims() == {good.uid: ClaimState.PREPARE_COMPLETED}
        assert gpu_driver.cdi.claims() == {good.uid}
        assert gpu_driver.kubelet.unprepare([good]) == {good.uid: ""}
    finally:
        for c in (good, unallocated, bad_config):
            delete_claim(gpu_env.api, c)


def test_a_claim_whose_status_cannot_be_written_says_why(gpu_env: GpuEnv,
                                                        gpu_driver: DriverProc) -> None:
    """The Python client sends opaque parameters with spaces and in its own
    key order; the scheduler copies those bytes into status.allocation and
    the apiserver then refuses every status write of the claim. Prepare fails
    for that claim alone, with what to do about it."""
    claim = create_claim(gpu_env.api, "py-config",
                         parameters={"kind": "GpuConfig", "apiVersion": "toposerve.io/v1",
                                     "env": {"B": "2", "A": "1"}})
    good = create_claim(gpu_env.api, "plain")
    try:
        got = _answer(gpu_driver.kubelet.prepare([claim, good]))
        assert "create the claim with kubectl or with compact, key-sorted JSON" in \
            got[claim.uid]["error"], got[claim.uid]["error"]
        assert got[good.uid]["error"] == "" and len(got[good.uid]["devices"]) == 1
    finally:
        delete_claim(gpu_env.api, claim)
        delete_claim(gpu_env.api, good)


def test_least_privilege_identity(gpu_env: GpuEnv) -> None:
    with api_for(gpu_env.kubeconfig) as api, pytest.raises(ApiException) as err:
        client.CoreV1Api(api).list_namespaced_pod(NAMESPACE)
    assert err.value.status == 403


def test_sigterm_then_restart_keeps_prepared_claims(gpu_env: GpuEnv,
                                                     gpu_driver: DriverProc) -> None:
    claim = create_claim(gpu_env.api, "across-restart")
    try:
        first = _answer(gpu_driver.kubelet.prepare([claim]))
        assert first[claim.uid]["error"] == ""
        assert gpu_driver.stop() == 0
        assert not gpu_driver.registration_socket.exists()
        assert not (gpu_driver.plugin_dir / "dra.sock").exists()
        gpu_driver.start(console_script=True)  # as the real-node tier starts it
        assert _answer(gpu_driver.kubelet.prepare([claim])) == first
        assert gpu_driver.kubelet.unprepare([claim]) == {claim.uid: ""}
        assert gpu_driver.cdi.claims() == set() and gpu_driver.checkpoint_claims() == {}
    finally:
        delete_claim(gpu_env.api, claim)


def _taints(api: Any, device: str) -> list[str]:
    slices = client.ResourceV1Api(api).list_resource_slice(
        field_selector=f"spec.nodeName={NODE},spec.driver={DRIVER}").items
    return [t.key for s in slices for d in s.spec.devices or [] if d.name == device
            for t in d.taints or []]


def test_unhealthy_gpu_is_tainted_and_recovers(gpu_env: GpuEnv, gpu_driver: DriverProc) -> None:
    bdf = gpu_env.place("gpu-3").device.pci_bus_id
    link = gpu_env.sysfs / "bus/pci/devices" / bdf
    moved = link.with_name(f".{bdf}")
    stream = gpu_driver.kubelet.watch_health()
    assert all(h != 2 for _, _, h, _ in next(stream))
    link.rename(moved)  # the GPU falls off the bus
    try:
        wait_for("gpu-3 tainted", lambda: f"{DRIVER}/unhealthy" in _taints(gpu_env.api, "gpu-3"))
        snap = wait_for("gpu-3 unhealthy on the stream", lambda: next(
            s for s in stream if any(d == "gpu-3" and h == 2 for _, d, h, _ in s)))
        assert (NODE, "gpu-3", 2, f"PCI device {bdf} is gone") in snap
        assert {d for _, d, _, _ in snap} >= {f"gpu-{i}" for i in range(8)}  # every device
        partitions = [d for _, d, h, _ in snap if d.startswith("gpu-3-")]
        assert partitions and all(h == 2 for _, d, h, _ in snap if d in partitions)
        assert not _taints(gpu_env.api, "gpu-2")
    finally:
        if moved.exists() or moved.is_symlink():
            moved.rename(link)
    wait_for("gpu-3 taint gone", lambda: not _taints(gpu_env.api, "gpu-3"))


def test_unprepare_after_the_claim_is_gone(gpu_env: GpuEnv, gpu_driver: DriverProc) -> None:
    claim = create_claim(gpu_env.api, "deleted-first")
    assert gpu_driver.kubelet.prepare([claim])[claim.uid].error == ""
    delete_claim(gpu_env.api, claim)
    wait_for("claim gone", lambda: not _exists(gpu_env.api, claim))
    assert gpu_driver.kubelet.unprepare([claim]) == {claim.uid: ""}
    assert gpu_driver.cdi.claims() == set() and gpu_driver.checkpoint_claims() == {}


def _exists(api: Any, claim: Claim) -> bool:
    try:
        client.ResourceV1Api(api).read_namespaced_resource_claim(claim.name, NAMESPACE)
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


def test_checkpoint_of_an_earlier_boot_is_undone(gpu_env: GpuEnv,
                                                 gpu_driver: DriverProc) -> None:
    claim = create_claim(gpu_env.api, "before-reboot")
    try:
        assert gpu_driver.kubelet.prepare([claim])[claim.uid].error == ""
        assert gpu_driver.stop() == 0
        path = gpu_driver.plugin_dir / "checkpoint.json"
        data, _ = Checkpoint(path, "").load()
        Checkpoint(path, "an-earlier-boot").save(data)  # valid checksum, other boot
        gpu_driver.start()
        assert gpu_driver.checkpoint_claims() == {}
        assert gpu_driver.cdi.claims() == set() and our_status(gpu_env.api, claim) == []
        assert gpu_driver.kubelet.prepare([claim])[claim.uid].error == ""  # afresh
        assert gpu_driver.kubelet.unprepare([claim]) == {claim.uid: ""}
    finally:
        delete_claim(gpu_env.api, claim)


def test_status_needs_a_token_of_the_claims_node(gpu_env: GpuEnv, gpu_driver: DriverProc,
                                                 tmp_path: Path) -> None:
    """The same service account without the node-name extra (a token bound
    to no pod) may not write the claim's status: associated-node only."""
    claim = create_claim(gpu_env.api, "granular-status")
    try:
        core: Any = client.CoreV1Api(gpu_env.api)
        token = core.create_namespaced_service_account_token(
            SERVICE_ACCOUNT, NAMESPACE, {"spec": {"expirationSeconds": 600}}).status.token
        unbound = token_kubeconfig(gpu_env.cluster_name, token, tmp_path / "unbound.yaml")
        ref = ClaimRef(namespace=claim.namespace, name=claim.name, uid=claim.uid)
        device = DeviceStatus(pool=NODE, device=allocated_device(gpu_env.api, claim))
        with api_for(unbound) as api, pytest.raises(ApiException) as err:
            apply_device_status(api, DRIVER, ref, [device])
        # the apiserver answers 422 (status.devices: Forbidden), naming the verb it wanted
        assert err.value.status == 422 and "arbitrary-node:patch" in str(err.value.body)
        with api_for(gpu_env.kubeconfig) as api:  # bound to the driver pod on the node
            assert apply_device_status(api, DRIVER, ref, [device])
        assert [s["device"] for s in our_status(gpu_env.api, claim)] == [device.device]
    finally:
        delete_claim(gpu_env.api, claim)


def test_slices_carry_the_nodes_domain_path(gpu_env: GpuEnv, gpu_driver: DriverProc) -> None:
    res: Any = client.ResourceV1Api(gpu_env.api)
    slices = res.list_resource_slice(
        field_selector=f"spec.nodeName={NODE},spec.driver={DRIVER}").items
    gpu0 = next(d for s in slices for d in s.spec.devices or [] if d.name == "gpu-0")
    attrs = {k: v.string for k, v in gpu0.attributes.items() if v.string is not None}
    assert (attrs["rack"], attrs["nvlinkDomain"]) == ("dra-b0-r0", "dra-b0-r0-n0")
    assert attrs["resource.kubernetes.io/pciBusID"] == gpu_env.place("gpu-0").device.pci_bus_id
    assert all(s.spec.pool.name == NODE for s in slices)
    assert {o.kind for s in slices for o in s.metadata.owner_references} == {"Node"}


def test_uninstall_deletes_the_nodes_slices(gpu_env: GpuEnv, gpu_driver: DriverProc) -> None:
    assert gpu_driver.stop() == 0  # else it would publish them again
    out = subprocess.run(
        [sys.executable, "-m", "toposerve.driver_cmd", "--log-level", "warning", "driver",
         "gpu", "--node-name", NODE, "--kubeconfig", str(gpu_env.kubeconfig),
         "--sysfs-root", str(gpu_env.sysfs), "--plugin-dir", str(gpu_driver.plugin_dir),
         "--uninstall"], capture_output=True, text=True, timeout=60, check=True).stdout
    res: Any = client.ResourceV1Api(gpu_env.api)
    left = res.list_resource_slice(field_selector=f"spec.nodeName={NODE},spec.driver={DRIVER}")
    assert out.startswith("deleted ") and int(out.split()[1]) > 0 and not left.items


def test_corrupt_checkpoint_while_running_is_a_per_claim_error(
        gpu_env: GpuEnv, gpu_driver: DriverProc) -> None:
    claim = create_claim(gpu_env.api, "corrupt-checkpoint")
    path = gpu_driver.plugin_dir / "checkpoint.json"
    try:
        path.write_text('{"version": 1}')
        err = gpu_driver.kubelet.prepare([claim])[claim.uid].error
        assert f"checkpoint {path} is corrupt" in err
        assert gpu_driver.kubelet.unprepare([claim])[claim.uid].startswith(
            f"unprepare claim {claim.namespace}/{claim.name}")
        assert path.read_text() == '{"version": 1}' and gpu_driver.cdi.claims() == set()
    finally:
        path.unlink()
        delete_claim(gpu_env.api, claim)
