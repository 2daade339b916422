"""Pod start and claim prepare latency through the real kubelet: a one-node
kwok cluster plus the real node (kubelet + containerd + runc), the GPU
driver on it with a fake hgx-h100 sysfs tree, and pods created one at a
time, alternately plain and with a one-GPU claim from a template, each
timed from create to Running and from a graceful delete to gone (the
kubelet has stopped the container and unprepared the claim). The driver's own
NodePrepareResources/NodeUnprepareResources times come from its log.
Needs root (the real node); prints a table, writes JSON."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.flags import count, positive
from bench.report import latency_table
from toposerve.localcluster.cluster import ClusterSpec, down, up
from toposerve.localcluster.clusters import api_client, kubeconfig_path
from toposerve.localcluster.realnode import node as realnode
from toposerve.localcluster.realnode.gpu_driver import DRIVER, GpuDriver
from toposerve.localcluster.realnode.pods import busybox_pod
from toposerve.localcluster.results import write
from toposerve.localcluster.scale.measure import latency_ms

REPO = Path(__file__).resolve().parent.parent
CLUSTER = "bench-realnode"
TEMPLATE = "bench-one-gpu"
POLL_S = 0.02


def _until(what: str, check: Callable[[], bool], timeout_s: float = 60) -> float:
    """Seconds until ``check`` holds (polled every 20 ms)."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(what)
        time.sleep(POLL_S)
    return time.monotonic() - t0


def _driver_seconds(log: Path, msg: str) -> list[float]:
    out = []
    for line in log.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("msg") == msg and rec.get("result") == "ok":
            out.append(float(rec["seconds"]))
    return out


def _one_pod(core: Any, name: str, claim: bool) -> tuple[float, float]:
    claims = [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}] if claim else []
    t0 = time.monotonic()
    # exits on SIGTERM, so a graceful delete measures the kubelet's teardown, not a grace period
    core.create_namespaced_pod("default", busybox_pod(
        name, "trap 'exit 0' TERM; sleep 3600 & wait", claims=claims))
    _until(f"{name} Running", lambda: core.read_namespaced_pod(
        name, "default").status.phase == "Running")
    started = time.monotonic() - t0
    t1 = time.monotonic()
    # graceful: the pod object goes once the kubelet has stopped it and unprepared its claim
    core.delete_namespaced_pod(name, "default", grace_period_seconds=5)
    _until(f"{name} gone", lambda: not core.list_namespaced_pod(
        "default", field_selector=f"metadata.name={name}").items)
    return started, time.monotonic() - t1


def run(pods: int, workdir: Path, wait_s: float) -> dict[str, list[float]]:
    up(ClusterSpec(name=CLUSTER, groups=[("hgx-h100", 1)]), progress=lambda m: None)
    driver = GpuDriver(kubeconfig_path(CLUSTER), workdir)
    try:
        realnode.start(CLUSTER, progress=lambda m: None, wait_s=wait_s)
        api = api_client(CLUSTER)
        core: Any = client.CoreV1Api(api)
        res: Any = client.ResourceV1Api(api)
        res.create_device_class({"metadata": {"name": "bench-gpu"}, "spec": {"selectors": [
            {"cel": {"expression": f"device.driver == '{DRIVER}' && "
                                   f"device.attributes['{DRIVER}'].type == 'gpu'"}}]}})
        res.create_namespaced_resource_claim_template("default", {
            "metadata": {"name": TEMPLATE}, "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "bench-gpu"}}]}}}})
        driver.start()
        times: dict[str, list[float]] = {k: [] for k in (
            "start_plain", "start_claim", "delete_plain", "delete_claim")}
        for i in range(pods):
            for kind in ("plain", "claim"):
                s, d = _one_pod(core, f"bench-{kind}-{i}", kind == "claim")
                times[f"start_{kind}"].append(s)
                times[f"delete_{kind}"].append(d)
        times["driver_prepare"] = _driver_seconds(driver.log, "prepare")
        times["driver_unprepare"] = _driver_seconds(driver.log, "unprepare")
        return times
    finally:
        driver.stop()
        down(CLUSTER, progress=lambda m: None)  # the real node goes with it


ROWS = [("start_plain", "pod create → Running, no claim"),
        ("start_claim", "pod create → Running, one-GPU claim (incl. allocation, prepare)"),
        ("delete_plain", "pod delete → gone, no claim"),
        ("delete_claim", "pod delete → gone, one-GPU claim (incl. unprepare)"),
        ("driver_prepare", "NodePrepareResources in the driver, per claim"),
        ("driver_unprepare", "NodeUnprepareResources in the driver, per claim")]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.realnode_prepare", description=__doc__)
    ap.add_argument("--pods", type=count, default=20, help="pods of each kind (default 20)")
    ap.add_argument("--wait", type=positive, default=600,
                    help="seconds to wait for the machine's one real node if another "
                         "cluster has it (default 600)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        times = run(args.pods, Path(tmp), args.wait)
    ms = {k: latency_ms(v) for k, v in times.items()}
    md = latency_table({label: ms[k] for k, label in ROWS})
    write(Path(args.out), "realnode_prepare", md,
                 {"pods_each": args.pods, "poll_s": POLL_S, "latency": ms, "raw_s": times})
    return 0


if __name__ == "__main__":
    sys.exit(main())
