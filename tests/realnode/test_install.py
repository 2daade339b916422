"""The whole install, the chart as a Helm release, on the real node
(docs/install.md, docs/real-node.md): the images of `make image` imported,
never pulled; the install on an empty cluster finishing, its router
answering 503 until a model server comes, then serving; the GPU driver's
DaemonSet pod registered with the real kubelet, its slices written under
its service account; a claim prepared for a pod and unprepared; a rolling
restart of the driver under a running claim; the router replicas
(active-active) and their Redis on the node's loopback in front of
simulator pods, each serving, a Responses chain moving between them, one
serving on while the other's pod is deleted; a values change through
``helm upgrade`` rolling the replicas under a stream in flight, ``helm rollback`` to the
values before; and ``helm uninstall`` leaving no release, slice, socket, CDI
spec or object of ours but those it keeps on purpose.

The tests share one install (module fixture) and run in file order: the
upgrade, rollback and uninstall tests build on the revisions before them."""

from __future__ import annotations

import contextlib
import random
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.images import make_images
from harness.waiting import wait_for
from tests.conftest import Cluster
from tests.realnode.conftest import (
    PodMaker,
    delete_kept,
    drop_failed_release,
    ensure_started,
    example_on_real_node,
    host_url,
    labelled_objects,
    router_replicas,
    sim_pod,
    wait_phase,
)
from toposerve.dra_driver.gpu.driver import CDI_CLASS, CDI_VENDOR
from toposerve.dra_driver.kubeletplugin.cdi import CdiSpecs
from toposerve.dra_driver.simulate import LABELS as SIM_LABELS
from toposerve.dra_driver.simulate import Simulator
from toposerve.localcluster import install as inst
from toposerve.localcluster.nodes import KWOK_ANNOTATION, KWOK_TOLERATION
from toposerve.localcluster.ports import free_port
from toposerve.localcluster.realnode.gpu_driver import CDI_ROOT, DRIVER, PLUGIN_DIR
from toposerve.localcluster.realnode.paths import (
    NODE_NAME,
    default_layout,
)
from toposerve.localcluster.realnode.pods import busybox_pod
from toposerve.localcluster.realnode.tools import find_node_tools
from toposerve.manifests.chart import RELEASE, helm_values
from toposerve.scheduler_ext.placement.levels import domain_of, parse_level
from toposerve.scheduler_ext.state.facts import PLACEMENT_ANNOTATION
from toposerve.topology.labels import PRESETS, PROFILE_LABEL, DialectName, from_labels
from toposerve.topology.workloads import GROUP, GROUP_SIZE, LEVEL, ROLE

pytestmark = [pytest.mark.cluster, pytest.mark.realnode]

PREFIX = "rn-install"  # namespace and name prefix: nothing shared with other tests
# the router in a namespace of its own, as by default (a Namespace the chart
# makes and uninstall keeps)
ROUTER_NS = f"{PREFIX}-router"
GPU_CLASS = "rn-install-gpu.toposerve.io"
TEMPLATE = "rn-install-one-gpu"
REGISTRY = Path("/var/lib/kubelet/plugins_registry")
SELECTOR = "app.kubernetes.io/component=gpu-driver"
# the model servers: two `toposerve sim` pods of the installed image, found
# by the router's pod discovery by this label, on the node's loopback; on
# the host network both have the node's IP, so the router takes each one's
# port from its container port named "http" (discovery's portName)
SIM = "rn-install-sim"
SIM_MODEL = "rn-install/sim"
SIM_PORTS = {f"{SIM}-{i}": free_port() for i in range(2)}
CONFIG_HASH = "toposerve.io/config-hash"  # on the router's pods: its RouterConfig's


@dataclass
class Stack:
    cluster: Cluster
    core: Any
    apps: Any
    res: Any
    installed: inst.Installed
    cdi: CdiSpecs
    image: str  # the installed toposerve image: the model servers run it too
    uninstalled: bool = False


def _delete_sims(core: Any) -> None:
    for name in SIM_PORTS:
        with contextlib.suppress(ApiException):
            core.delete_namespaced_pod(name, "default", grace_period_seconds=1)


def _sim_pods(core: Any) -> list[Any]:
    return list(core.list_namespaced_pod("default", label_selector=f"app={SIM}").items)


def _start_sims(s: Stack) -> None:
    """The two model servers, unless they run."""
    have = {p.metadata.name for p in _sim_pods(s.core)}
    for name, port in SIM_PORTS.items():
        if name not in have:
            s.core.create_namespaced_pod("default", sim_pod(s.image, name, port, SIM, SIM_MODEL))


