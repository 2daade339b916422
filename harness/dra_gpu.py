"""What the GPU driver's cluster tests and benchmarks stand on: a kwok node of our
own with a fake sysfs tree of its profile, the driver's service account
with the least RBAC (its token bound to a driver pod on that node, so it
carries the node-name extra), the driver as a real subprocess, and claims
allocated by the real scheduler."""

from __future__ import annotations

import contextlib
import json
import os
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from harness import driver_proc, fake_nvml
from harness.dra_kubelet import Claim
from harness.waiting import wait_for
from toposerve.dra_driver.gpu.driver import CDI_CLASS, CDI_VENDOR
from toposerve.dra_driver.kubeletplugin.checkpoint import Checkpoint, ClaimState, read_boot_id
from toposerve.localcluster.clusters import kubeconfig_path
from toposerve.localcluster.nodes import KWOK_TOLERATION, node_manifest
from toposerve.topology.labels import PRESETS, DialectName
from toposerve.topology.layout import PlannedNode
from toposerve.topology.model import DomainPath
from toposerve.topology.profiles import load_profile
from toposerve.topology.sysfs import write_profile_sysfs

DRIVER = "gpu.toposerve.io"
NAMESPACE = "dra-gpu-test"
NODE = "dra-gpu-node-0"
PROFILE = "hgx-h100"
CLASS = "dra-test-gpu"
SERVICE_ACCOUNT = "gpu-driver"
# The driver's least RBAC (docs/design.md §3); the manifests carry the same rules.
RULES: list[dict[str, Any]] = [
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/status"],
     "verbs": ["patch", "update"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
     "resourceNames": [DRIVER], "verbs": ["associated-node:patch", "associated-node:update"]},
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    # the Node event when GPUs are withheld from NVIDIA's plugins (coexistence)
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]


@dataclass
class GpuEnv:
    cluster_name: str
    api: Any                  # the admin's client
    kubeconfig: Path          # the driver's own (service-account token)
    sysfs: Path
    dev: Path
    node: str = NODE

    def place(self, device: str) -> Any:
        return load_profile(PROFILE).hardware().place(device)


def _apply(fn: Any, *args: Any) -> None:
    with contextlib.suppress(ApiException):
        fn(*args)


def _dev_root(dev: Path) -> None:
    names = [f"nvidia{i}" for i in range(8)] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"]
    dev.mkdir(parents=True)
    for n in names:
        (dev / n).touch()  # stand-ins: nothing here opens them


def token_kubeconfig(cluster_name: str, token: str, out: Path) -> Path:
    admin = yaml.safe_load(kubeconfig_path(cluster_name).read_text())
    ctx = next(c for c in admin["contexts"] if c["name"] == admin["current-context"])["context"]
    cluster = next(c for c in admin["clusters"] if c["name"] == ctx["cluster"])
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "driver",
           "clusters": [cluster],
           "users": [{"name": "driver", "user": {"token": token}}],
           "contexts": [{"name": "driver", "context": {"cluster": cluster["name"],
                                                       "user": "driver"}}]}
    out.write_text(yaml.safe_dump(doc))
    return out


