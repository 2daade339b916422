"""``make bench``: DRA scheduling throughput with ``driver simulate``'s
slices, side by side with plain pods, one cluster per variant, in one run.

Shaped like upstream scheduler_perf's ``SchedulingWithResourceClaimTemplate``:
N nodes with DRA devices, one DeviceClass, one ResourceClaimTemplate asking
for one device, a batch of pods scheduled first (not measured), then the
measured batch; throughput is measured pods over the time from the first
measured create to the last bind. The same two batches without claims run
first on each cluster for the plain figure.

The variants take away, one at a time, what costs the stock 1.37.2
control plane time on these slices (docs/scale.md): the GPUs' partitions,
the NIC driver's slices beside the GPUs', the requeue scan that every
claim creation starts (``SchedulerPreQueueingHints``, alpha in 1.37), and
the garbage collector's share of the apiserver and scheduler (GOGC).

Client rate limits decide throughput here (docs/design.md §7): by default the
scheduler runs with ``clientConnection: {qps: 1000, burst: 1000}`` and the
controller-manager (which makes the claims from the template) with
``--kube-api-qps/--kube-api-burst 1000``; ``--qps 0`` keeps the components'
defaults. The test client creates pods from 32 threads without a limit.

    python -m bench.dra_sched --nodes 500 --init-pods 2000 --measure-pods 2000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import urllib3
import yaml

from bench.flags import count, count_or_zero
from harness.cluster_claim import claimed
from toposerve.dra_driver.gpu.devices import DRIVER as GPU_DRIVER
from toposerve.dra_driver.simulate import POOLS, Simulator, label_partitions
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster.cluster import ClusterSpec, down, up
from toposerve.localcluster.clusters import api_client
from toposerve.localcluster.nodes import KWOK_TOLERATION
from toposerve.localcluster.results import table as md_table
from toposerve.localcluster.results import write
from toposerve.localcluster.scale import profile
from toposerve.localcluster.scale.measure import Watched, bound_pod

REPO = Path(__file__).resolve().parents[1]
RES = "/apis/resource.k8s.io/v1"
CLASS = "bench-gpu"
PREQUEUE = "SchedulerPreQueueingHints=true"


@dataclass(frozen=True)
class Variant:
    name: str
    what: str
    partitions: bool = False
    drivers: tuple[str, ...] = tuple(POOLS)
    scheduler_gates: str = ""
    gogc: tuple[tuple[str, int], ...] = ()


GOGC = (("kube-apiserver", 400), ("kube-scheduler", 400))
VARIANTS = {v.name: v for v in (
    Variant("partitions", "GPUs with their partitions, and NICs", partitions=True),
    Variant("whole-gpus", "whole GPUs and NICs (nodes labelled partitions=off)"),
    Variant("gpu-driver", "whole GPUs, the GPU driver alone", drivers=(GPU_DRIVER,)),
    Variant("gpu-driver-prequeue", "the same, scheduler with SchedulerPreQueueingHints",
            drivers=(GPU_DRIVER,), scheduler_gates=PREQUEUE),
    Variant("gpu-driver-prequeue-gogc", "the same, apiserver and scheduler with GOGC=400",
            drivers=(GPU_DRIVER,), scheduler_gates=PREQUEUE, gogc=GOGC),
    Variant("whole-gpus-prequeue-gogc", "whole GPUs and NICs, SchedulerPreQueueingHints, "
            "GOGC=400", scheduler_gates=PREQUEUE, gogc=GOGC),
)}
# partitions take the scheduler ten times longer a pod: asked for by name only
DEFAULT_VARIANTS = ("whole-gpus", "gpu-driver", "gpu-driver-prequeue",
                    "gpu-driver-prequeue-gogc", "whole-gpus-prequeue-gogc")


def _pod(name: str, claims: bool) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.invalid/sim:0"}
    spec: dict[str, Any] = {"containers": [container], "tolerations": [KWOK_TOLERATION]}
    if claims:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _batch(rest: JsonApi, pool: ThreadPoolExecutor, binds: Watched, ns: str, prefix: str,
           n: int, claims: bool, timeout: float) -> tuple[float, float]:
    """Create n pods, wait until all are bound: (first create, last bind)."""
    names = {f"{prefix}-{i}" for i in range(n)}
    t0 = time.monotonic()
    list(pool.map(lambda p: rest.request("POST", f"/api/v1/namespaces/{ns}/pods",
                                         body=_pod(p, claims)), sorted(names)))
    while len(names & (at := binds.snapshot()).keys()) < n:
        if time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{prefix}: {len(names & at.keys())}/{n} bound after "
                               f"{timeout:.0f}s")
        time.sleep(0.1)
    return t0, max(at[p] for p in names)


def _namespace(rest: JsonApi, ns: str) -> None:
    rest.request("POST", "/api/v1/namespaces", body={
        "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    deadline = time.monotonic() + 60
    while True:
        try:
            rest.request("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default")
            return
        except ApiError as err:
            if err.status != 404 or time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def _profile_scheduler(cluster: str, seconds: int, out: Path) -> threading.Thread:
    """A CPU profile of the scheduler over the next ``seconds``, in a thread."""
    def take() -> None:
        try:
            path = profile.cpu_profile(cluster, "kube-scheduler", seconds, out)
            _, binary = profile.component(cluster, "kube-scheduler")
            print(f"  scheduler CPU profile: {path}\n{profile.top(binary, path)}",
                  file=sys.stderr)
        except (OSError, RuntimeError, LookupError, urllib3.exceptions.HTTPError) as err:
            print(f"  scheduler CPU profile failed: {err}", file=sys.stderr)
    t = threading.Thread(target=take, daemon=True)
    t.start()
    return t


def run(nodes: int, profile_name: str, init: int, measure: int, qps: int, tmp: Path,
        variant: Variant, cpu_profile: int = 0,
        out: Path = REPO / "bench" / "results") -> list[dict[str, Any]]:
    name = f"dra-sched-{nodes}"
    sched_cfg = None
    if qps:
        sched_cfg = tmp / "scheduler.yaml"
        sched_cfg.write_text(yaml.safe_dump({
            "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"qps": qps, "burst": qps}}))
    up(ClusterSpec(name=name, groups=[(profile_name, nodes)], scheduler_config=sched_cfg,
                   controller_manager_qps=qps or None,
                   scheduler_feature_gates=variant.scheduler_gates, gogc=dict(variant.gogc)),
       progress=lambda m: print(f"  [{name}] {m}", file=sys.stderr, flush=True))
    api = api_client(name)
    rest = JsonApi(api)
    if not variant.partitions:
        label_partitions(api, (n["metadata"]["name"] for n in
                               rest.request("GET", "/api/v1/nodes")["items"]), on=False)
    sim = Simulator(api, drivers=variant.drivers)
    rows = []
    try:
        sim.start()
        t0 = time.monotonic()
        while not (sim.ready() and len(sim.nodes()) == nodes):
            if time.monotonic() - t0 > 600:
                raise RuntimeError("slices not published in 600 s")
            time.sleep(0.5)
        print(f"  slices for {nodes} nodes published in {time.monotonic() - t0:.1f}s",
              file=sys.stderr)
        rest.request("POST", f"{RES}/deviceclasses", body={
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": CLASS}, "spec": {"selectors": [{"cel": {"expression":
                "device.driver == 'gpu.toposerve.io' && "
                "device.attributes['gpu.toposerve.io'].type == 'gpu'"}}]}})
        with ThreadPoolExecutor(max_workers=32) as pool:
            for mode in ("plain", "claims"):
                ns = f"bench-{mode}"
                _namespace(rest, ns)
                if mode == "claims":
                    rest.request("POST", f"{RES}/namespaces/{ns}/resourceclaimtemplates", body={
                        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                        "metadata": {"name": "one-gpu"},
                        "spec": {"spec": {"devices": {"requests": [
                            {"name": "gpu", "exactly": {"deviceClassName": CLASS}}]}}}})
                binds = Watched(rest, f"/api/v1/namespaces/{ns}/pods", "", bound_pod).start()
                try:
                    _batch(rest, pool, binds, ns, "init", init, mode == "claims", 900)
                    prof = None
                    if cpu_profile and mode == "claims":
                        out.mkdir(parents=True, exist_ok=True)
                        prof = _profile_scheduler(name, cpu_profile, out / (
                            f"dra_sched-{profile_name}-{variant.name}-scheduler.pprof"))
                    first, last = _batch(rest, pool, binds, ns, "measure", measure,
                                         mode == "claims", 900)
                    if prof is not None:
                        prof.join(cpu_profile + 90)
                finally:
                    binds.stop()
                rows.append({"mode": mode, "nodes": nodes, "profile": profile_name,
                             "variant": variant.name, "what": variant.what,
                             "init_pods": init, "measured_pods": measure,
                             "seconds": round(last - first, 1),
                             "pods_per_s": round(measure / (last - first), 1),
                             "client_qps": qps or "defaults"})
                print(f"  {variant.name} {mode}: {rows[-1]['pods_per_s']} pods/s",
                      file=sys.stderr)
    finally:
        sim.stop()
        down(name, progress=lambda m: None)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.dra_sched", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=count, default=500)
    ap.add_argument("--profile", default="hgx-h100",
                    help="hgx-h100: 8 partitionable GPUs a node; mi300x: 8 GPUs, no partitions")
    ap.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                    help="comma-separated, each on a cluster of its own, in this order: "
                         + "; ".join(f"{v.name}: {v.what}" for v in VARIANTS.values())
                         + " (default %(default)s)")
    ap.add_argument("--init-pods", type=count_or_zero, default=1000)
    ap.add_argument("--measure-pods", type=count, default=1000)
    ap.add_argument("--qps", type=count_or_zero, default=1000,
                    help="scheduler and controller-manager client QPS and burst (0: defaults)")
    ap.add_argument("--cpu-profile", type=count_or_zero, default=0, metavar="SECONDS",
                    help="take a CPU profile of the scheduler over the first SECONDS of the "
                         "measured claim pods (written beside the results, its top printed)")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args(argv)
    names = [n for n in args.variants.split(",") if n]
    if unknown := [n for n in names if n not in VARIANTS]:
        ap.error(f"--variants: unknown {', '.join(unknown)}; choose from {', '.join(VARIANTS)}")
    rows: list[dict[str, Any]] = []
    with claimed(f"dra-sched-{args.nodes}"), tempfile.TemporaryDirectory() as tmp:
        for n in names:
            rows += run(args.nodes, args.profile, args.init_pods, args.measure_pods, args.qps,
                        Path(tmp), VARIANTS[n], cpu_profile=args.cpu_profile,
                        out=Path(args.out))
    write(Path(args.out), "dra_sched", table(rows), {"rows": rows})
    return 0


def table(rows: list[dict[str, Any]]) -> str:
    """The rows, each variant's claim pods against its plain pods and the first variant's."""
    rate = {(r["variant"], r["mode"]): r["pods_per_s"] for r in rows}
    first = rows[0]["variant"] if rows else ""

    def line(r: dict[str, Any]) -> list[object]:
        v, claims = r["variant"], r["mode"] == "claims"
        own = f"{rate[(v, 'claims')] / rate[(v, 'plain')]:.2f}x" if claims else ""
        base = f"{rate[(v, 'claims')] / rate[(first, 'claims')]:.2f}x" if claims else ""
        return [v, r["what"], r["mode"], f"{r['measured_pods']} (+{r['init_pods']})",
                r["seconds"], r["pods_per_s"], own, base, r["client_qps"]]
    return md_table(["variant", "slices", "pods", "measured pods (after init)", "seconds",
                     "pods/s", "claims / plain", f"claims / {first} claims", "client QPS"],
                    map(line, rows), "lllrrrrrl")


if __name__ == "__main__":
    sys.exit(main())