@pytest.fixture(scope="module")
def stack(real_node_cluster: Cluster) -> Iterator[Stack]:
    """The install on a cluster without model servers (they come in the
    first test): ``cluster up --install``'s, names prefixed."""
    ensure_started(real_node_cluster)
    core: Any = client.CoreV1Api(real_node_cluster.api)
    # this tree's images (an archive built from older code under the same tag
    # would run that code)
    images = make_images()
    image = next(ref for ref in images if inst._image_name(ref) == "toposerve")
    lines: list[str] = []
    try:
        installed = inst.install(real_node_cluster.name, sets=[
            f"namespace={PREFIX}", f"router.namespace={ROUTER_NS}", f"namePrefix={PREFIX}",
            f"deviceClasses.gpu={GPU_CLASS}",
            "deviceClasses.nic=rn-install-nic.toposerve.io",
            "deviceClasses.rdmaNic=rn-install-rdma-nic.toposerve.io",
            "deviceClasses.gpuShare=rn-install-gpu-share.toposerve.io",
            f"router.config.discovery.kubernetes.labelSelector=app={SIM}",
            "router.config.discovery.kubernetes.portName=http",
            "router.apiKeys.enabled=false"], progress=lines.append)
    except BaseException:
        drop_failed_release(real_node_cluster.name, PREFIX)
        raise
    finally:
        print("\n".join(lines))  # the progress lines and the time it took, in -s output
    res: Any = client.ResourceV1Api(real_node_cluster.api)
    res.create_namespaced_resource_claim_template("default", {
        "metadata": {"name": TEMPLATE},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": GPU_CLASS}}]}}}})
    s = Stack(cluster=real_node_cluster, core=core,
              apps=client.AppsV1Api(real_node_cluster.api), res=res, installed=installed,
              cdi=CdiSpecs(CDI_ROOT, CDI_VENDOR, CDI_CLASS), image=image)
    try:
        yield s
    finally:
        with contextlib.suppress(ApiException):
            res.delete_namespaced_resource_claim_template(TEMPLATE, "default")
        _delete_sims(core)
        if not s.uninstalled:
            inst.uninstall(real_node_cluster.name, installed.values)
        delete_kept(core, installed.values, PREFIX)


@pytest.fixture
def sims(stack: Stack) -> None:
    """The model servers running (the first test made them; again if it did not run)."""
    _start_sims(stack)


def _driver_pods(s: Stack) -> list[Any]:
    return list(s.core.list_namespaced_pod(PREFIX, label_selector=SELECTOR).items)


def _gpus(s: Stack) -> list[Any]:
    return list(s.res.list_resource_slice(
        field_selector=f"spec.nodeName={NODE_NAME},spec.driver={DRIVER}").items)


def _sockets() -> list[Path]:
    return sorted([*REGISTRY.glob(f"{DRIVER}*"), *PLUGIN_DIR.glob("*.sock")])


def _gpu_pod(s: Stack, make_pod: PodMaker, name: str) -> tuple[str, str]:
    """A busybox pod with one GPU claim, Running; its name and claim UID."""
    make_pod(busybox_pod(name, "env; ls /dev; sleep 3600",
                         claims=[{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}]))
    pod = wait_phase(s.core, name, {"Running"})
    claim = s.res.read_namespaced_resource_claim(
        pod.status.resource_claim_statuses[0].resource_claim_name, "default")
    return name, str(claim.metadata.uid)


def _delete_and_wait_unprepared(s: Stack, name: str, claim_uid: str) -> None:
    s.core.delete_namespaced_pod(name, "default", grace_period_seconds=1)
    wait_for(f"pod {name} gone", lambda: not s.core.list_namespaced_pod(
        "default", field_selector=f"metadata.name={name}").items, timeout=60)
    assert not s.cdi.path(claim_uid).exists()


def _workloads(s: Stack) -> list[dict[str, Any]]:
    return [o for o in s.installed.objects if o["kind"] in inst.WORKLOADS]


def test_install_on_an_empty_cluster_serves_once_a_model_server_comes(stack: Stack) -> None:
    """No model server runs when the install starts: it still ends with
    every workload available (the fixture waited for that; read again
    here), and the router answers a clear 503 until a simulator pod comes,
    then serves."""
    assert not _sim_pods(stack.core), "the model servers come in this test, not before"
    inst.wait_available(stack.cluster.api, _workloads(stack), timeout_s=1)
    urls = [host_url(p) for p in router_replicas(stack.core, ROUTER_NS).values()]
    for url in urls:  # every replica serves, with no model server too
        r = _chat(url, model=None)  # any model: none is served yet
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert error["type"] == "ServiceUnavailable" and "no ready endpoint" in error["message"]
        r = _chat(url)  # a model no server serves yet: as vLLM answers an unknown one
        assert r.status_code == 404 and r.json()["error"]["param"] == "model", r.text
        # a load balancer's check says the same; the pod probe says warm
        assert httpx.get(url + "/ready", timeout=5).status_code == 503
        assert httpx.get(url + "/ready?role=any", timeout=5).status_code == 200
    _start_sims(stack)
    started = time.monotonic()
    wait_for("every router replica serving the model servers", lambda: all(
        _serves(url) for url in urls), timeout=90, interval=0.5)
    print(f"router: 503 until the model servers came; served {time.monotonic() - started:.1f}s "
          "after their pods were created")


def test_images_imported_and_never_pulled(stack: Stack) -> None:
    tools = find_node_tools()
    layout = default_layout()
    listed = subprocess.run([str(tools.ctr), "--address", str(layout.containerd_socket), "-n",
                             "k8s.io", "images", "ls", "-q"], capture_output=True, text=True,
                            check=True).stdout.split()
    assert set(inst.built_images()) <= set(listed)
    log = (layout.logs / "containerd.log").read_text()
    assert "PullImage" not in log and "resolving" not in log and "fetch" not in log.lower()
    # every container's image is one imported, never pulled; every container
    # that may use the API gets the loopback address, not the service range
    v = stack.installed.values
    for obj in stack.installed.objects:
        pod = ((obj.get("spec") or {}).get("template") or {}).get("spec")
        if not pod:
            continue
        assert pod["hostNetwork"] is True, obj["metadata"]["name"]
        for c in pod["containers"] + pod.get("initContainers", []):
            assert c["imagePullPolicy"] == "Never" and c["image"] in listed, c["name"]
        if pod.get("automountServiceAccountToken") is False:
            continue  # Redis: no token, no API
        for c in pod["containers"]:
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            assert v.api_server is not None
            assert env["KUBERNETES_SERVICE_HOST"] == v.api_server.host == "127.0.0.1"
            assert env["KUBERNETES_SERVICE_PORT"] == str(v.api_server.port)


def test_every_workload_available_on_the_real_node_only(stack: Stack) -> None:
    status = inst.install_status(stack.cluster.api, [PREFIX, ROUTER_NS])
    kinds = {(c["kind"], c["component"]): c for c in status["components"]}
    assert set(kinds) == {("DaemonSet", "gpu-driver"), ("Deployment", "extender"),
                          ("Deployment", "scheduler"), ("Deployment", "router"),
                          ("Deployment", "router-redis")}
    # the router pair: a Deployment per replica, each on a port of its own
    assert sorted(c["name"] for c in status["components"] if c["component"] == "router") == [
        f"{PREFIX}-router-0", f"{PREFIX}-router-1"]
    for c in status["components"]:
        assert c["available"], c
        assert c["pods"] and all(p["node"] == NODE_NAME and p["phase"] == "Running"
                                 for p in c["pods"]), c
    # kwok nodes run no driver pod: they keep their simulated slices
    nodes = stack.core.list_node().items
    assert any(KWOK_ANNOTATION in (n.metadata.annotations or {}) for n in nodes)
    ds = stack.apps.read_namespaced_daemon_set(f"{PREFIX}-gpu-driver", PREFIX)
    assert ds.status.desired_number_scheduled == 1


def test_driver_pod_registers_and_publishes_its_nodes_slices(stack: Stack) -> None:
    pod, = _driver_pods(stack)
    # the pod-UID socket mode: the registration socket carries the pod's UID
    wait_for("the pod's registration socket", lambda: any(
        pod.metadata.uid in p.name for p in REGISTRY.glob(f"{DRIVER}*")), timeout=30)

    def kubelet_registered() -> bool:
        log = (default_layout().logs / "kubelet.log").read_text()
        return f'driverName="{DRIVER}"' in log and "connected=true" in log

    wait_for("the kubelet to register the pod's driver", kubelet_registered, timeout=30)
    wait_for("8 GPUs published", lambda: sum(
        len(x.spec.devices or []) for x in _gpus(stack)) >= 8, timeout=60)
    # written by the pod's service account: its field manager, under the
    # own-node policy (bound to exactly that account)
    policy: Any = client.AdmissionregistrationV1Api(stack.cluster.api)
    got = policy.read_validating_admission_policy(f"{PREFIX}-resourceslices-own-node")
    assert f"system:serviceaccount:{PREFIX}:{PREFIX}-gpu-driver" in str(got.spec)


def test_claim_pod_sees_the_cdi_edits_and_unprepares(stack: Stack, make_pod: PodMaker) -> None:
    name, claim_uid = _gpu_pod(stack, make_pod, "rn-install-gpu")

    def log_shows() -> bool:
        log = stack.core.read_namespaced_pod_log(name, "default")
        return "NVIDIA_VISIBLE_DEVICES=" in log and "nvidiactl" in log

    wait_for("the CDI edits in the container's env", log_shows, timeout=30)
    assert stack.cdi.path(claim_uid).exists()
    _delete_and_wait_unprepared(stack, name, claim_uid)


def test_rolling_restart_under_a_running_claim(stack: Stack, make_pod: PodMaker) -> None:
    name, claim_uid = _gpu_pod(stack, make_pod, "rn-install-roll")
    old, = _driver_pods(stack)
    stack.apps.patch_namespaced_daemon_set(f"{PREFIX}-gpu-driver", PREFIX, {
        "spec": {"template": {"metadata": {"annotations": {
            "kubectl.kubernetes.io/restartedAt": "rn-install-test"}}}}})

    def replaced() -> bool:
        pods = _driver_pods(stack)
        return (len(pods) == 1 and pods[0].metadata.uid != old.metadata.uid
                and pods[0].status.phase == "Running"
                and all(c.ready for c in pods[0].status.container_statuses or []))

    wait_for("the driver pod replaced", replaced, timeout=120)
    inst.wait_available(stack.cluster.api, [o for o in stack.installed.objects
                                            if o["kind"] == "DaemonSet"], timeout_s=60)
    new, = _driver_pods(stack)
    wait_for("only the new pod's sockets", lambda: any(
        new.metadata.uid in p.name for p in _sockets()) and not any(
        old.metadata.uid in p.name for p in _sockets()), timeout=30)
    assert stack.core.read_namespaced_pod(name, "default").status.phase == "Running"
    assert stack.cdi.path(claim_uid).exists()
    _delete_and_wait_unprepared(stack, name, claim_uid)


def _chat(url: str, model: str | None = SIM_MODEL) -> httpx.Response:
    return httpx.post(url + "/v1/chat/completions", timeout=10, json={
        "model": model, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]})


def _serves(url: str) -> bool:
    """A chat answered 200; a replica not listening yet (Running, still
    starting) does not."""
    try:
        return _chat(url).status_code == 200
    except httpx.TransportError:
        return False


def _healthy_endpoints(router: str) -> set[str]:
    text = httpx.get(router + "/metrics", timeout=5).text
    return {line.split('"')[1] for line in text.splitlines()
            if line.startswith("toposerve_router_endpoint_healthy{") and line.endswith(" 1.0")}


@pytest.mark.usefixtures("sims")
def test_router_replicas_all_serve_and_one_goes_on_when_the_other_is_lost(stack: Stack
                                                                         ) -> None:
    """Active-active, the install's default: both replicas serve (neither a
    standby), share the Responses store and the routing view over the one
    Redis, and one serves on, its view whole, while the other's pod is
    deleted and its Deployment brings a new one."""
    by_replica = router_replicas(stack.core, ROUTER_NS)
    first, second = (host_url(by_replica[i]) for i in sorted(by_replica))
    assert inst.install_status(stack.cluster.api, [PREFIX, ROUTER_NS])["routerURL"] in {
        first, second}
    # both model servers, one IP and a port each, are found and healthy by each
    want = {f"127.0.0.1:{p}" for p in SIM_PORTS.values()}
    for url in (first, second):
        wait_for(f"both model servers healthy behind {url}",
                 partial(lambda u: _healthy_endpoints(u) == want, url), timeout=20)
        assert httpx.get(url + "/ready", timeout=5).status_code == 200  # no standby
        r = _chat(url)
        assert r.status_code == 200, r.text
        assert r.headers["X-Toposerve-Endpoint"] in want
    # a Responses chain begun on one replica goes on on the other: one
    # Redis, on the node's loopback, with the password of the Secret
    turn = httpx.post(first + "/v1/responses", timeout=10, json={
        "model": SIM_MODEL, "input": "hi", "max_output_tokens": 2})
    assert turn.status_code == 200, turn.text
    nxt = httpx.post(second + "/v1/responses", timeout=10, json={
        "model": SIM_MODEL, "input": "and then?", "max_output_tokens": 2,
        "previous_response_id": turn.json()["id"]})
    assert nxt.status_code == 200, nxt.text
    got = httpx.get(f"{first}/v1/responses/{nxt.json()['id']}", timeout=5)
    assert got.status_code == 200, got.text

    lost, kept = by_replica[sorted(by_replica)[0]], by_replica[sorted(by_replica)[1]]
    stack.core.delete_namespaced_pod(lost.metadata.name, ROUTER_NS)
    deleted = time.monotonic()
    answered = []
    while time.monotonic() - deleted < 5:  # the other serves on meanwhile
        answered.append(_chat(second).status_code)
    assert set(answered) == {200}, answered
    assert _healthy_endpoints(second) == want
    now = router_replicas(stack.core, ROUTER_NS, timeout=120)
    assert kept.metadata.uid in {p.metadata.uid for p in now.values()}  # not restarted
    assert lost.metadata.uid not in {p.metadata.uid for p in now.values()}
    wait_for("the new replica serving", lambda: _serves(host_url(now[sorted(now)[0]])),
             timeout=60, interval=0.5)
    print(f"router replica lost: the other answered {len(answered)} requests in the 5 s "
          "after its pod was deleted, all 200")


# -- the second scheduler and the extender place groups whole (kwok nodes) --

PLACE = "rn-install-place"  # the namespace of the placed groups and their templates
WHOLE_GPU = "device.attributes['gpu.toposerve.io'].type == 'gpu'"
DIALECT = PRESETS[DialectName.TOPOSERVE]


@dataclass(frozen=True)
class Group:
    name: str
    profile: str
    roles: tuple[tuple[str, int], ...]  # (role, pods); role "" for a wide-EP gang
    gpus: int  # per pod, whole GPUs
    level: str  # required topology level

    def pods(self) -> list[tuple[str, str]]:
        return [(f"{self.name}-{role + '-' if role else ''}{i}", role)
                for role, n in self.roles for i in range(n)]


# the session's cluster has one GB200 rack (18 trays) and one HGX rack of 4
# nodes, each its own NVLink domain: the P/D set must share one node
GROUPS = (Group("wide-ep", "gb200-nvl72", (("", 4),), 4, "rack"),
          Group("pd", "hgx-h100", (("prefill", 1), ("decode", 2)), 2, "nvlink"))


@pytest.fixture
def kwok_gpus(stack: Stack) -> Iterator[Simulator]:
    """``driver simulate``'s GPU slices for every kwok node and a namespace
    for the groups; the namespace (pods, claims) and the slices gone after."""
    sim = Simulator(stack.cluster.api, drivers=(DRIVER,), sync_delay=0.2)
    sim.start()
    try:
        wait_for("driver simulate's slices for every kwok node", sim.ready, timeout=120,
                 interval=0.5)
        stack.core.create_namespace({"metadata": {"name": PLACE}})
        wait_for("the namespace's default service account", lambda: stack.core.
                 list_namespaced_service_account(PLACE, field_selector="metadata.name=default"
                                                 ).items, timeout=60)
        yield sim
    finally:
        with contextlib.suppress(ApiException):
            stack.core.delete_namespace(PLACE, grace_period_seconds=0)
        wait_for(f"namespace {PLACE} gone", lambda: not stack.core.list_namespace(
            field_selector=f"metadata.name={PLACE}").items, timeout=120)
        sim.stop()
        sim.uninstall()
        selector = ",".join(f"{k}={v}" for k, v in SIM_LABELS.items())
        wait_for("the simulated slices gone", lambda: not stack.res.list_resource_slice(
            label_selector=selector).items, timeout=60)


def _kwok_pod(g: Group, name: str, role: str, scheduler: str) -> dict[str, Any]:
    labels = {"app": PLACE, GROUP: g.name, GROUP_SIZE: str(len(g.pods())), LEVEL: g.level}
    if role:
        labels[ROLE] = role
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"schedulerName": scheduler, "tolerations": [KWOK_TOLERATION],
                     "nodeSelector": {PROFILE_LABEL: g.profile},
                     "containers": [{"name": "main", "image": "vllm/vllm-openai",
                                     "resources": {"claims": [{"name": "gpu"}]}}],
                     "resourceClaims": [{"name": "gpu",
                                         "resourceClaimTemplateName": f"gpus-{g.gpus}"}]}}


