"""``make demo``, DRA: ``toposerve driver simulate`` publishes GPU and NIC
ResourceSlices for every kwok node and the real kube-scheduler allocates a
claim for a GPU and a NIC on one PCIe root, by the DeviceClasses the
install applied."""

from __future__ import annotations

import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import urllib3
from demo_support import TOPOSERVE, DemoError, background, create, items, wait_until

from toposerve.kubeapi import JsonApi
from toposerve.localcluster.clusters import api_client
from toposerve.localcluster.nodes import KWOK_TOLERATION
from toposerve.localcluster.ports import free_port
from toposerve.manifests.values import DeviceClasses
from toposerve.topology.labels import PROFILE_LABEL

Say = Callable[[str], None]
GPU_DRIVER, NET_DRIVER = "gpu.toposerve.io", "net.toposerve.io"
PCIE_ROOT = "resource.kubernetes.io/pcieRoot"
PCI_BUS_ID = "resource.kubernetes.io/pciBusID"
CLASSES = DeviceClasses()  # the shipped class names (manifests' defaults)
WHOLE_GPU = f"device.attributes['{GPU_DRIVER}'].type == 'gpu'"  # not a MIG-like partition
# device kinds by their ``type`` attribute (NICs: DRANET's "device")
KINDS = {"gpu": "whole GPUs", "mig": "MIG-like partitions", "device": "NICs"}
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
PODS = "/api/v1/namespaces/default/pods"


@contextmanager
def _published(api: Any, name: str, workdir: Path) -> Iterator[None]:
    """Start ``driver simulate`` for the cluster; print what it published
    and how long it took; yield while it keeps the slices up."""
    port = free_port()
    cmd = [*TOPOSERVE, "driver", "simulate", "--cluster", name,
           "--http-address", f"127.0.0.1:{port}"]
    with background("toposerve driver simulate", cmd, workdir / "simulate.log") as sim:
        # watching (healthz) first: the publishing time without Python's start-up
        up = sim.wait_http(f"http://127.0.0.1:{port}/healthz", timeout=120)
        took = sim.wait_http(f"http://127.0.0.1:{port}/readyz", timeout=120) - up
        status = orjson.loads(urllib3.request("GET", f"http://127.0.0.1:{port}/status",
                                              timeout=5).data)
        writes = sum(p["writes"] for p in status["publishers"])
        rest = JsonApi(api)
        nodes = len(items(rest, "/api/v1/nodes", "type=kwok"))
        print(f"   `toposerve driver simulate --cluster {name}`: up in {up:.1f}s, then every "
              f"slice of {nodes} kwok nodes\n   published in {took:.1f}s "
              f"({writes} API writes; /readyz)")
        for line in _slice_summary(items(rest, SLICES)):
            print("   " + line)
        yield


def _slice_summary(slices: list[dict[str, Any]]) -> list[str]:
    pools: dict[str, set[str]] = defaultdict(set)
    count: dict[str, int] = defaultdict(int)
    kinds: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for s in slices:
        spec = s["spec"]
        drv = spec["driver"]
        pools[drv].add(spec["pool"]["name"])
        count[drv] += 1
        for d in spec.get("devices") or []:
            kind = ((d.get("attributes") or {}).get("type") or {}).get("string", "")
            kinds[drv][kind] += 1
    if not {GPU_DRIVER, NET_DRIVER} <= set(count):
        raise DemoError(f"slices of {sorted(count)} published; want both {GPU_DRIVER} "
                        f"and {NET_DRIVER}")
    return [f"  {drv}: {count[drv]:4} slices, {len(pools[drv]):3} pools, "
            + ", ".join(f"{n} {KINDS.get(k, k + ' devices')}"
                        for k, n in sorted(kinds[drv].items()))
            for drv in sorted(count)]


