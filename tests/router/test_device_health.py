"""Device health and placement reach the router, on the real apiserver:
kwok pods that hold ResourceClaims (allocated here, as the scheduler would
write it) on GPUs of a ResourceSlice published as the GPU driver builds it
(under a driver name of this module's own, so that no other test's
DeviceClass selects them).

- A device taint (the slice's, or a DeviceTaintRule's) takes the pod that
  holds the device out of rotation within 2 s while traffic flows, its
  answer in flight finishing; the taint gone, it comes back. A metric and
  an Event on the pod say why.
- Two decode pods on the prefill pod's node: the one whose GPU sits next
  to the prefill's (one PCIe switch, or one NVLink pair across switches)
  decodes every split request, which node labels cannot tell apart."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes import client

from harness import dra_gpu
from harness.device_health import Traffic, Victim, pod_events, tainted, wait_tainted, xid_round
from harness.dra_gpu import GpuEnv
from harness.fake_nvml import Scenario, gpus_of
from harness.procs import MODEL, Proc, Procs
from harness.waiting import wait_for
from tests.conftest import Cluster
from toposerve.dra_driver.gpu.devices import gpu_pool
from toposerve.dra_driver.gpu.driver import TAINT_XID
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster.clusters import kubeconfig_path
from toposerve.localcluster.pods import model_pod, wait_running
from toposerve.topology.model import DomainPath, NodeTopology
from toposerve.topology.profiles import load_profile

pytestmark = pytest.mark.cluster
RES = "/apis/resource.k8s.io/v1"
NS = "default"
PORT = 8000
WITHIN_S = 2.0  # a taint takes its endpoint out of rotation, and back, within this
REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


@dataclass
class Gpus:
    """One kwok node's GPUs in a slice of a driver of this test's own."""

    rest: JsonApi
    node: str
    driver: str
    slice: str
    devices: list[dict[str, Any]]

    def write(self) -> None:
        body = self.rest.request("GET", f"{RES}/resourceslices/{self.slice}")
        body["spec"]["devices"] = self.devices
        self.rest.request("PUT", f"{RES}/resourceslices/{self.slice}", body=body)

    def taint(self, device: str, taint: dict[str, str] | None) -> None:
        """Puts ``taint`` on ``device`` (None: takes its taints off), as the
        driver republishes its slice."""
        for d in self.devices:
            if d["name"] == device:
                d.pop("taints", None)
                if taint is not None:
                    d["taints"] = [taint]
        self.write()

    def claim(self, name: str, app: str, device: str) -> None:
        """A claim allocated ``device``, as kube-scheduler writes it."""
        self.rest.request("POST", f"{RES}/namespaces/{NS}/resourceclaims", body={
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "labels": {"app": app}},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": f"{self.driver}-gpu"}}]}}})
        claim = self.rest.request("GET", f"{RES}/namespaces/{NS}/resourceclaims/{name}")
        claim["status"] = {"allocation": {
            "devices": {"results": [{"request": "gpu", "driver": self.driver,
                                     "pool": self.node, "device": device}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [self.node]}]}]}}}
        self.rest.request("PUT", f"{RES}/namespaces/{NS}/resourceclaims/{name}/status",
                          body=claim)

    def pod(self, core: Any, name: str, app: str, role: str, device: str) -> str:
        """A model pod on the node holding ``device`` through a claim; its IP."""
        self.claim(name, app, device)
        core.create_namespaced_pod(NS, claiming(model_pod(name, app, role, self.node),
                                                resourceClaimName=name))
        return str(wait_running(core, [name])[name][0])


def claiming(pod: dict[str, Any], **claim: str) -> dict[str, Any]:
    """``pod``, its container using the claim ``claim`` names (by
    resourceClaimName or resourceClaimTemplateName)."""
    pod["spec"]["resourceClaims"] = [{"name": "gpu", **claim}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return pod


def _publish(rest: JsonApi, node: str, nvlink_pairs: bool) -> Gpus:
    tag = uuid.uuid4().hex[:6]
    driver = f"gpu-{tag}.test.toposerve.io"
    # the node's place as its labels would give it, with no NVLink domain:
    # a node whose GPUs share PCIe only, or (nvlink_pairs) NVLink in bridged
    # pairs that NVML names apart (1-2, 3-4, 5-6, 7-0: across switches)
    topo = NodeTopology(name=node, path=DomainPath(host=node), profile="hgx-h100",
                        hardware=load_profile("hgx-h100").hardware())
    devices = [dict(d) for d in gpu_pool(topo, partitions=False).devices]
    for d in devices if nvlink_pairs else ():
        d["attributes"] = {**d["attributes"], "nvlinkDomain": {
            "string": f"{tag}.{(int(d['name'].rsplit('-', 1)[1]) + 1) % 8 // 2}"}}
    gpus = Gpus(rest, node, driver, f"{node}-{tag}", devices)
    rest.request("POST", f"{RES}/resourceslices", body={
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": gpus.slice},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}})
    return gpus


@contextlib.contextmanager
def published(cluster: Cluster, nvlink_pairs: bool = False) -> Iterator[tuple[Gpus, str]]:
    """An HGX node's GPUs published, and an app label for the pods made on
    it; all of it deleted after."""
    rest = JsonApi(cluster.api)
    core: Any = client.CoreV1Api(cluster.api)
    node = sorted(n.metadata.name for n in core.list_node(
        label_selector="topology.toposerve.io/profile=hgx-h100").items)[-1]
    gpus = _publish(rest, node, nvlink_pairs)
    app = f"dev-{uuid.uuid4().hex[:6]}"
    try:
        yield gpus, app
    finally:
        for pod in core.list_namespaced_pod(NS, label_selector=f"app={app}").items:
            with contextlib.suppress(client.exceptions.ApiException):
                core.delete_namespaced_pod(pod.metadata.name, NS, grace_period_seconds=0)
        rest.request("DELETE", f"{RES}/namespaces/{NS}/resourceclaims",
                     [("labelSelector", f"app={app}")])
        with contextlib.suppress(ApiError):
            rest.request("DELETE", f"{RES}/resourceslices/{gpus.slice}")


def _router(procs: Procs, cluster: Cluster, app: str, **config: Any) -> Proc:
    return procs.router({"discovery": {"kubernetes": {
        "namespace": NS, "labelSelector": f"app={app}", "port": PORT,
        "kubeconfig": str(kubeconfig_path(cluster.name))}},
        "server": {"drainTimeoutSeconds": 10}, **config})


def _healthy(router: Proc) -> dict[str, float]:
    return {s.labels["endpoint"]: s.value for s in router.samples()
            if s.name == "toposerve_router_endpoint_healthy"}


def _long_answer_on(router: Proc, endpoint: str) -> tuple[httpx.Client, httpx.Response]:
    """A streamed answer in flight from ``endpoint`` (requests are sent
    until one lands there; the others are read to their end)."""
    c = httpx.Client(base_url=router.url, timeout=60)
    for i in range(40):
        req = c.build_request("POST", "/v1/chat/completions", json={
            "model": MODEL, "max_tokens": 400, "stream": True,
            "messages": [{"role": "user", "content": f"a long answer {i}"}]})
        r = c.send(req, stream=True)
        if r.headers.get("x-toposerve-endpoint") == endpoint:
            return c, r
        r.read()
    raise AssertionError(f"no streamed answer from {endpoint}")


def test_a_tainted_gpu_takes_its_pod_out_of_rotation_and_back(cluster: Cluster,
                                                              procs: Procs) -> None:
    core: Any = client.CoreV1Api(cluster.api)
    with published(cluster) as (gpus, app):
        pods = {"a": f"{app}-a", "b": f"{app}-b"}
        ips = {k: gpus.pod(core, name, app, "decode", f"gpu-{i}")
               for i, (k, name) in enumerate(pods.items())}
        for ip in ips.values():
            procs.sim(host=ip, port=PORT)
        ep = {k: f"{ip}:{PORT}" for k, ip in ips.items()}
        router = _router(procs, cluster, app)
        wait_for("both endpoints", lambda: sum(_healthy(router).values()) == 2, timeout=20)
        assert tainted(router) == {}

        with Traffic(router) as traffic:
            wait_for("traffic on both", lambda: all(traffic.served(e) for e in ep.values()),
                     timeout=20)
            streaming, answer = _long_answer_on(router, ep["a"])
            sent = time.monotonic()
            gpus.taint("gpu-0", {"key": TAINT_XID, "value": "79", "effect": "NoSchedule"})
            out = wait_tainted(router, ep["a"], out=True)
            assert out - sent < WITHIN_S, f"out of rotation after {out - sent:.2f} s"
            assert tainted(router)[ep["a"]] == {
                (f"{gpus.driver}/{gpus.node}/gpu-0", TAINT_XID, "NoSchedule")}
            assert _healthy(router)[ep["a"]] == 0.0
            # the answer in flight there goes on to its end
            body = answer.read().decode()
            streaming.close()
            assert answer.status_code == 200 and body.rstrip().endswith("data: [DONE]")
            wait_for("traffic after the taint", lambda: traffic.served(ep["b"], out) >= 20,
                     timeout=20)
            assert traffic.served(ep["a"], out) == 0
            (warning,) = pod_events(gpus.rest, NS, pods["a"], "DeviceTainted")
            assert warning["type"] == "Warning" and "gpu-0" in warning["message"]

            sent = time.monotonic()
            gpus.taint("gpu-0", None)
            back = wait_tainted(router, ep["a"], out=False)
            assert back - sent < WITHIN_S, f"back in rotation after {back - sent:.2f} s"
            wait_for("traffic on a again", lambda: traffic.served(ep["a"], back) > 0, timeout=20)
            (normal,) = pod_events(gpus.rest, NS, pods["a"], "DeviceTaintsCleared")
            assert normal["type"] == "Normal"

            # an admin's DeviceTaintRule on b's GPU does the same
            rule = f"{app}-drain"
            sent = time.monotonic()
            gpus.rest.request("POST", f"{RES}/devicetaintrules", body={
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
                "metadata": {"name": rule},
                "spec": {"deviceSelector": {"driver": gpus.driver, "pool": gpus.node,
                                            "device": "gpu-1"},
                         "taint": {"key": "example.com/drain", "effect": "NoSchedule"}}})
            try:
                out = wait_tainted(router, ep["b"], out=True)
                assert out - sent < WITHIN_S
                wait_for("traffic after the rule", lambda: traffic.served(ep["a"], out) >= 20,
                         timeout=20)
                assert traffic.served(ep["b"], out) == 0
            finally:
                gpus.rest.request("DELETE", f"{RES}/devicetaintrules/{rule}")
            wait_tainted(router, ep["b"], out=False)
        statuses = {s.status for s in traffic.sent}
        assert statuses == {200}, statuses
        assert len(traffic.sent) > 100


def test_a_claim_made_from_a_template_and_allocated_by_the_scheduler(
        cluster: Cluster, procs: Procs) -> None:
    """As on a real cluster: kube-scheduler allocates the pod's claim (made
    from a template by the controller manager, its name in the pod's
    status) from the slice, and the router finds the device it got."""
    core: Any = client.CoreV1Api(cluster.api)
    with published(cluster) as (gpus, app):
        rest, cls, name = gpus.rest, f"{gpus.driver}-gpu", f"{app}-t"
        rest.request("POST", f"{RES}/deviceclasses", body={
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": cls},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{gpus.driver}'"}}]}})
        try:
            rest.request("POST", f"{RES}/namespaces/{NS}/resourceclaimtemplates", body={
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                "metadata": {"name": name}, "spec": {"spec": {"devices": {"requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": cls}}]}}}})
            pod = claiming(model_pod(name, app, "decode"), resourceClaimTemplateName=name)
            pod["spec"].pop("nodeSelector")  # the scheduler places it, on the node
            pod["spec"]["affinity"] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": [
                {"matchFields": [{"key": "metadata.name", "operator": "In",
                                  "values": [gpus.node]}]}]}}}
            core.create_namespaced_pod(NS, pod)
            ip = wait_running(core, [name])[name][0]
            status = core.read_namespaced_pod(name, NS).status.resource_claim_statuses
            claim = rest.request("GET", f"{RES}/namespaces/{NS}/resourceclaims/"
                                        f"{status[0].resource_claim_name}")
            (result,) = claim["status"]["allocation"]["devices"]["results"]
            procs.sim(host=ip, port=PORT)
            router = _router(procs, cluster, app)
            ep = f"{ip}:{PORT}"
            wait_for("the endpoint", lambda: _healthy(router).get(ep) == 1.0, timeout=20)
            gpus.taint(result["device"], {"key": TAINT_XID, "value": "48",
                                          "effect": "NoSchedule"})
            wait_tainted(router, ep, out=True)
            r = httpx.post(router.url + "/v1/chat/completions", timeout=30, json={
                "model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 503, r.text  # its only endpoint is out of rotation
            gpus.taint(result["device"], None)
            wait_tainted(router, ep, out=False)
        finally:
            core.delete_namespaced_pod(name, NS, grace_period_seconds=0)
            with contextlib.suppress(ApiError):
                rest.request("DELETE", f"{RES}/namespaces/{NS}/resourceclaimtemplates/{name}")
            rest.request("DELETE", f"{RES}/deviceclasses/{cls}")


@pytest.fixture(scope="module")
def gpu_site(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuEnv]:
    """The GPU driver's kwok node of its own (``harness.dra_gpu``)."""
    env = dra_gpu.setup_env(cluster.name, cluster.api, tmp_path_factory.mktemp("gpu-site"))
    try:
        yield env
    finally:
        dra_gpu.teardown_env(cluster.api)