def _placed(s: Stack, count: int) -> list[Any]:
    """Every group pod, once all are Running (kwok's word for bound) and
    each group carries the extender's decision (written just after it
    answers the filter call)."""
    pods = s.core.list_namespaced_pod(PLACE, label_selector=f"app={PLACE}").items
    decided = {p.metadata.labels[GROUP] for p in pods
               if PLACEMENT_ANNOTATION in (p.metadata.annotations or {})}
    ok = (len(pods) == count and all(p.status.phase == "Running" for p in pods)
          and decided == {g.name for g in GROUPS})
    return list(pods) if ok else []


def _scheduling_events(s: Stack) -> str:
    evs = s.core.list_namespaced_event(PLACE, field_selector="reason=FailedScheduling").items
    return "; ".join(f"{e.involved_object.name}: {e.message}" for e in evs[-6:]) or "(none)"


def test_second_scheduler_and_extender_place_groups_whole(stack: Stack, kwok_gpus: Simulator
                                                          ) -> None:
    scheduler = stack.installed.values.scheduler.scheduler_name
    for gpus in {g.gpus for g in GROUPS}:
        stack.res.create_namespaced_resource_claim_template(PLACE, {
            "metadata": {"name": f"gpus-{gpus}"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": GPU_CLASS, "count": gpus,
                "selectors": [{"cel": {"expression": WHOLE_GPU}}]}}]}}}})
    # the groups' pods interleaved, as controllers of two workloads would make them
    pods = [(g, name, role) for g in GROUPS for name, role in g.pods()]
    random.Random(28).shuffle(pods)
    for g, name, role in pods:
        stack.core.create_namespaced_pod(PLACE, _kwok_pod(g, name, role, scheduler))
    try:
        got = wait_for(f"{len(pods)} pods bound by {scheduler} and Running on kwok nodes",
                       lambda: _placed(stack, len(pods)), timeout=120, interval=0.5)
    except AssertionError as err:
        raise AssertionError(f"{err}; scheduler events: {_scheduling_events(stack)}") from None
    nodes = {n.metadata.name: n for n in stack.core.list_node().items}
    for g in GROUPS:
        mine = [p for p in got if p.metadata.labels[GROUP] == g.name]
        where = {p.spec.node_name for p in mine}
        # kwok nodes only: no pod of the real node's, whose DaemonSets they do not run
        assert all(KWOK_ANNOTATION in (nodes[n].metadata.annotations or {}) for n in where)
        tier = parse_level(g.level, DIALECT)
        domains = {domain_of(from_labels(n, nodes[n].metadata.labels, DIALECT), tier)
                   for n in where}
        decision = next(orjson.loads(p.metadata.annotations[PLACEMENT_ANNOTATION])
                        for p in mine if PLACEMENT_ANNOTATION in (p.metadata.annotations or {}))
        assert domains == {tuple(decision["domain"])}, (g.name, where, decision)
        assert decision["required"] and decision["level"] == g.level
        assert all(p.spec.scheduler_name == scheduler for p in mine)