def _claim() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "gpu-and-nic"},
            "spec": {"devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": CLASSES.gpu,
                                                "selectors": [{"cel": {"expression": WHOLE_GPU}}]}},
                    {"name": "nic", "exactly": {"deviceClassName": CLASSES.nic}}],
                "constraints": [{"requests": ["gpu", "nic"], "matchAttribute": PCIE_ROOT}]}}}


def _claim_pod(profile: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-and-nic"},
            "spec": {"containers": [{"name": "main", "image": "vllm/vllm-openai"}],
                     "tolerations": [KWOK_TOLERATION], "nodeSelector": {PROFILE_LABEL: profile},
                     "resourceClaims": [{"name": "devices", "resourceClaimName": "gpu-and-nic"}]}}


def _device_attributes(rest: JsonApi, driver: str, pool: str,
                       device: str) -> dict[str, Any]:
    for s in items(rest, SLICES):
        spec = s["spec"]
        if spec["driver"] == driver and spec["pool"]["name"] == pool:
            for d in spec.get("devices") or []:
                if d["name"] == device:
                    return {k: next(iter(v.values())) for k, v in d["attributes"].items()}
    raise DemoError(f"allocated device {driver}/{pool}/{device} is in no published slice")


def _allocate(api: Any, profile: str = "hgx-h100") -> list[str]:
    """The claim allocated; one line per device it got, for the summary."""
    rest = JsonApi(api)
    create(rest, CLAIMS, _claim())
    create(rest, PODS, _claim_pod(profile))
    print(f"   ResourceClaim gpu-and-nic: one whole GPU ({CLASSES.gpu}) and one NIC "
          f"({CLASSES.nic}),\n     constraint matchAttribute {PCIE_ROOT}; used by pod "
          f"gpu-and-nic on an {profile} node")
    started = time.monotonic()
    try:
        def allocated() -> list[dict[str, Any]]:
            claim = rest.request("GET", f"{CLAIMS}/gpu-and-nic")
            got: list[dict[str, Any]] = (((claim.get("status") or {}).get("allocation") or {})
                                         .get("devices") or {}).get("results") or []
            return got
        results = wait_until("the claim's allocation", allocated, timeout=60)
        node = rest.request("GET", f"{PODS}/gpu-and-nic")["spec"].get("nodeName")
        print(f"   kube-scheduler allocated it in {time.monotonic() - started:.1f}s and "
              f"bound the pod to {node}:")
        roots, got = set(), []
        for r in results:
            attrs = _device_attributes(rest, r["driver"], r["pool"], r["device"])
            roots.add(attrs.get(PCIE_ROOT))
            got.append(f"{r['request']}: {r['pool']}/{r['device']} "
                       f"(pcieRoot {attrs.get(PCIE_ROOT)})")
            print(f"     {r['request']:4} -> {r['driver']} {r['pool']}/{r['device']:8} "
                  f"pcieRoot {attrs.get(PCIE_ROOT)}  pciBusID {attrs.get(PCI_BUS_ID)}  "
                  f"NUMA {attrs.get('resource.kubernetes.io/numaNode')}")
        if len(roots) != 1 or len(results) != 2:
            raise DemoError(f"the claim got {len(results)} devices on PCIe roots {roots}")
        print(f"     one PCIe root ({roots.pop()}): the GPU and the NIC are aligned")
        return got
    finally:
        rest.request("DELETE", f"{PODS}/gpu-and-nic", [("gracePeriodSeconds", 0)])
        rest.request("DELETE", f"{CLAIMS}/gpu-and-nic")


@contextmanager
def dra_slices(name: str, say: Say) -> Iterator[list[str]]:
    """Step: the kwok nodes' slices and a GPU+NIC claim on them (the
    DeviceClasses are the install's); yields what the claim got. The slices
    stay published (``driver simulate`` keeps running) inside the ``with``."""
    say("3. DRA: ResourceSlices for every kwok node, a GPU+NIC claim on one PCIe root")
    api = api_client(name)
    with tempfile.TemporaryDirectory(prefix="toposerve-demo-dra-") as tmp, \
            _published(api, name, Path(tmp)):
        yield _allocate(api)
