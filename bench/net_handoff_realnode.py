"""The NIC hand-off through the real kubelet and containerd: a one-node
kwok cluster plus the real node, ``toposerve driver net`` on it (NIC
stand-ins), and pods one at a time, alternately with a one-NIC claim and
without. containerd's own log times each sandbox: ``RunPodSandbox for``
(sandbox creation begins) to ``RunPodSandbox ... returns``; the driver's log
(its resident hand-off server does the move the Go forwarder sends it) has
the ``nic attached`` line (the NIC is in the netns, configured). Needs root
(the real node); prints a table, writes JSON."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.flags import count, positive
from bench.report import latency_table
from toposerve.kubeapi import JsonApi
from toposerve.localcluster.cluster import ClusterSpec, down, up
from toposerve.localcluster.clusters import api_client, kubeconfig_path
from toposerve.localcluster.realnode import node as realnode
from toposerve.localcluster.realnode.net_driver import DRIVER, NetDriver
from toposerve.localcluster.realnode.paths import default_layout
from toposerve.localcluster.realnode.pods import busybox_pod
from toposerve.localcluster.results import write
from toposerve.localcluster.scale.measure import latency_ms

REPO = Path(__file__).resolve().parent.parent
CLUSTER = "bench-net-handoff"
CLASS = "bench-nic"
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims"
START = re.compile(r'time="([^"]+)".*msg="RunPodSandbox for name:\\"([^\\"]+)\\"(.*)')
RETURNS = re.compile(r'returns sandbox id \\"([0-9a-f]+)\\"')


@dataclass
class Sandbox:
    pod: str
    started: float  # epoch seconds
    returned: float | None = None
    sandbox: str | None = None
    nic_ready: float | None = None


def _epoch(stamp: str) -> float:
    # containerd writes nanoseconds; datetime takes microseconds
    head, _, frac = stamp.rstrip("Z").partition(".")
    return dt.datetime.fromisoformat(head).replace(tzinfo=dt.UTC).timestamp() + \
        float(f"0.{frac or '0'}")


def sandboxes(lines: Iterable[str]) -> dict[str, Sandbox]:
    """Pod name -> its (last) sandbox's times, from containerd's log and the
    NIC driver's (JSON lines; the order of the two does not matter)."""
    out: dict[str, Sandbox] = {}
    attached: dict[str, float] = {}
    for line in lines:
        if line.startswith("{"):
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("msg") == "nic attached":
                attached[rec["sandbox"]] = _epoch(rec["timestamp"])
            continue
        m = START.search(line)
        if m is None:
            continue
        when, pod, rest = _epoch(m.group(1)), m.group(2), m.group(3)
        r = RETURNS.search(rest)
        if r is None:
            out[pod] = Sandbox(pod=pod, started=when)
        elif pod in out:
            out[pod].returned, out[pod].sandbox = when, r.group(1)
    for s in out.values():
        s.nic_ready = attached.get(s.sandbox or "")
    return out


def _until(what: str, check: Callable[[], bool], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def _claim(name: str, ifname: str) -> dict[str, Any]:
    doc = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": name},
           "spec": {"devices": {
               "requests": [{"name": "nic", "exactly": {"deviceClassName": CLASS, "selectors": [
                   {"cel": {"expression": f"device.attributes['{DRIVER}'].ifName == "
                                          f"'{ifname}'"}}]}}],
               "config": [{"requests": ["nic"], "opaque": {"driver": DRIVER, "parameters": {
                   "apiVersion": "net.toposerve.io/v1", "kind": "NetConfig",
                   "interfaceName": "net1", "addresses": ["198.18.0.2/24"], "mtu": 1400}}}]}}}
    # Go's JSON form (sorted keys): see docs/net-handoff.md on opaque parameters
    return dict(json.loads(json.dumps(doc, sort_keys=True)))


def _one_pod(core: Any, name: str, claims: list[dict[str, str]]) -> None:
    """Created, Running, deleted (gracefully: the kubelet stops it, the CNI
    DEL gives the NIC back, the claim is unprepared) and gone."""
    core.create_namespaced_pod("default", busybox_pod(
        name, "trap 'exit 0' TERM; sleep 3600 & wait", claims=claims))
    _until(f"{name} Running", lambda: core.read_namespaced_pod(
        name, "default").status.phase == "Running")
    core.delete_namespaced_pod(name, "default", grace_period_seconds=5)
    _until(f"{name} gone", lambda: not core.list_namespaced_pod(
        "default", field_selector=f"metadata.name={name}").items)


def run(pods: int, workdir: Path, wait_s: float) -> dict[str, Sandbox]:
    up(ClusterSpec(name=CLUSTER, groups=[("hgx-h100", 1)]), progress=lambda m: None)
    driver = NetDriver(kubeconfig_path(CLUSTER), workdir)
    try:
        realnode.start(CLUSTER, progress=lambda m: None, wait_s=wait_s)
        api = api_client(CLUSTER)
        core: Any = client.CoreV1Api(api)
        rest = JsonApi(api)
        rest.request("POST", "/apis/resource.k8s.io/v1/deviceclasses", body={
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": CLASS}, "spec": {"selectors": [
                {"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}})
        driver.start()
        nic = driver.stand_ins()[0].ifname
        for i in range(pods * 2):
            name = f"bench-{'nic' if i % 2 == 0 else 'plain'}-{i}"
            claims: list[dict[str, str]] = []
            if i % 2 == 0:
                rest.request("POST", CLAIMS, body=_claim(name, nic))
                claims = [{"name": "nic", "resourceClaimName": name}]
            _one_pod(core, name, claims)
            if claims:
                rest.request("DELETE", f"{CLAIMS}/{name}")
        logs = (default_layout().logs / "containerd.log", driver.log)
        return sandboxes([line for log in logs
                          for line in log.read_text(errors="replace").splitlines()])
    finally:
        driver.stop()
        driver.remove_stand_ins()
        down(CLUSTER, progress=lambda m: None)  # the real node goes with it


def rows(boxes: dict[str, Sandbox]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {
        "sandbox start -> NIC ready in the netns, NIC claim": [],
        "sandbox start -> RunPodSandbox returns, NIC claim": [],
        "sandbox start -> RunPodSandbox returns, no NIC claim": []}
    for s in boxes.values():
        if s.returned is None:
            continue
        if s.pod.startswith("bench-nic-"):
            if s.nic_ready is not None:
                out["sandbox start -> NIC ready in the netns, NIC claim"].append(
                    s.nic_ready - s.started)
            out["sandbox start -> RunPodSandbox returns, NIC claim"].append(
                s.returned - s.started)
        elif s.pod.startswith("bench-plain-"):
            out["sandbox start -> RunPodSandbox returns, no NIC claim"].append(
                s.returned - s.started)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.net_handoff_realnode",
                                 description=__doc__)
    ap.add_argument("--pods", type=count, default=20, help="pods of each kind (default 20)")
    ap.add_argument("--wait", type=positive, default=600,
                    help="seconds to wait for the machine's one real node (default 600)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        got = rows(run(args.pods, Path(tmp), args.wait))
    ms = {k: latency_ms(v) for k, v in got.items()}
    md = latency_table(ms)
    load = os.getloadavg()[0]
    md += f"\n\n{args.pods} pods of each kind, load average {load:.1f} at the end"
    write(Path(args.out), "net_handoff_realnode", md,
                 {"pods_each": args.pods, "load1": load, "latency": ms, "raw_s": got})
    return 0


if __name__ == "__main__":
    sys.exit(main())