# -- the cookbook's claims on the real node, against the installed driver --

EXAMPLE = f"{PREFIX}-example"  # the examples' names' prefix: none is the fixture's TEMPLATE


def _example_on_real_node(s: Stack, make_pod: PodMaker, file: str) -> tuple[Any, str]:
    """An example on the real node against the installed GPU class
    (``example_on_real_node``): its claim and pod name, the pod Running."""
    got = example_on_real_node(s.core, s.res, make_pod, file, EXAMPLE,
                               {"gpu.toposerve.io": GPU_CLASS})
    claim = s.res.read_namespaced_resource_claim(
        got.status.resource_claim_statuses[0].resource_claim_name, "default")
    return claim, str(got.metadata.name)


def _allocated(s: Stack, claim: Any) -> dict[str, str]:
    """The string attributes of the claim's one device, as the node's slices publish it."""
    result, = claim.status.allocation.devices.results
    assert result.driver == DRIVER and result.pool == NODE_NAME
    device = next(d for x in _gpus(s) for d in x.spec.devices or [] if d.name == result.device)
    return {k: v.string for k, v in device.attributes.items() if v.string is not None}


def _cdi_env(s: Stack, claim_uid: str) -> dict[str, str]:
    """The env the claim's CDI spec adds: spec-wide and per device."""
    spec = orjson.loads(s.cdi.path(claim_uid).read_bytes())
    edits = [spec.get("containerEdits") or {}, *(d["containerEdits"] for d in spec["devices"])]
    return dict(e.split("=", 1) for x in edits for e in x.get("env") or [])


