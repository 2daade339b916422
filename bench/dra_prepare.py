"""Prepare latency of ``toposerve driver gpu`` through the gRPC client (no
kubelet): a one-node kwok cluster (hgx-h100), the driver on that node with
a fake sysfs tree, one-GPU claims allocated by the real scheduler one at a
time, each prepared (first time, then again: the checkpointed answer) and
unprepared by a client built from our protos; plus the liveness call (an
empty prepare). Times are per claim, client side; prints a table and
writes JSON. The kubelet path: ``bench.realnode_prepare``."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kubernetes import client

from bench.flags import count
from bench.report import latency_table
from harness.dra_gpu import (
    CLASS,
    DRIVER,
    NAMESPACE,
    DriverProc,
    GpuEnv,
    create_claim,
    delete_claim,
    wait_slices,
)
from toposerve.localcluster.cluster import ClusterSpec, down, up
from toposerve.localcluster.clusters import api_client, kubeconfig_path
from toposerve.localcluster.results import write
from toposerve.localcluster.scale.measure import latency_ms
from toposerve.topology.profiles import load_profile
from toposerve.topology.sysfs import write_profile_sysfs

CLUSTER = "bench-dra-prepare"
NODE = "hgx-h100-0000"


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(claims: int, empty_calls: int, out: Path) -> None:
    up(ClusterSpec(name=CLUSTER, groups=[("hgx-h100", 1)]),
       progress=lambda m: print(f"[cluster] {m}", file=sys.stderr))
    try:
        api = api_client(CLUSTER)
        core: Any = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": NAMESPACE}})
        res: Any = client.ResourceV1Api(api)
        res.create_device_class({
            "metadata": {"name": CLASS},
            "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}})
        with tempfile.TemporaryDirectory(prefix="dra-prepare-") as tmp:
            root = Path(tmp)
            dev = root / "dev"
            dev.mkdir()
            for n in [*(f"nvidia{i}" for i in range(8)), "nvidiactl", "nvidia-uvm",
                      "nvidia-uvm-tools"]:
                (dev / n).touch()
            env = GpuEnv(cluster_name=CLUSTER, api=api, kubeconfig=kubeconfig_path(CLUSTER),
                         sysfs=write_profile_sysfs(load_profile("hgx-h100"), root / "sysfs"),
                         dev=dev, node=NODE)
            driver = DriverProc(env, root / "driver")
            (root / "driver").mkdir()
            driver.start()
            try:
                wait_slices(api, NODE)
                series: dict[str, list[float]] = {"prepare": [], "prepare again": [],
                                                  "unprepare": [], "empty prepare": []}
                kubelet = driver.kubelet
                for i in range(claims):
                    c = create_claim(api, f"bench-{i}", node=NODE)
                    series["prepare"].append(_timed(lambda c=c: kubelet.prepare([c])))
                    series["prepare again"].append(_timed(lambda c=c: kubelet.prepare([c])))
                    series["unprepare"].append(_timed(lambda c=c: kubelet.unprepare([c])))
                    delete_claim(api, c)
                for _ in range(empty_calls):
                    series["empty prepare"].append(_timed(lambda: kubelet.prepare([])))
            finally:
                driver.stop()
        ms = {k: latency_ms(v) for k, v in series.items()}
        rows = [{"call": k, **v} for k, v in ms.items()]
        write(out, "dra_prepare", latency_table(ms, "call"), {"claims": claims, "rows": rows,
                                              "node": NODE, "client": "grpc over unix socket"})
    finally:
        down(CLUSTER)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.dra_prepare", description=__doc__)
    p.add_argument("--claims", type=count, default=30)
    p.add_argument("--empty-calls", type=count, default=200)
    p.add_argument("--out", type=Path, default=Path("bench/results"))
    a = p.parse_args(argv)
    run(a.claims, a.empty_calls, a.out)


if __name__ == "__main__":
    main()