def test_an_xid_from_nvml_takes_the_pod_out_of_rotation(gpu_site: GpuEnv, cluster: Cluster,
                                                       procs: Procs, tmp_path: Path) -> None:
    """The whole path but the kubelet: ``toposerve driver gpu`` reads the
    fake NVML library, a critical XID under a model pod's GPU becomes the
    slice's taint, and the router stops sending there; the GPU reset (lost,
    then back), the taint goes and so does the pod's exclusion."""
    core: Any = client.CoreV1Api(cluster.api)
    rest = JsonApi(cluster.api)
    ns, app = dra_gpu.NAMESPACE, f"xid-{uuid.uuid4().hex[:6]}"
    scenario = Scenario(gpus_of(load_profile(dra_gpu.PROFILE).hardware())).write(
        tmp_path / "scenario")
    driver = dra_gpu.DriverProc(gpu_site, tmp_path / "driver")
    driver.start(nvml=scenario)
    try:
        dra_gpu.wait_slices(cluster.api)
        rest.request("POST", f"{RES}/namespaces/{ns}/resourceclaimtemplates", body={
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": app}, "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": dra_gpu.CLASS, "selectors": [
                    {"cel": {"expression": f"device.attributes['{dra_gpu.DRIVER}'].type "
                                           "== 'gpu'"}}]}}]}}}})
        names = [f"{app}-{i}" for i in range(2)]
        for name in names:
            pod = claiming(model_pod(name, app, "decode"), resourceClaimTemplateName=app)
            pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": gpu_site.node}
            core.create_namespaced_pod(ns, pod)
        ips = {n: ip for n, (ip, _) in wait_running(core, names, ns).items()}
        for ip in ips.values():
            procs.sim(host=ip, port=PORT)
        router = procs.router({"discovery": {"kubernetes": {
            "namespace": ns, "labelSelector": f"app={app}", "port": PORT,
            "kubeconfig": str(kubeconfig_path(cluster.name))}}})
        wait_for("both endpoints", lambda: sum(_healthy(router).values()) == 2, timeout=20)
        victim = names[0]
        claim = core.read_namespaced_pod(victim, ns).status.resource_claim_statuses[0]
        device = rest.request("GET", f"{RES}/namespaces/{ns}/resourceclaims/"
                                     f"{claim.resource_claim_name}")[
            "status"]["allocation"]["devices"]["results"][0]["device"]
        with Traffic(router) as traffic:
            xid_round(traffic, rest, scenario, Victim(
                namespace=ns, pod=victim, endpoint=f"{ips[victim]}:{PORT}",
                device=f"{dra_gpu.DRIVER}/{gpu_site.node}/{device}",
                gpu=int(device.rsplit("-", 1)[1])), WITHIN_S)
        assert {s.status for s in traffic.sent} == {200}
    finally:
        driver.kill()
        for name in core.list_namespaced_pod(ns, label_selector=f"app={app}").items:
            core.delete_namespaced_pod(name.metadata.name, ns, grace_period_seconds=0)
        with contextlib.suppress(ApiError):
            rest.request("DELETE", f"{RES}/namespaces/{ns}/resourceclaimtemplates/{app}")