def _log(s: Stack, name: str, line: str) -> list[str]:
    got: list[str] = wait_for(f"{line!r} in the log of {name}", lambda: (
        lines if line in (lines := s.core.read_namespaced_pod_log(name, "default").splitlines())
        else []), timeout=30)
    return got


@pytest.fixture
def cleanup_templates(stack: Stack) -> Iterator[None]:
    yield
    for t in stack.res.list_namespaced_resource_claim_template("default").items:
        if t.metadata.name.startswith(f"{EXAMPLE}-"):
            with contextlib.suppress(ApiException):
                stack.res.delete_namespaced_resource_claim_template(t.metadata.name, "default")


@pytest.mark.usefixtures("cleanup_templates")
def test_example_01_one_gpu_on_the_real_node(stack: Stack, make_pod: PodMaker) -> None:
    claim, name = _example_on_real_node(stack, make_pod, "01-one-gpu.yaml")
    assert _allocated(stack, claim)["type"] == "gpu"
    env = _cdi_env(stack, claim.metadata.uid)
    assert env["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-")
    # the example's own command: `env | grep -E 'VISIBLE_DEVICES|TOPOSERVE_'`
    wanted = sorted(f"{k}={v}" for k, v in env.items()
                    if re.search("VISIBLE_DEVICES|TOPOSERVE_", k))
    lines = _log(stack, name, wanted[0])
    assert set(wanted) <= set(lines), (wanted, lines)
    _delete_and_wait_unprepared(stack, name, claim.metadata.uid)


