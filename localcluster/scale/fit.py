"""Does a scenario fit this machine? An estimate of the memory its
processes take at once (one setup runs at a time), from a fixed cost per
process plus costs per node, per published device and per pod, against
/proc/meminfo's MemAvailable. Checked before anything starts."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from toposerve.dra_driver.gpu.devices import DRIVER as GPU_DRIVER
from toposerve.dra_driver.gpu.devices import gpu_pool
from toposerve.dra_driver.net.devices import DRIVER as NET_DRIVER
from toposerve.dra_driver.net.devices import nic_pool
from toposerve.localcluster.scale.scenario import ScaleScenario, Setup
from toposerve.topology.layout import plan_nodes
from toposerve.topology.model import NodeTopology
from toposerve.topology.profiles import load_profile

# MiB each process takes on an empty cluster; "scale" is this driver process.
# Calibrated from peak RSS measured here (docs/scale.md): the small scenario
# (48 nodes, ~1,000 devices) and 500 hgx-h100 nodes (44,000 devices): there the
# apiserver peaked at 2.2 GiB, the scheduler at 1.2 GiB, the controller-manager at 0.7.
BASE_MIB = {"etcd": 55, "kube-apiserver": 400, "kube-controller-manager": 130,
            "kube-scheduler": 100, "kwok-controller": 60, "driver simulate": 95,
            "extender": 105, "scale": 130}
# MiB per node (its object and lease in every component's informers) and per
# published device (its part of a slice, decoded and cached by the apiserver,
# etcd, the scheduler, the controller-manager and the extender)
PER_NODE_MIB = 0.5
PER_DEVICE_MIB = 0.08
# MiB per pod (its object and claim in every cache, our own timing records)
PER_POD_MIB = 0.06
RESERVE_MIB = 512  # left for the rest of the machine


class DoesNotFit(RuntimeError):
    """The scenario needs more memory than is free; the message has both numbers."""


@dataclass(frozen=True)
class Estimate:
    total_mib: float
    processes_mib: float
    nodes_mib: float
    devices_mib: float
    pods_mib: float


@cache
def devices_per_node(profile: str, partitions: bool = True,
                     drivers: tuple[str, ...] = (GPU_DRIVER, NET_DRIVER)) -> int:
    """Devices ``driver simulate`` publishes for a node (with or without
    partitions) for the drivers given."""
    prof = load_profile(profile)
    node = plan_nodes([(prof, 1)])[0]
    topo = NodeTopology(name=node.name, path=node.path, profile=profile,
                        hardware=prof.hardware())
    return ((len(gpu_pool(topo, partitions=partitions).devices) if GPU_DRIVER in drivers else 0)
            + (len(nic_pool(topo).devices) if NET_DRIVER in drivers else 0))


def heap_factor(sc: ScaleScenario) -> float:
    """How much more the objects cost with the scenario's largest GOGC: a Go
    heap grows to (1 + GOGC/100) times what is live, twice it at Go's 100."""
    return max(1.0, (1 + max(sc.gogc.values(), default=100) / 100) / 2)


def estimate(sc: ScaleScenario) -> Estimate:
    procs = sum(v for k, v in BASE_MIB.items()
                if k != "extender" or Setup.TOPOSERVE in sc.setups)
    nodes = sc.node_count() + sc.churn.nodes_added
    drivers = tuple(sc.drivers)
    devices = sum((g.count - g.whole_gpu_nodes()) * devices_per_node(g.profile, True, drivers)
                  + g.whole_gpu_nodes() * devices_per_node(g.profile, False, drivers)
                  for g in sc.nodes)
    pods = sc.pod_count() + sc.churn.pods
    k = heap_factor(sc)
    e = Estimate(0, procs, nodes * PER_NODE_MIB * k, devices * PER_DEVICE_MIB * k,
                 pods * PER_POD_MIB * k)
    return Estimate(e.processes_mib + e.nodes_mib + e.devices_mib + e.pods_mib, *[
        round(x, 1) for x in (e.processes_mib, e.nodes_mib, e.devices_mib, e.pods_mib)])


def mem_available_mib(meminfo: Path = Path("/proc/meminfo")) -> float:
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"{meminfo} has no MemAvailable line")


def check(sc: ScaleScenario, available_mib: float) -> Estimate:
    """The estimate, or DoesNotFit naming both numbers."""
    e = estimate(sc)
    if e.total_mib > available_mib - RESERVE_MIB:
        raise DoesNotFit(
            f"scenario {sc.name!r} needs about {e.total_mib:,.0f} MiB "
            f"({sc.node_count():,} nodes: {e.nodes_mib + e.devices_mib:,.0f} MiB, "
            f"{sc.pod_count():,} pods: {e.pods_mib:,.0f} MiB, processes: "
            f"{e.processes_mib:,.0f} MiB) but this machine has {available_mib:,.0f} MiB "
            f"available (MemAvailable, {RESERVE_MIB} MiB of it kept free); "
            "use fewer nodes or pods, or free memory")
    return e
