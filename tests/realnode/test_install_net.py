"""The NIC driver's DaemonSet from the install on the real node
(docs/install.md, docs/net-handoff.md): on a node whose pod network does not
chain the NIC hand-off yet and has no forwarder, the pod's init container
installs ``toposerve-nic`` (the image's binary) into the node's CNI bin dir
and chains it into the node's conflist; the driver publishes the node's
stand-in NICs (``toposerve.localcluster.realnode.nics``, found through the same fake
sysfs tree the GPU driver reads); the cookbook's GPU + NIC on one PCIe root
(examples/04) runs with the NIC moved into the pod's network namespace; and
``helm upgrade`` from the chart's previous version to this tree's rolls both
drivers while a GPU claim pod and a NIC claim pod run, both staying
prepared, and both unprepare cleanly after; ``helm uninstall`` puts the
conflist back byte for byte and removes the forwarder, leaving no release,
slice, socket or object of the release.

The release's first revision is the chart's previous version
(``previous_chart``: this tree's chart with a lower version, the only
difference); the tests run in file order and the upgrade test moves it to
this tree's chart."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.dra_net import canonical, net_config
from harness.images import make_images
from harness.waiting import wait_for
from tests.conftest import Cluster
from tests.realnode.conftest import (
    PodMaker,
    drop_failed_release,
    ensure_started,
    example_on_real_node,
    labelled_objects,
    on_host_as_it_was,
    previous_chart,
    wait_phase,
)
from toposerve.dra_driver.gpu.driver import CDI_CLASS as GPU_CDI_CLASS
from toposerve.dra_driver.gpu.driver import CDI_VENDOR as GPU_CDI_VENDOR
from toposerve.dra_driver.kubeletplugin.cdi import CdiSpecs
from toposerve.dra_driver.kubeletplugin.checkpoint import Checkpoint, ClaimState, read_boot_id
from toposerve.dra_driver.net.driver import CDI_CLASS as NIC_CDI_CLASS
from toposerve.dra_driver.net.driver import CDI_VENDOR as NIC_CDI_VENDOR
from toposerve.dra_driver.net.handoff.cni import PLUGIN_TYPE
from toposerve.dra_driver.net.handoff.install import RECORD, data_dir, plugin_entry
from toposerve.dra_driver.net.handoff.journal import Journal
from toposerve.dra_driver.net.handoff.links import Namespace
from toposerve.kubeapi import JsonApi
from toposerve.localcluster import install as inst
from toposerve.localcluster.realnode import forwarder, nics
from toposerve.localcluster.realnode.gpu_driver import CDI_ROOT
from toposerve.localcluster.realnode.gpu_driver import DRIVER as GPU_DRIVER
from toposerve.localcluster.realnode.gpu_driver import PLUGIN_DIR as GPU_PLUGIN_DIR
from toposerve.localcluster.realnode.net_driver import DRIVER, JOURNAL_DIR, PLUGIN_DIR, STATE_DIR
from toposerve.localcluster.realnode.paths import NODE_NAME, Layout, default_layout
from toposerve.localcluster.realnode.pods import busybox_pod
from toposerve.manifests.chart import RELEASE

pytestmark = [pytest.mark.cluster, pytest.mark.realnode]

PREFIX = "rn-install-net"  # namespace and name prefix: nothing shared with other tests
CLASSES = {"gpu.toposerve.io": f"{PREFIX}-gpu.toposerve.io",
           "nic.toposerve.io": f"{PREFIX}-nic.toposerve.io",
           "rdma-nic.toposerve.io": f"{PREFIX}-rdma-nic.toposerve.io",
           "gpu-share.toposerve.io": f"{PREFIX}-gpu-share.toposerve.io"}
SELECTOR = "app.kubernetes.io/component=net-driver"
REGISTRY = Path("/var/lib/kubelet/plugins_registry")
ROOT = "resource.kubernetes.io/pcieRoot"
EXAMPLE = f"{PREFIX}-example"


@dataclass
class NetStack:
    cluster: Cluster
    core: Any
    res: Any
    layout: Layout
    images: dict[str, Path]   # as `make image` printed them
    installed: inst.Installed
    bare: bytes               # the node's conflist before the install, without the hand-off
    previous: str             # the chart version the release was installed with
    uninstalled: bool = False

    @property
    def conflist(self) -> Path:
        return self.layout.cni_conf / inst.NODE_CONFLIST

    @property
    def forwarder(self) -> Path:
        return self.layout.cni_bin / PLUGIN_TYPE


def _bare(conflist: bytes) -> bytes:
    """The node's conflist as a pod network without toposerve has it: the
    hand-off's entry out, written in a style of its own (so that only a
    byte-for-byte restore gives these bytes back)."""
    doc = json.loads(conflist)
    doc["plugins"] = [p for p in doc["plugins"] if p.get("type") != PLUGIN_TYPE]
    return (json.dumps(doc, indent=3, sort_keys=True) + "\n").encode()


@pytest.fixture(scope="module")
def net_stack(real_node_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[NetStack]:
    ensure_started(real_node_cluster)
    chart, previous = previous_chart(tmp_path_factory.mktemp("chart"))
    layout = default_layout()
    conflist, exe = layout.cni_conf / inst.NODE_CONFLIST, layout.cni_bin / PLUGIN_TYPE
    # the node as its start made it (the host-process NIC tests need it so)
    node_conflist, node_exe = conflist.read_bytes(), exe.read_bytes()
    had_stand_ins = nics.FABRIC_NETNS.exists()
    core: Any = client.CoreV1Api(real_node_cluster.api)
    images = make_images()  # this tree's images (cached by content: seconds)
    bare = _bare(node_conflist)
    conflist.write_bytes(bare)
    exe.unlink()
    s: NetStack | None = None
    try:
        lines: list[str] = []
        try:
            installed = inst.install(real_node_cluster.name, sets=[
                f"namespace={PREFIX}", f"namePrefix={PREFIX}",
                *(f"deviceClasses.{k}={CLASSES[v]}" for k, v in (
                    ("gpu", "gpu.toposerve.io"), ("nic", "nic.toposerve.io"),
                    ("rdmaNic", "rdma-nic.toposerve.io"),
                    ("gpuShare", "gpu-share.toposerve.io"))),
                "netDriver.enabled=true",
                # what these tests need: the two drivers and their classes
                "extender.enabled=false", "scheduler.enabled=false", "router.enabled=false"],
                progress=lines.append, chart=chart)
        except BaseException:
            drop_failed_release(real_node_cluster.name, PREFIX)
            raise
        finally:
            print("\n".join(lines))
        s = NetStack(cluster=real_node_cluster, core=core,
                     res=client.ResourceV1Api(real_node_cluster.api), layout=layout,
                     images=images, installed=installed, bare=bare, previous=previous)
        yield s
    finally:
        if s is not None and not s.uninstalled:
            inst.uninstall(real_node_cluster.name, s.installed.values)
        # the release's namespace: `helm install --create-namespace` made it,
        # outside the release, and `helm uninstall` leaves it
        with contextlib.suppress(ApiException):
            core.delete_namespace(PREFIX)
        conflist.write_bytes(node_conflist)
        exe.write_bytes(node_exe)
        exe.chmod(0o755)
        if not had_stand_ins:
            nics.remove()


def _driver_pods(s: NetStack) -> list[Any]:
    return list(s.core.list_namespaced_pod(PREFIX, label_selector=SELECTOR).items)


def _slices(s: NetStack, driver: str = DRIVER) -> list[Any]:
    return list(s.res.list_resource_slice(
        field_selector=f"spec.nodeName={NODE_NAME},spec.driver={driver}").items)


def _sockets() -> list[Path]:
    return sorted([*REGISTRY.glob(f"{DRIVER}*"), *PLUGIN_DIR.glob("*.sock")])


def _stand_ins() -> list[nics.StandIn]:
    from toposerve.topology.profiles import load_profile

    return nics.stand_ins_for(load_profile(inst.PROFILE).hardware())


def test_the_installed_images_are_this_trees(net_stack: NetStack) -> None:
    """The archives the install took are those `make image` wrote for this
    tree: the keys computed in Python are the build script's."""
    assert inst.built_images() == net_stack.images