@pytest.mark.usefixtures("cleanup_templates")
def test_example_06_partition_on_the_real_node(stack: Stack, make_pod: PodMaker) -> None:
    # the stand-in H100s publish their partitions; the example's profile is one of them
    profiles = {d.attributes["profile"].string for x in _gpus(stack) for d in x.spec.devices or []
                if "profile" in d.attributes}
    assert "1g.10gb" in profiles, profiles
    claim, name = _example_on_real_node(stack, make_pod, "06-gpu-partition.yaml")
    device = _allocated(stack, claim)
    assert (device["type"], device["profile"]) == ("mig", "1g.10gb")
    env = _cdi_env(stack, claim.metadata.uid)
    assert env["CUDA_VISIBLE_DEVICES"].startswith("MIG-")
    _log(stack, name, env["CUDA_VISIBLE_DEVICES"])  # `echo $CUDA_VISIBLE_DEVICES`
    _delete_and_wait_unprepared(stack, name, claim.metadata.uid)

# -- helm upgrade with a values change, helm rollback, helm uninstall --

# a router-only values change: the RouterConfig's hash on its pods rolls the pair
HEALTH_EVERY = "router.config.scrape.healthIntervalSeconds=4"
STREAM_TOKENS = 500  # at the simulator's 20 ms a token, some 10 s: across the roll