@dataclass(frozen=True)
class DriverSite:
    """Where a driver's cluster tests run: a kwok node of their own, a
    namespace, a DeviceClass for the driver, and the driver's service account
    with ``rules`` (its token bound to a driver pod on the node)."""

    driver: str
    node: str
    node_index: int
    namespace: str
    device_class: str
    account: str
    role: str
    rules: list[dict[str, Any]]
    rack: str

    def setup(self, cluster_name: str, api: Any, tmp: Path) -> Path:
        """Everything made; the driver's own kubeconfig."""
        core: Any = client.CoreV1Api(api)
        rbac: Any = client.RbacAuthorizationV1Api(api)
        path = DomainPath(zone="zone-9", block=self.rack.rsplit("-", 1)[0], rack=self.rack,
                          nvlink=f"{self.rack}-n0", host=self.node)
        node = node_manifest(PlannedNode(name=self.node, profile=PROFILE, path=path,
                                         index=self.node_index),
                             load_profile(PROFILE), PRESETS[DialectName.TOPOSERVE])
        # Not a `cluster up` node (no profile label): `driver simulate` leaves it to us.
        node["metadata"]["labels"] = {k: v for k, v in node["metadata"]["labels"].items()
                                      if not k.startswith("topology.toposerve.io/profile")}
        _apply(core.create_node, node)
        _apply(core.create_namespace, {"metadata": {"name": self.namespace}})
        _apply(client.ResourceV1Api(api).create_device_class, {
            "metadata": {"name": self.device_class},
            "spec": {"selectors": [{"cel": {"expression":
                                            f"device.driver == '{self.driver}'"}}]}})
        _apply(core.create_namespaced_service_account, self.namespace,
               {"metadata": {"name": self.account}})
        _apply(rbac.create_cluster_role, {"metadata": {"name": self.role}, "rules": self.rules})
        _apply(rbac.create_cluster_role_binding, {
            "metadata": {"name": self.role},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": self.role},
            "subjects": [{"kind": "ServiceAccount", "name": self.account,
                          "namespace": self.namespace}]})
        pod = _pod(self.account, {"serviceAccountName": self.account, "nodeName": self.node})
        _apply(core.create_namespaced_pod, self.namespace, pod)
        driver_pod = core.read_namespaced_pod(self.account, self.namespace)
        token = core.create_namespaced_service_account_token(self.account, self.namespace, {
            "spec": {"expirationSeconds": 3600, "boundObjectRef": {
                "kind": "Pod", "apiVersion": "v1", "name": self.account,
                "uid": driver_pod.metadata.uid}}}).status.token
        return token_kubeconfig(cluster_name, token, tmp / "sa.yaml")

    def teardown(self, api: Any) -> None:
        core: Any = client.CoreV1Api(api)
        rbac: Any = client.RbacAuthorizationV1Api(api)
        _apply(core.delete_namespace, self.namespace)
        _apply(core.delete_node, self.node)  # its slices go with it (owner reference)
        _apply(client.ResourceV1Api(api).delete_device_class, self.device_class)
        _apply(rbac.delete_cluster_role_binding, self.role)
        _apply(rbac.delete_cluster_role, self.role)

        def gone(read: Any, *args: Any) -> bool:
            try:
                read(*args)
            except ApiException as err:
                if err.status == 404:
                    return True
                raise
            return False

        # the next module's setup makes the same namespace and node: a
        # namespace still terminating refuses new content
        wait_for(f"namespace {self.namespace} gone", lambda: gone(core.read_namespace,
                                                                   self.namespace), timeout=120)
        wait_for(f"node {self.node} gone", lambda: gone(core.read_node, self.node), timeout=60)


SITE = DriverSite(driver=DRIVER, node=NODE, node_index=61000, namespace=NAMESPACE,
                  device_class=CLASS, account=SERVICE_ACCOUNT, role="dra-test-gpu-driver",
                  rules=RULES, rack="dra-b0-r0")


def setup_env(cluster_name: str, api: Any, tmp: Path) -> GpuEnv:
    kubeconfig = SITE.setup(cluster_name, api, tmp)
    sysfs = write_profile_sysfs(load_profile(PROFILE), tmp / "sysfs")
    _dev_root(tmp / "dev")
    return GpuEnv(cluster_name=cluster_name, api=api, kubeconfig=kubeconfig,
                  sysfs=sysfs, dev=tmp / "dev")


def teardown_env(api: Any) -> None:
    SITE.teardown(api)


def _pod(name: str, extra: Mapping[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "pause"}],
                     "tolerations": [KWOK_TOLERATION], **extra}}


@dataclass
class DriverProc(driver_proc.DriverProc[GpuEnv]):
    """``toposerve driver gpu`` as the real-node engineer will start it."""

    kind: ClassVar[str] = "gpu"
    driver: ClassVar[str] = DRIVER
    cdi_vendor: ClassVar[str] = CDI_VENDOR
    cdi_class: ClassVar[str] = CDI_CLASS

    def start(self, crash_at: str | None = None, health_interval: float = 0.2,
              console_script: bool = False, nvml: Path | None = None) -> None:
        """``nvml``: a fake NVML scenario (``harness.fake_nvml``) for the
        driver to read its GPUs from; without one, sysfs only (a real
        libnvidia-ml on the test machine is not ours to read)."""
        nvml_args = ["--nvml-library", str(fake_nvml.build())] if nvml else ["--no-nvml"]
        argv = self.argv(self.env.sysfs, self.env.dev, "--health-interval",
                         str(health_interval), *nvml_args, console_script=console_script)
        env = {k: v for k, v in os.environ.items()
               if k not in ("TOPOSERVE_DRA_CRASH_AT", fake_nvml.ENV)}
        if crash_at:
            env["TOPOSERVE_DRA_CRASH_AT"] = crash_at
        if nvml:
            env[fake_nvml.ENV] = str(nvml)
        self.launch(argv, env)

    def log_tail(self) -> str:
        return self.log.read_text()[-2000:]

    def wait_exit(self) -> int:
        assert self.proc is not None
        rc = self.proc.wait(timeout=30)
        self.proc = None
        return rc

    def checkpoint_claims(self) -> dict[str, ClaimState]:
        data, _ = Checkpoint(self.plugin_dir / "checkpoint.json", read_boot_id()).load()
        return {uid: e.state for uid, e in data.claims.items()}


