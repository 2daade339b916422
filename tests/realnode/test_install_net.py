"""The NIC driver's DaemonSet from the install on the real node
(docs/install.md, docs/net-handoff.md): on a node whose pod network does not
chain the NIC hand-off yet and has no forwarder, the pod's init container
installs ``toposerve-nic`` (the image's binary) into the node's CNI bin dir
and chains it into the node's conflist; the driver publishes the node's
stand-in NICs (``toposerve.localcluster.realnode.nics``, found through the same fake
sysfs tree the GPU driver reads); the cookbook's GPU + NIC on one PCIe root
(examples/04) runs with the NIC moved into the pod's network namespace; and
the uninstall puts the conflist back byte for byte and removes the
forwarder, leaving no slice or socket of the driver."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.images import make_images
from harness.waiting import wait_for
from tests.conftest import Cluster
from tests.realnode.conftest import (
    PodMaker,
    ensure_started,
    example_on_real_node,
    on_host_as_it_was,
)
from toposerve.dra_driver.net.handoff.cni import PLUGIN_TYPE
from toposerve.dra_driver.net.handoff.install import RECORD, data_dir, plugin_entry
from toposerve.dra_driver.net.handoff.journal import Journal
from toposerve.dra_driver.net.handoff.links import Namespace
from toposerve.localcluster import install as inst
from toposerve.localcluster.realnode import forwarder, nics
from toposerve.localcluster.realnode.gpu_driver import DRIVER as GPU_DRIVER
from toposerve.localcluster.realnode.net_driver import DRIVER, JOURNAL_DIR, PLUGIN_DIR, STATE_DIR
from toposerve.localcluster.realnode.paths import NODE_NAME, Layout, default_layout

pytestmark = [pytest.mark.cluster, pytest.mark.realnode]

PREFIX = "rn-install-net"  # namespace and name prefix: nothing shared with other tests
CLASSES = {"gpu.toposerve.io": f"{PREFIX}-gpu.toposerve.io",
           "nic.toposerve.io": f"{PREFIX}-nic.toposerve.io",
           "rdma-nic.toposerve.io": f"{PREFIX}-rdma-nic.toposerve.io"}
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
def net_stack(real_node_cluster: Cluster) -> Iterator[NetStack]:
    ensure_started(real_node_cluster)
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
                    ("rdmaNic", "rdma-nic.toposerve.io"))),
                "netDriver.enabled=true",
                # what these tests need: the two drivers and their classes
                "extender.enabled=false", "scheduler.enabled=false", "router.enabled=false"],
                progress=lines.append)
        finally:
            print("\n".join(lines))
        s = NetStack(cluster=real_node_cluster, core=core,
                     res=client.ResourceV1Api(real_node_cluster.api), layout=layout,
                     images=images, installed=installed, bare=bare)
        yield s
    finally:
        if s is not None and not s.uninstalled:
            inst.uninstall(real_node_cluster.name, s.installed.values)
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
        if t.metadata.name.startswith(f"{EXAMPLE}-"):
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