def _router_workloads(s: Stack) -> list[dict[str, Any]]:
    return [o for o in _workloads(s) if o["metadata"]["namespace"] == ROUTER_NS
            and o["metadata"]["labels"][inst.COMPONENT_LABEL] == "router"]


def _stream(url: str, got: dict[str, Any], first: threading.Event) -> None:
    """A streamed chat of STREAM_TOKENS tokens: its status, its data lines
    and when it ended into ``got`` (or the error that cut it)."""
    lines: list[str] = []
    try:
        with httpx.stream("POST", url + "/v1/chat/completions", timeout=60, json={
                "model": SIM_MODEL, "max_tokens": STREAM_TOKENS, "stream": True,
                "ignore_eos": True, "messages": [{"role": "user", "content": "hi"}]}) as r:
            got["status"] = r.status_code
            for line in r.iter_lines():
                if line.startswith("data: "):
                    lines.append(line.removeprefix("data: "))
                    first.set()
    except httpx.HTTPError as err:
        got["error"] = repr(err)
    finally:
        got["lines"], got["ended"] = lines, time.monotonic()
        first.set()


@pytest.mark.usefixtures("sims")
def test_a_values_change_rolls_the_router_replicas_without_dropping_a_stream(
        stack: Stack) -> None:
    """``helm upgrade`` with a router setting changed rolls both router
    pods (Recreate: each holds its port on the node); a stream in flight to
    a replica when its pod is told to stop runs to its end (the router
    drains in-flight requests on SIGTERM)."""
    by_replica = router_replicas(stack.core, ROUTER_NS)
    old = by_replica[sorted(by_replica)[0]]
    url = host_url(old)
    want = {f"127.0.0.1:{p}" for p in SIM_PORTS.values()}
    wait_for("both model servers healthy behind the replica",
             lambda: _healthy_endpoints(url) == want, timeout=30)
    got: dict[str, Any] = {}
    first = threading.Event()
    streaming = threading.Thread(target=_stream, args=(url, got, first), daemon=True)
    streaming.start()
    assert first.wait(15) and "error" not in got, got
    inst.helm_install(stack.cluster.name, inst.with_sets(stack.installed.values,
                                                         [HEALTH_EVERY]))

    def stopping() -> bool:
        pod = stack.core.list_namespaced_pod(
            ROUTER_NS, field_selector=f"metadata.name={old.metadata.name}").items
        return not pod or pod[0].metadata.deletion_timestamp is not None

    wait_for("the replica's pod told to stop", stopping, timeout=30, interval=0.05)
    told = time.monotonic()
    streaming.join(60)
    assert "error" not in got and got.get("status") == 200, got
    assert got["ended"] > told, "the stream ended before its replica's pod was told to stop"
    assert got["lines"][-1] == "[DONE]"
    chunks = [orjson.loads(x) for x in got["lines"][:-1]]
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]
            and c["choices"][0].get("finish_reason")] == ["length"]
    print(f"router roll: the stream ran {got['ended'] - told:.1f}s past its router's stop")
    inst.wait_available(stack.cluster.api, _router_workloads(stack), timeout_s=120)
    now = router_replicas(stack.core, ROUTER_NS, timeout=120)
    assert not {p.metadata.uid for p in now.values()} & {
        p.metadata.uid for p in by_replica.values()}
    cm = stack.core.read_namespaced_config_map(f"{PREFIX}-router", ROUTER_NS)
    assert all("healthIntervalSeconds: 4" in text for text in cm.data.values()), cm.data
    assert all(_chat(host_url(p)).status_code == 200 for p in now.values())