def test_init_container_installs_the_forwarder_and_chains_it(net_stack: NetStack) -> None:
    pod, = _driver_pods(net_stack)
    init, = pod.status.init_container_statuses
    assert init.name == "install-cni" and init.state.terminated.exit_code == 0, init
    # the image's binary: the forwarder `make nic-cni` built for this tree
    exe = net_stack.forwarder
    assert exe.read_bytes() == forwarder.binary().read_bytes()
    assert os.stat(exe).st_mode & 0o777 == 0o755
    out = subprocess.run([str(exe)], env={"CNI_COMMAND": "VERSION"}, capture_output=True,
                         text=True, check=True)
    assert json.loads(out.stdout)["supportedVersions"] == ["0.4.0", "1.0.0"]
    # chained last into the node's conflist, the rest as it was
    before, after = json.loads(net_stack.bare), json.loads(net_stack.conflist.read_bytes())
    assert after["plugins"] == [*before["plugins"], plugin_entry(net_stack.layout.kubelet_root)]
    assert {k: v for k, v in after.items() if k != "plugins"} == \
        {k: v for k, v in before.items() if k != "plugins"}
    record = data_dir(net_stack.layout.kubelet_root) / RECORD
    assert json.loads(record.read_text())["binary"] == {"path": str(exe), "created": True}


