"""``transfer``: how far KV moves between two pods, from the devices each
holds as the drivers publish them, and from node places where a pod holds
none."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toposerve.dra_driver.gpu.devices import DRIVER as GPU
from toposerve.dra_driver.gpu.devices import gpu_pool
from toposerve.dra_driver.net.devices import DRIVER as NET
from toposerve.dra_driver.net.devices import nic_pool
from toposerve.topology.distance import node_tier
from toposerve.topology.model import Affinity, DeviceKind, DomainPath, NodeTopology, Tier
from toposerve.topology.profiles import load_profile
from toposerve.topology.slice_attributes import held_device
from toposerve.topology.transfer import (
    NO_DEVICES,
    DeviceSet,
    HeldDevice,
    Transfer,
    closeness,
    transfer,
)

pytestmark = pytest.mark.unit

RACK = {"zone": "z", "block": "b", "rack": "r"}


def node(name: str, profile: str = "hgx-h100", nvlink: str | None = None) -> NodeTopology:
    return NodeTopology(name=name, path=DomainPath(**RACK, nvlink=nvlink, host=name),
                        profile=profile, hardware=load_profile(profile).hardware())


def published(n: NodeTopology) -> dict[str, HeldDevice]:
    """Each device of the node as the GPU and NIC drivers publish it, read back."""
    out = {}
    for driver, pool in ((GPU, gpu_pool(n, partitions=False)), (NET, nic_pool(n))):
        for entry in pool.devices:
            out[entry["name"]] = held_device(driver, pool.name, entry)
    return out


def held(devices: dict[str, HeldDevice], *names: str) -> DeviceSet:
    return DeviceSet(tuple(devices[n] for n in names))


def test_published_devices_read_back_with_their_place() -> None:
    n = node("n1", nvlink="nvl-1")
    devs = published(n)
    gpu0, nic0, gpu7 = devs["gpu-0"], devs["nic-0"], devs["gpu-7"]
    assert (gpu0.kind, gpu0.pcie_root, gpu0.numa, gpu0.nvlink_domain) == (
        DeviceKind.GPU, "pci0000:15", 0, "nvl-1")
    assert gpu0.pcie_switch is not None and gpu0.pcie_switch == nic0.pcie_switch
    assert nic0.kind == DeviceKind.NIC and nic0.nvlink_domain == "nvl-1"
    assert (gpu7.numa, gpu7.pcie_root) == (1, "pci0000:ba")
    assert gpu0.ref == f"{GPU}/n1/gpu-0"


def test_other_drivers_vocabulary_and_bad_values() -> None:
    # NVIDIA's driver: no kind, type gpu, a fully qualified name of its own domain
    nvidia = held_device("gpu.nvidia.com", "n", {"name": "gpu-0", "attributes": {
        "type": {"string": "gpu"}, "resource.kubernetes.io/pcieRoot": {"string": "pci0000:15"},
        "gpu.nvidia.com/pcieSwitch": {"string": "0000:16:00.0"}}})
    assert (nvidia.kind, nvidia.pcie_root, nvidia.pcie_switch) == (
        DeviceKind.GPU, "pci0000:15", "0000:16:00.0")
    odd = held_device("x", "p", {"name": "d", "attributes": {
        "kind": {"string": "fpga"}, "numaNode": {"bool": True}, "nvlinkDomain": {"int": 3},
        "resource.kubernetes.io/pcieRoot": {"string": "a", "int": 1}}})
    assert (odd.kind, odd.numa, odd.nvlink_domain, odd.pcie_root) == (None, None, None, None)
    assert held_device("x", "p", {"name": "d", "attributes": []}).kind is None


def test_inside_a_node_the_devices_decide() -> None:
    # no NVLink domain published (a PCIe-only node): switch, root, NUMA node
    devs = published(node("n1"))
    path = DomainPath(**RACK, host="n1")
    prefill = held(devs, "gpu-0")

    def at(*names: str) -> Transfer:
        return transfer(path, prefill, path, held(devs, *names))

    assert at("gpu-0") == (Tier.SAME_NODE, Affinity.SAME_DEVICE)
    assert at("gpu-1") == (Tier.SAME_NODE, Affinity.SAME_SWITCH)
    assert at("gpu-2") == (Tier.SAME_NODE, Affinity.SAME_NUMA)  # the socket's other root
    assert at("gpu-4") == (Tier.SAME_NODE, Affinity.SAME_NODE)  # the other socket
    # every GPU of either side finds one of the other's: TP2 beside TP1
    assert at("gpu-1", "gpu-0") == (Tier.SAME_NODE, Affinity.SAME_SWITCH)
    assert at("gpu-1", "gpu-2") == (Tier.SAME_NODE, Affinity.SAME_NUMA)
    assert at("gpu-0", "gpu-4") == (Tier.SAME_NODE, Affinity.SAME_NODE)
    # two switches under one root (no bundled profile has them)
    below = devs["gpu-0"].model_copy(update={"name": "gpu-9", "pcie_switch": "0000:17:00.0"})
    assert transfer(path, prefill, path, DeviceSet((below,))).affinity == Affinity.SAME_ROOT
    # a pod without claims: the node is all that is known
    assert transfer(path, prefill, path, NO_DEVICES) == (Tier.SAME_NODE, Affinity.SAME_NODE)


def test_nvlink_domains_of_devices_beat_pcie() -> None:
    # GPUs bridged in pairs (as H100 NVL cards are), here 1-2, 3-4, 5-6, 7-0:
    # a pair shares a domain across switches, next-door GPUs of two pairs do not
    devs = {k: v.model_copy(update={"nvlink_domain": f"pair-{(int(k[-1]) + 1) % 8 // 2}"})
            if v.kind == DeviceKind.GPU else v for k, v in published(node("n1")).items()}
    path = DomainPath(**RACK, host="n1")
    assert transfer(path, held(devs, "gpu-1"), path, held(devs, "gpu-2")).affinity == \
        Affinity.NVLINK
    assert transfer(path, held(devs, "gpu-1"), path, held(devs, "gpu-0")).affinity == \
        Affinity.SAME_SWITCH


def test_between_nodes_nvlink_devices_overrule_labels() -> None:
    a, b = node("a", "gb200-nvl72", "nvl-1"), node("b", "gb200-nvl72", "nvl-1")
    da, db = published(a), published(b)
    assert transfer(a.path, held(da, "gpu-0"), b.path, held(db, "gpu-0")) == (
        Tier.NVLINK, Affinity.NVLINK)
    # the hardware names another domain (NVML's clique) than the label does
    other = {k: v.model_copy(update={"nvlink_domain": "cluster.2"}) for k, v in db.items()}
    assert transfer(a.path, held(da, "gpu-0"), b.path, held(other, "gpu-0")).tier == Tier.RACK
    # and the hardware's domain counts where the labels say nothing
    bare = DomainPath(host="a"), DomainPath(host="b")
    same = {k: v.model_copy(update={"nvlink_domain": "nvl-1"}) for k, v in db.items()}
    assert transfer(bare[0], held(da, "gpu-0"), bare[1], held(same, "gpu-0")).tier == \
        Tier.NVLINK
    assert transfer(bare[0], held(da, "gpu-0"), bare[1], held(db, "gpu-0")).tier == \
        Tier.NVLINK  # both publish the label's domain
    assert transfer(bare[0], NO_DEVICES, bare[1], NO_DEVICES).tier == Tier.BEYOND


def test_between_nodes_the_nics_held_refine_the_tier() -> None:
    a, b = node("a"), node("b")
    da, db = published(a), published(b)

    def far(*names: tuple[dict[str, HeldDevice], tuple[str, ...]]) -> Affinity:
        (x, xs), (y, ys) = names
        return transfer(a.path, held(x, *xs), b.path, held(y, *ys)).affinity

    aligned = (db, ("gpu-0", "nic-0"))
    assert far((da, ("gpu-0", "nic-1")), aligned) == Affinity.SAME_SWITCH
    assert far((da, ("gpu-0", "nic-2")), aligned) == Affinity.SAME_NUMA
    assert far((da, ("gpu-0", "nic-7")), aligned) == Affinity.SAME_NODE  # the other socket
    assert far((da, ("gpu-0",)), aligned) == Affinity.SAME_NODE  # no NIC: unknown
    assert transfer(a.path, held(da, "gpu-0", "nic-0"), b.path, held(db, "gpu-0", "nic-0")
                    ).tier == Tier.RACK


paths = st.builds(DomainPath, zone=st.sampled_from(["z", None]), rack=st.sampled_from(
    ["r1", "r2"]), block=st.just("b"), nvlink=st.sampled_from(["n1", "n2", None]),
    host=st.sampled_from(["h1", "h2"]))
DEVICES = published(node("h1", nvlink="n1"))
sets = st.lists(st.sampled_from(sorted(DEVICES)), max_size=4).map(
    lambda names: DeviceSet(tuple(DEVICES[n] for n in names)))


@given(paths, sets, paths, sets)
def test_symmetric_and_nodes_only_is_node_tier(a: DomainPath, da: DeviceSet, b: DomainPath,
                                                db: DeviceSet) -> None:
    assert transfer(a, da, b, db) == transfer(b, db, a, da)
    assert transfer(a, NO_DEVICES, b, NO_DEVICES).tier == node_tier(a, b)


def test_closeness_runs_from_one_to_zero_by_rank() -> None:
    every = sorted(Transfer(t, f) for t in Tier for f in Affinity)
    scores = [closeness(t) for t in every]
    assert scores[0] == 1.0 and scores[-1] == 0.0
    assert all(x > y for x, y in itertools.pairwise(scores))
