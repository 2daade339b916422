"""What the NIC driver's cluster tests stand on: a kwok node of our own
whose NICs are stand-ins (veth ends in a namespace of the test's, PCI
identities from a fake sysfs tree, ``harness.net_standins``), the driver's
service account with the least RBAC (its token bound to a driver pod on
that node), ``toposerve driver net`` as a real subprocess, and claims
allocated by the real scheduler from the slices it published."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from kubernetes import client

from harness.dra_gpu import RULES as GPU_RULES
from harness.dra_gpu import DriverSite
from harness.dra_kubelet import Claim
from harness.driver_proc import DriverProc
from harness.net_standins import StandIns
from harness.waiting import wait_for
from toposerve.dra_driver.net.config import NetConfig
from toposerve.dra_driver.net.driver import CDI_CLASS, CDI_VENDOR
from toposerve.kubeapi import JsonApi
from toposerve.localcluster.nodes import KWOK_TOLERATION

DRIVER = "net.toposerve.io"
NAMESPACE = "dra-net-test"
NODE = "dra-net-node-0"
CLASS = "dra-test-nic"
SERVICE_ACCOUNT = "net-driver"
ROLE = "dra-test-net-driver"
# The GPU driver's rules with this driver's name (the manifests carry the same).
RULES: list[dict[str, Any]] = [
    {**r, "resourceNames": [DRIVER]} if "resourceNames" in r else r for r in GPU_RULES]


def canonical(doc: Any) -> Any:
    """``doc`` with every mapping's keys sorted (see ``create_claim``)."""
    if isinstance(doc, dict):
        return {k: canonical(doc[k]) for k in sorted(doc)}
    if isinstance(doc, list):
        return [canonical(v) for v in doc]
    return doc


def net_config(**fields: Any) -> dict[str, Any]:
    return {"apiVersion": NetConfig.API_VERSION, "kind": NetConfig.KIND, **fields}


@dataclass
class NetEnv:
    api: Any                  # the admin's client
    kubeconfig: Path          # the driver's own (service-account token)
    node: str = NODE


def _pod(name: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "pause"}],
                     "tolerations": [KWOK_TOLERATION], **extra}}


SITE = DriverSite(driver=DRIVER, node=NODE, node_index=61001, namespace=NAMESPACE,
                  device_class=CLASS, account=SERVICE_ACCOUNT, role=ROLE, rules=RULES,
                  rack="net-b0-r0")


def setup_env(cluster_name: str, api: Any, tmp: Path) -> NetEnv:
    return NetEnv(api=api, kubeconfig=SITE.setup(cluster_name, api, tmp))


def teardown_env(api: Any) -> None:
    SITE.teardown(api)


@dataclass
class NetDriverProc(DriverProc[NetEnv]):
    """``toposerve driver net`` reading the stand-ins' namespace and sysfs."""

    kind: ClassVar[str] = "net"
    driver: ClassVar[str] = DRIVER
    cdi_vendor: ClassVar[str] = CDI_VENDOR
    cdi_class: ClassVar[str] = CDI_CLASS

    nics: StandIns
    rescan_interval_s: float = 0.5
    extra_args: tuple[str, ...] = ()

    @property
    def state_dir(self) -> Path:
        return self.root / "handoff"

    @property
    def journal_dir(self) -> Path:
        return self.root / "journal"

    @property
    def handoff_socket(self) -> Path:
        return self.root / "handoff.sock"

    def start(self) -> None:
        self.launch(self.argv(
            self.nics.sysfs, self.nics.dev, "--state-dir", str(self.state_dir),
            "--journal-dir", str(self.journal_dir), "--handoff-socket", str(self.handoff_socket),
            "--netns", self.nics.netns, "--rescan-interval", str(self.rescan_interval_s),
            *self.extra_args))


def published(api: Any, node: str = NODE) -> list[dict[str, Any]]:
    """The devices of our driver's slices for ``node`` (JSON)."""
    resp: Any = client.ResourceV1Api(api).list_resource_slice(
        field_selector=f"spec.nodeName={node},spec.driver={DRIVER}", _preload_content=False)
    return [d for s in json.loads(resp.data)["items"] for d in s["spec"].get("devices") or []]


def create_claim(api: Any, name: str, *, configs: list[dict[str, Any]] | None = None,
                 count: int = 1, selector: str | None = None) -> tuple[Claim, str]:
    """A claim for ``count`` NICs of our node, allocated by the real
    scheduler for a pod; the claim and the pod's UID."""
    exactly: dict[str, Any] = {"deviceClassName": CLASS, "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "nic", "exactly": exactly}]}}
    if configs:
        spec["devices"]["config"] = [{"requests": ["nic"], "opaque": {
            "driver": DRIVER, "parameters": c}} for c in configs]
    # Sent compact with sorted keys (orjson), as kubectl sends it. The opaque
    # parameters are kept as raw bytes; any other spelling (the Python
    # client's json.dumps adds spaces, a dict keeps its own key order) is
    # copied into status.allocation by the scheduler, and every later status
    # write is refused: the apiserver re-encodes the parameters compact and
    # sorted and sees that as a change of the immutable allocation.
    created = JsonApi(api).request(
        "POST", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims",
        body=canonical({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                        "metadata": {"name": name}, "spec": spec}))
    res: Any = client.ResourceV1Api(api)
    core: Any = client.CoreV1Api(api)
    pod = core.create_namespaced_pod(NAMESPACE, _pod(f"{name}-pod", {
        "nodeSelector": {"kubernetes.io/hostname": NODE},
        "resourceClaims": [{"name": "nic", "resourceClaimName": name}],
        "containers": [{"name": "c", "image": "pause",
                        "resources": {"claims": [{"name": "nic"}]}}]}))
    wait_for(f"claim {name} allocated",
             lambda: res.read_namespaced_resource_claim(name, NAMESPACE).status.allocation,
             timeout=30)
    return Claim(namespace=NAMESPACE, name=name, uid=created["metadata"]["uid"]), pod.metadata.uid


def claim_status(api: Any, claim: Claim) -> dict[str, Any]:
    resp: Any = client.ResourceV1Api(api).read_namespaced_resource_claim(
        claim.name, NAMESPACE, _preload_content=False)
    status: dict[str, Any] = json.loads(resp.data).get("status") or {}
    return status