def test_driver_publishes_the_stand_in_nics(net_stack: NetStack) -> None:
    stand_ins = {n.ifname: n for n in _stand_ins()}
    wait_for("the stand-in NICs published by the pod", lambda: {
        d.attributes["ifName"].string for x in _slices(net_stack)
        for d in x.spec.devices or []} >= set(stand_ins), timeout=60)
    pod, = _driver_pods(net_stack)
    wait_for("the pod's registration socket", lambda: any(
        pod.metadata.uid in p.name for p in REGISTRY.glob(f"{DRIVER}*")), timeout=30)


def _root_of(s: NetStack, driver: str, device: str) -> str:
    for x in _slices(s, driver):
        for d in x.spec.devices or []:
            if d.name == device:
                return str(d.attributes[ROOT].string)
    raise AssertionError(f"{device} of {driver} not published")


def _ifname_of(s: NetStack, device: str) -> str:
    for x in _slices(s):
        for d in x.spec.devices or []:
            if d.name == device:
                return str(d.attributes["ifName"].string)
    raise AssertionError(f"{device} of {DRIVER} not published")


def _pod_netns(layout: Layout) -> list[Path]:
    """The network namespaces containerd pinned for pods (CNI_NETNS)."""
    where = inst.pod_netns_dir(layout)
    return sorted(where.iterdir()) if where.is_dir() else []


def _links_in(netns: Path) -> str:
    return subprocess.run(["nsenter", f"--net={netns}", "ip", "-o", "link"],
                          capture_output=True, text=True, check=True).stdout


@pytest.fixture
def cleanup_templates(net_stack: NetStack) -> Iterator[None]:
    yield
    for t in net_stack.res.list_namespaced_resource_claim_template("default").items:
        if t.metadata.name.startswith((f"{EXAMPLE}-", f"{UPGRADE}-")):
            with contextlib.suppress(ApiException):
                net_stack.res.delete_namespaced_resource_claim_template(t.metadata.name,
                                                                        "default")


