"""``make scale``: ResourceSlice publishing for a big kwok cluster by one
``toposerve driver simulate`` process (a subprocess, as a user runs it).

For N fake nodes of a profile (default 1,000 x mi300x: 8 GPUs and 8 NICs;
then 1,000 x hgx-h100, whose 8 GPUs each add 9 MIG-like partitions through
shared counters, 88 devices a node): the time until every slice is visible,
API writes per node, the publisher's CPU and peak memory; then a restart (a
full resync: LIST, compare every pool) and a steady-state window, both of
which must write nothing.

    python -m bench.dra_publish --nodes 1000
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.flags import count, positive
from harness.cluster_claim import claimed
from harness.procs import Proc, wait_http
from toposerve.dra_driver.gpu.devices import gpu_pool
from toposerve.dra_driver.net.devices import nic_pool
from toposerve.dra_driver.resourceslice import slice_plan
from toposerve.dra_driver.simulate import LABELS
from toposerve.kubeapi import JsonApi
from toposerve.localcluster.cluster import ClusterSpec, up
from toposerve.localcluster.clusters import api_client
from toposerve.localcluster.ports import free_port
from toposerve.localcluster.results import table, write
from toposerve.localcluster.scale.measure import ProcSampler, by_label, scrape_url, totals
from toposerve.topology.model import DomainPath, NodeTopology
from toposerve.topology.profiles import load_profile

REPO = Path(__file__).resolve().parents[1]
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
# metadata only: counting thousands of slices should not move their devices
META = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"


def per_node(profile: str) -> tuple[int, int]:
    """(slices, devices) of one node of the profile."""
    node = NodeTopology(name="n", path=DomainPath(host="n"), profile=profile,
                        hardware=load_profile(profile).hardware())
    pools = (gpu_pool(node), nic_pool(node))
    return sum(len(slice_plan.split(p)) for p in pools), sum(len(p.devices) for p in pools)


def count_slices(rest: JsonApi) -> int:
    sel = ",".join(f"{k}={v}" for k, v in LABELS.items())
    n, cont = 0, ""
    while True:
        q = [("labelSelector", sel), ("limit", 2000)] + ([("continue", cont)] if cont else [])
        data = rest.request("GET", SLICES, q, accept=META, timeout=60)
        n += len(data.get("items") or ())
        cont = data.get("metadata", {}).get("continue", "")
        if not cont:
            return n


def peak_rss(proc: Proc) -> ProcSampler:
    """The process's peak RSS, sampled every 0.2 s until ``stop()``."""
    sampler = ProcSampler(interval=0.2)
    sampler.watch({proc.popen.pid: "simulate"})
    return sampler.start()


def start_simulate(cluster: str, log: Path) -> Proc:
    port = free_port()
    started = time.monotonic()
    p = subprocess.Popen(
        [sys.executable, "-m", "toposerve.main", "driver", "simulate", "--cluster", cluster,
         "--http-address", f"127.0.0.1:{port}"],
        stdout=log.open("wb"), stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    proc = Proc(f"http://127.0.0.1:{port}", p, log, {"started": started})
    wait_http(proc.url + "/healthz", p, log, timeout=120)
    return proc


def writes(proc: Proc) -> dict[str, float]:
    return dict(totals(scrape_url(proc.url + "/metrics"), "toposerve_dra_slice_writes_total",
                       by_label("op")))


def wait_ready(proc: Proc, rest: JsonApi, want: int, timeout: float) -> float:
    """Seconds from the process's start until every slice is visible and
    the publisher has nothing left to write."""
    import httpx

    t0: float = proc.extra["started"]
    while time.monotonic() - t0 < timeout:
        if proc.popen.poll() is not None:
            raise RuntimeError(f"simulate exited: {proc.log.read_text()[-2000:]}")
        if count_slices(rest) >= want and httpx.get(proc.url + "/readyz").status_code == 200:
            return time.monotonic() - t0
        time.sleep(0.25)
    raise RuntimeError(f"not published after {timeout:.0f}s: {count_slices(rest)}/{want}")


def run(nodes: int, profile: str, steady_s: float, tmp: Path) -> dict[str, Any]:
    name = f"dra-pub-{nodes}"
    with claimed(name):
        up(ClusterSpec(name=name, groups=[(profile, nodes)]),
           progress=lambda m: print(f"  [{name}] {m}", file=sys.stderr, flush=True))
        rest = JsonApi(api_client(name))
        slices, devices = per_node(profile)
        want = nodes * slices
        # CPU from the process's start: imports, pools, writes, watch events
        sim = start_simulate(name, tmp / "simulate-1.log")
        peak = peak_rss(sim)
        publish_s = wait_ready(sim, rest, want, timeout=900)
        first = writes(sim)
        cpu_publish = sim.cpu_seconds()
        sim.stop()
        rss_publish = peak.stop()[0]["peak_rss_mib"]
        # a restarted publisher: LIST, compare every pool, write nothing
        sim = start_simulate(name, tmp / "simulate-2.log")
        peak = peak_rss(sim)
        resync_s = wait_ready(sim, rest, want, timeout=600)
        cpu_resync = sim.cpu_seconds()
        resync = writes(sim)
        time.sleep(steady_s)  # a window of kwok heartbeats and watch traffic
        steady = writes(sim)
        sim.stop()
        rss_resync = peak.stop()[0]["peak_rss_mib"]
    total = sum(first.values())
    return {"nodes": nodes, "profile": profile, "slices": want, "devices_per_node": devices,
            "publish_s": round(publish_s, 1), "writes": int(total),
            "writes_per_node": round(total / nodes, 2), "writes_by_op": first,
            "cpu_publish_s": round(cpu_publish, 1), "peak_rss_mib": round(rss_publish),
            "resync_s": round(resync_s, 1), "resync_writes": int(sum(resync.values())),
            "cpu_resync_s": round(cpu_resync, 1), "resync_peak_rss_mib": round(rss_resync),
            "steady_s": steady_s, "steady_writes": int(sum(steady.values()))}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.dra_publish", description=__doc__)
    ap.add_argument("--nodes", type=count, default=1000)
    ap.add_argument("--profile", nargs="+", default=["mi300x", "hgx-h100"],
                    help="one run each (default: 8 GPUs + 8 NICs as they are, then with "
                         "MIG-like partitions)")
    ap.add_argument("--steady", type=positive, default=30.0,
                    help="seconds of steady state watched for writes after the resync")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args(argv)
    rows = []
    for profile in args.profile:
        with tempfile.TemporaryDirectory() as tmp:
            rows.append(run(args.nodes, profile, args.steady, Path(tmp)))
    md = table(["nodes", "profile", "devices / node", "slices", "all visible (s)",
                "API writes / node", "publisher CPU (s)", "peak RSS (MiB)", "resync (s)",
                "resync writes", "steady-state writes"],
               ([r["nodes"], r["profile"], r["devices_per_node"], r["slices"], r["publish_s"],
                 r["writes_per_node"], r["cpu_publish_s"], r["peak_rss_mib"], r["resync_s"],
                 r["resync_writes"], f"{r['steady_writes']} ({r['steady_s']:g} s)"]
                for r in rows), "rl" + "r" * 9)
    write(Path(args.out), "dra_publish", md, {"runs": rows})
    ok = all(r["resync_writes"] == 0 and r["steady_writes"] == 0 for r in rows)
    if not ok:
        print("writes on resync or in steady state: there must be none", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