@contextlib.contextmanager
def running(env: GpuEnv, root: Path) -> Iterator[DriverProc]:
    d = DriverProc(env, root)
    d.start()
    try:
        yield d
    finally:
        d.kill()


def wait_slices(api: Any, node: str = NODE, count: int = 8) -> None:
    def whole_gpus() -> bool:
        slices = client.ResourceV1Api(api).list_resource_slice(
            field_selector=f"spec.nodeName={node},spec.driver={DRIVER}").items
        return sum(1 for s in slices for d in s.spec.devices or []
                   if "parentUUID" not in (d.attributes or {})) >= count
    wait_for(f"{count} GPUs published for {node}", whole_gpus, timeout=30)


def create_claim(api: Any, name: str, *, allocate: bool = True,
                 parameters: Mapping[str, Any] | None = None, count: int = 1,
                 node: str = NODE) -> Claim:
    """A claim for ``count`` whole GPUs of ``node``, allocated by the real
    scheduler for a pod (when ``allocate``)."""
    exactly: dict[str, Any] = {"deviceClassName": CLASS, "count": count,
                               "selectors": [{"cel": {"expression":
                                              f"device.attributes['{DRIVER}'].type == 'gpu'"}}]}
    spec: dict[str, Any] = {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}
    if parameters is not None:
        spec["devices"]["config"] = [{"requests": ["gpu"], "opaque": {
            "driver": DRIVER, "parameters": dict(parameters)}}]
    res: Any = client.ResourceV1Api(api)
    created = res.create_namespaced_resource_claim(NAMESPACE, {"metadata": {"name": name},
                                                               "spec": spec})
    if allocate:
        core: Any = client.CoreV1Api(api)
        core.create_namespaced_pod(NAMESPACE, _pod(f"{name}-pod", {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [{"name": "c", "image": "pause",
                            "resources": {"claims": [{"name": "gpu"}]}}]}))
        wait_for(f"claim {name} allocated",
                 lambda: res.read_namespaced_resource_claim(name, NAMESPACE).status.allocation,
                 timeout=30)
    return Claim(namespace=NAMESPACE, name=name, uid=created.metadata.uid)


def delete_claim(api: Any, claim: Claim) -> None:
    core, res = client.CoreV1Api(api), client.ResourceV1Api(api)
    with contextlib.suppress(ApiException):
        core.delete_namespaced_pod(f"{claim.name}-pod", NAMESPACE, grace_period_seconds=0)
    with contextlib.suppress(ApiException):
        res.delete_namespaced_resource_claim(claim.name, NAMESPACE)


def our_status(api: Any, claim: Claim) -> list[dict[str, Any]]:
    """The claim's status.devices entries of our driver (JSON)."""
    try:
        res: Any = client.ResourceV1Api(api)
        resp = res.read_namespaced_resource_claim(claim.name, NAMESPACE, _preload_content=False)
    except ApiException as err:
        if err.status == 404:
            return []
        raise
    doc = json.loads(resp.data)
    return [d for d in (doc.get("status") or {}).get("devices") or [] if d["driver"] == DRIVER]


def random_uid() -> str:
    return str(uuid.uuid4())


def api_for(kubeconfig: Path) -> Any:
    cfg = client.Configuration()
    config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig), client_configuration=cfg)
    return client.ApiClient(cfg)


def allocated_device(api: Any, claim: Claim) -> str:
    res: Any = client.ResourceV1Api(api)
    got = res.read_namespaced_resource_claim(claim.name, NAMESPACE)
    name: str = got.status.allocation.devices.results[0].device
    return name