@pytest.mark.usefixtures("cleanup_templates")
def test_example_04_gpu_and_nic_on_one_pcie_root(net_stack: NetStack, make_pod: PodMaker
                                                 ) -> None:
    s = net_stack
    wait_for("the stand-in NICs published", lambda: sum(
        len(x.spec.devices or []) for x in _slices(s)) >= len(_stand_ins()), timeout=60)
    pod = example_on_real_node(s.core, s.res, make_pod, "04-gpu-and-nic-one-pcie-root.yaml",
                               EXAMPLE, CLASSES)
    name = pod.metadata.name
    claim = s.res.read_namespaced_resource_claim(
        pod.status.resource_claim_statuses[0].resource_claim_name, "default")
    by_request = {r.request: r for r in claim.status.allocation.devices.results}
    assert (by_request["gpu"].driver, by_request["nic"].driver) == (GPU_DRIVER, DRIVER)
    assert _root_of(s, GPU_DRIVER, by_request["gpu"].device) == \
        _root_of(s, DRIVER, by_request["nic"].device)
    nic = next(n for n in _stand_ins()
               if n.ifname == _ifname_of(s, by_request["nic"].device))
    # the example's own command: `ip link show net1` in the container
    log = wait_for("net1 in the container's log", lambda: (
        text if "net1" in (text := s.core.read_namespaced_pod_log(name, "default")) else ""),
        timeout=30)
    assert nic.mac in log, log
    # from the host: the very NIC in one pod namespace as net1, not on the host
    with Namespace() as host:
        assert host.find(nic.ifname, nic.mac) is None
    holding = [ns for ns in _pod_netns(s.layout) if nic.mac in _links_in(ns)]
    assert len(holding) == 1, _pod_netns(s.layout)
    assert any("net1" in line and nic.mac in line
               for line in _links_in(holding[0]).splitlines())
    data = next(d for d in claim.status.devices or [] if d.driver == DRIVER).network_data
    assert data.interface_name == "net1"
    s.core.delete_namespaced_pod(name, "default", grace_period_seconds=1)
    wait_for(f"pod {name} gone", lambda: not s.core.list_namespaced_pod(
        "default", field_selector=f"metadata.name={name}").items, timeout=60)
    assert on_host_as_it_was(nic)
    assert Journal(JOURNAL_DIR).entries() == []


# -- helm upgrade from the previous chart version under running claims --

UPGRADE = f"{PREFIX}-upgrade"  # the upgrade test's pods and claim templates
COMPONENTS = ("gpu-driver", "net-driver")
GPU_CDI = CdiSpecs(CDI_ROOT, GPU_CDI_VENDOR, GPU_CDI_CLASS)
NIC_CDI = CdiSpecs(CDI_ROOT, NIC_CDI_VENDOR, NIC_CDI_CLASS)


@dataclass(frozen=True)
class Held:
    """A pod of the upgrade test, its claim and what prepared it."""
    pod: str
    pod_uid: str
    claim: str
    claim_uid: str
    cdi: CdiSpecs
    plugin_dir: Path


def _claim_template(s: NetStack, name: str, request: dict[str, Any]) -> None:
    # compact with sorted keys, as kubectl sends it (example_on_real_node says why)
    JsonApi(s.res.api_client).request(
        "POST", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates",
        body=canonical({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                        "metadata": {"name": name}, "spec": {"spec": {"devices": request}}}))


def _hold(s: NetStack, make_pod: PodMaker, what: str, cdi: CdiSpecs, plugin_dir: Path
          ) -> Held:
    name = f"{UPGRADE}-{what}"
    make_pod(busybox_pod(name, "sleep 3600", claims=[
        {"name": what, "resourceClaimTemplateName": name}]))
    pod = wait_phase(s.core, name, {"Running"})
    claim = s.res.read_namespaced_resource_claim(
        pod.status.resource_claim_statuses[0].resource_claim_name, "default")
    return Held(name, str(pod.metadata.uid), str(claim.metadata.name),
                str(claim.metadata.uid), cdi, plugin_dir)


def _checkpointed(plugin_dir: Path) -> dict[str, ClaimState]:
    data, _ = Checkpoint(plugin_dir / "checkpoint.json", read_boot_id()).load()
    return {uid: e.state for uid, e in data.claims.items()}