@pytest.mark.parametrize(("nvlink_pairs", "prefill", "near", "far"), [
    (False, "gpu-0", "gpu-1", "gpu-4"),  # PCIe only: one switch against the other socket
    (True, "gpu-1", "gpu-2", "gpu-0"),   # NVLink pairs: the pair against the switch's other
], ids=["pcie", "nvlink-pairs"])
def test_decode_pairs_with_the_gpus_next_to_the_prefills(
        cluster: Cluster, procs: Procs, nvlink_pairs: bool, prefill: str, near: str,
        far: str) -> None:
    core: Any = client.CoreV1Api(cluster.api)
    with published(cluster, nvlink_pairs) as (gpus, app):
        ep = {}
        for role, name, device in (("prefill", "p", prefill), ("decode", "near", near),
                                   ("decode", "far", far)):
            ip = gpus.pod(core, f"{app}-{name}", app, role, device)
            procs.sim(host=ip, port=PORT, time_scale=0.01)
            ep[name] = f"{ip}:{PORT}"
        router = _router(procs, cluster, app, disaggregation={"enabled": True})
        wait_for("3 endpoints", lambda: sum(_healthy(router).values()) == 3, timeout=20)
        # one conversation (its first KiB shared), so that the decode profile's
        # spreading of new conversations stays out of it: the first request
        # is placed by the devices alone, and the rest follow it there
        for i in range(6):
            r = httpx.post(router.url + "/v1/completions", timeout=30, json={
                "model": MODEL, "prompt": "chapter one " * 100 + f"part {i}", "max_tokens": 2})
            assert r.status_code == 200, r.text
            assert r.headers["x-toposerve-prefill-endpoint"] == ep["p"]
            assert r.headers["x-toposerve-endpoint"] == ep["near"], (
                f"decoded on {'far' if r.headers['x-toposerve-endpoint'] == ep['far'] else '?'}")
        assert router.metric("toposerve_router_pd_pairs_total", tier="same_node") == 6