def _rendered(s: Stack, kind: str, name: str) -> dict[str, Any]:
    return next(o for o in s.installed.objects
                if o["kind"] == kind and o["metadata"]["name"] == name)


@pytest.mark.usefixtures("sims")
def test_rollback_to_the_revision_before(stack: Stack) -> None:
    """``helm rollback`` after the values change: a new revision in the
    history, the workloads available again with the values before (the
    router's config and its pods' config hash as the first install rendered
    them), serving."""
    values = stack.installed.values
    if len(inst.history(stack.cluster.name, values)) < 2:  # run without the test before
        inst.helm_install(stack.cluster.name, inst.with_sets(values, [HEALTH_EVERY]))
    before = inst.history(stack.cluster.name, values)
    inst.rollback(stack.cluster.name, values)
    after = inst.history(stack.cluster.name, values)
    last = after[-1]
    assert len(after) == len(before) + 1 and last["status"] == "deployed", after
    assert last["description"] == f"Rollback to {before[-2]['revision']}", last
    assert [r["status"] for r in after[:-1]] == ["superseded"] * len(before), after
    inst.wait_available(stack.cluster.api, _workloads(stack), timeout_s=120)
    got = orjson.loads(inst.helm(stack.cluster.name, [
        "get", "values", RELEASE, "--namespace", PREFIX, "--output", "json"]))
    assert got == helm_values(values)
    cm = stack.core.read_namespaced_config_map(f"{PREFIX}-router", ROUTER_NS)
    assert cm.data == _rendered(stack, "ConfigMap", f"{PREFIX}-router")["data"]
    routers = router_replicas(stack.core, ROUTER_NS, timeout=120)
    for pod in routers.values():
        deployment = f"{PREFIX}-router-{pod.metadata.labels['toposerve.io/router-replica']}"
        want = _rendered(stack, "Deployment", deployment)["spec"]["template"]["metadata"][
            "annotations"][CONFIG_HASH]
        assert pod.metadata.annotations[CONFIG_HASH] == want, deployment
    wait_for("every replica serving", lambda: all(
        _serves(host_url(p)) for p in routers.values()), timeout=30)


def test_uninstall_leaves_only_what_it_keeps(stack: Stack) -> None:
    """``helm uninstall`` (and the host cleanups): no release, no slice,
    plugin socket or CDI spec of the driver, no object of the release but
    those the chart keeps on purpose: the generated Secrets and the
    router's Namespace (docs/install.md; the fixture deletes them after)."""
    values = stack.installed.values
    inst.uninstall(stack.cluster.name, values)
    stack.uninstalled = True
    assert not [r for r in inst.releases(stack.cluster.name) if r["name"] == RELEASE]
    assert not _gpus(stack)
    assert not _driver_pods(stack)
    assert not _sockets()
    assert not list(CDI_ROOT.glob(f"{CDI_VENDOR}_{CDI_CLASS}-*"))
    assert inst.install_status(stack.cluster.api, [PREFIX, ROUTER_NS])["components"] == []
    kept = inst.kept_objects(values)
    assert sorted(o["kind"] for o in kept) == ["Namespace", "Secret", "Secret"], kept
    assert all((o["metadata"].get("annotations") or {}).get("toposerve.io/generated") == "true"
               for o in kept if o["kind"] == "Secret")
    assert [o["metadata"]["name"] for o in kept if o["kind"] == "Namespace"] == [ROUTER_NS]
    left = labelled_objects(stack.cluster.api, f"app.kubernetes.io/instance={PREFIX}")
    assert left == sorted(f"{o['kind']} {o['metadata'].get('namespace', '')}/"
                          f"{o['metadata']['name']}" for o in kept)