def _unprepared(s: NetStack, held: Held, nic: nics.StandIn) -> list[str]:
    """What is not as a prepared claim has it: allocated and reserved for
    its pod, its CDI spec and checkpoint entry there, the pod Running with
    no restart, the NIC in the pod's network namespace. Empty when all is."""
    wrong: list[str] = []
    claim = s.res.read_namespaced_resource_claim(held.claim, "default")
    if claim.status.allocation is None:
        wrong.append(f"{held.claim} not allocated")
    if held.pod_uid not in {r.uid for r in claim.status.reserved_for or []}:
        wrong.append(f"{held.claim} not reserved for {held.pod}")
    if not held.cdi.path(held.claim_uid).exists():
        wrong.append(f"{held.claim}'s CDI spec gone")
    state = _checkpointed(held.plugin_dir).get(held.claim_uid)
    if state != ClaimState.PREPARE_COMPLETED:
        wrong.append(f"{held.claim}'s checkpoint entry {state}")
    pod = s.core.read_namespaced_pod(held.pod, "default")
    restarts = sum(c.restart_count for c in pod.status.container_statuses or [])
    if pod.status.phase != "Running" or restarts:
        wrong.append(f"{held.pod} {pod.status.phase}, {restarts} restarts")
    if held.cdi is NIC_CDI:
        with Namespace() as host:
            if host.find(nic.ifname, nic.mac) is not None:
                wrong.append(f"{nic.ifname} back on the host")
    return wrong


def _driver_uids(s: NetStack) -> dict[str, str]:
    pods = s.core.list_namespaced_pod(PREFIX, label_selector=",".join(
        ["app.kubernetes.io/name=toposerve"])).items
    return {p.metadata.labels["app.kubernetes.io/component"]: str(p.metadata.uid)
            for p in pods if p.metadata.deletion_timestamp is None
            and p.metadata.labels.get("app.kubernetes.io/component") in COMPONENTS
            and p.status.phase == "Running"
            and all(c.ready for c in p.status.container_statuses or [])}


@pytest.mark.usefixtures("cleanup_templates")
def test_upgrade_from_the_previous_chart_keeps_claims_prepared(net_stack: NetStack,
                                                              make_pod: PodMaker) -> None:
    """``helm upgrade`` from the chart's previous version (the release's
    first revision; ``previous_chart`` says why a copy with a lower
    version) to this tree's chart while a pod holds a GPU claim and
    another a NIC claim: both drivers' pods are replaced (their templates
    carry the chart version), and all along both claims stay prepared
    (polled every 0.1 s: allocated and reserved, CDI spec and checkpoint
    entry there, pods Running without restart, the NIC in its pod). After,
    deleting the pods unprepares both through the new driver pods: CDI
    specs and checkpoint entries gone, the NIC back on the host as it was."""
    s = net_stack
    values = s.installed.values
    history = inst.history(s.cluster.name, values)
    assert history[-1]["chart"] == f"toposerve-{s.previous}", history
    wait_for("the stand-in NICs published", lambda: sum(
        len(x.spec.devices or []) for x in _slices(s)) >= len(_stand_ins()), timeout=60)
    _claim_template(s, f"{UPGRADE}-gpu", {"requests": [{"name": "gpu", "exactly": {
        "deviceClassName": CLASSES["gpu.toposerve.io"],
        "selectors": [{"cel": {"expression": "device.attributes['gpu.toposerve.io'].type"
                                             " == 'gpu'"}}]}}]})
    _claim_template(s, f"{UPGRADE}-nic", {
        "requests": [{"name": "nic", "exactly": {"deviceClassName": CLASSES["nic.toposerve.io"]}}],
        "config": [{"requests": ["nic"], "opaque": {
            "driver": DRIVER, "parameters": net_config(interfaceName="net1")}}]})
    held = [_hold(s, make_pod, "gpu", GPU_CDI, GPU_PLUGIN_DIR),
            _hold(s, make_pod, "nic", NIC_CDI, PLUGIN_DIR)]
    nic_claim = s.res.read_namespaced_resource_claim(held[1].claim, "default")
    nic = next(n for n in _stand_ins() if n.ifname == _ifname_of(
        s, nic_claim.status.allocation.devices.results[0].device))
    for h in held:
        assert _unprepared(s, h, nic) == [], h
    before = _driver_uids(s)
    assert set(before) == set(COMPONENTS), before

    problems: list[str] = []
    checks = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal checks
        while not done.is_set():
            for h in held:
                problems.extend(f"{time.monotonic() - started:.1f}s: {w}"
                                for w in _unprepared(s, h, nic))
            checks += 1
            time.sleep(0.1)

    started = time.monotonic()
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        inst.helm_install(s.cluster.name, values)  # this tree's chart
        replaced = wait_for("both drivers' pods replaced and ready", lambda: (
            now if set(now := _driver_uids(s)) == set(COMPONENTS)
            and not set(now.values()) & set(before.values()) else {}), timeout=180)
        inst.wait_available(s.cluster.api, [o for o in s.installed.objects
                                            if o["kind"] == "DaemonSet"], timeout_s=120)
        # the new pods serve the kubelet: their registration sockets are there
        wait_for("the new pods' registration sockets", lambda: all(
            any(uid in p.name for p in REGISTRY.iterdir()) for uid in replaced.values()),
            timeout=60)
        time.sleep(1)  # a few more checks with the new pods registered
    finally:
        done.set()
        watcher.join(10)
    took = time.monotonic() - started
    print(f"upgrade {s.previous} -> this tree's chart: both drivers replaced in {took:.1f}s; "
          f"claims checked {checks} times, all prepared")
    assert problems == [], problems[:10]
    assert checks > 10
    after = inst.history(s.cluster.name, values)
    chart = next(o["metadata"]["labels"]["helm.sh/chart"]  # this tree's
                 for o in s.installed.objects if o["kind"] == "DaemonSet")
    assert chart != f"toposerve-{s.previous}"
    assert [(r["chart"], r["status"]) for r in after[-2:]] == [
        (f"toposerve-{s.previous}", "superseded"), (chart, "deployed")], after
    # unprepared by the new driver pods once the pods go
    for h in held:
        s.core.delete_namespaced_pod(h.pod, "default", grace_period_seconds=1)
    wait_for("the upgrade test's pods gone", lambda: not {h.pod for h in held} & {
        p.metadata.name for p in s.core.list_namespaced_pod("default").items}, timeout=60)
    for h in held:
        assert not h.cdi.path(h.claim_uid).exists(), h
        assert h.claim_uid not in _checkpointed(h.plugin_dir), h
    assert on_host_as_it_was(nic)
    assert Journal(JOURNAL_DIR).entries() == []


def test_uninstall_restores_the_nodes_cni_config(net_stack: NetStack) -> None:
    s = net_stack
    inst.uninstall(s.cluster.name, s.installed.values)
    s.uninstalled = True
    assert s.conflist.read_bytes() == s.bare
    assert not s.forwarder.exists()
    assert not (data_dir(s.layout.kubelet_root) / RECORD).exists()
    assert not _driver_pods(s)
    assert not _slices(s) and not _slices(s, GPU_DRIVER)
    assert not _sockets()
    assert not list(STATE_DIR.glob("*.json")) and Journal(JOURNAL_DIR).entries() == []
    assert all(on_host_as_it_was(n) for n in _stand_ins())
    assert inst.install_status(s.cluster.api, [PREFIX])["components"] == []
    # no release, and nothing of it kept: these values make no Secret or Namespace to keep
    assert not [r for r in inst.releases(s.cluster.name) if r["name"] == RELEASE]
    assert inst.kept_objects(s.installed.values) == []
    assert labelled_objects(s.cluster.api, f"app.kubernetes.io/instance={PREFIX}") == []
