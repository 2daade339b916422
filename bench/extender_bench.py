"""Group placement side by side on the same kwok cluster and the same
interleaved mix of wide-EP groups, P/D slices and ordinary pods: the default
kube-scheduler alone; the in-tree 1.37.2 workload scheduling with its gates on
(a PodGroup per group, one hard topology level); and the toposerve extender.
Then the extender's own call latency, names-only, at 1,000 and 5,000 nodes:
GB200 racks with groups held in racks, and HGX nodes with 100 P/D slices
whose first members each decide a domain (``--fleets``).

    python -m bench.extender_bench [--racks 4] [--hgx 16] [--nodes 1000 5000]
    python -m bench.extender_bench --latency-only [--runs 3] [--cpu]   # no cluster

Writes bench/results/extender_bench.{md,json,png} (latency only:
extender_latency.{md,json}). The local cluster's
controller-manager keeps its default client QPS (claim creation is the
bottleneck of pods/s here, docs/design.md §7) unless --cm-qps; the scheduler's is 1,000.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.flags import count, count_or_zero, positive
from bench.report import medians, pct
from harness import extender_objects as k
from harness.extender_cluster import GpuCluster, create_pods, gpu_cluster, pods, rest
from harness.waiting import wait_for
from toposerve.localcluster.results import landed_bars, pyplot, save, write
from toposerve.localcluster.results import table as md_table
from toposerve.scheduler_ext.config import ExtenderConfig
from toposerve.scheduler_ext.server import Extender
from toposerve.topology.distance import kv_transfer_seconds
from toposerve.topology.model import DomainPath
from toposerve.topology.profiles import load_profile

MODES = ("default", "in-tree", "toposerve")
GROUP_LABEL = "bench.toposerve.io/group"


@dataclass(frozen=True)
class GroupSpec:
    name: str
    pods: int
    gpus: int  # per pod
    profile: str
    roles: tuple[str, ...] = ()  # P/D: the role of each pod

    @property
    def demand(self) -> int:
        return self.pods * self.gpus


def mix(racks: int, hgx_racks: int, ep_groups: int = 10) -> list[GroupSpec]:
    """Wide-EP groups that fill the GB200 racks exactly when packed well
    (whole, half, quarter racks), P/D slices for the HGX racks."""
    out: list[GroupSpec] = []
    # trays (4 GPUs each) per group: the first ten take 63 of 4 racks x 18, so each
    # group has a rack whatever the order (whole, half, two-thirds and one-third
    # racks); more groups repeat the pattern, within 7/8 of the racks
    sizes = [18, 9, 9, 12, 6, 9, 18, 9, 12, 6]
    left, i = racks * 18 * 7 // 8, 0
    for s in (sizes[j % len(sizes)] for j in range(ep_groups)):
        if s <= left:
            out.append(GroupSpec(f"ep-{i}", s, 4, "gb200-nvl72"))
            left, i = left - s, i + 1
    for j in range(hgx_racks):  # a slice: 2 prefill + 2 decode of 4 GPUs; 16 of a rack's 32
        out.append(GroupSpec(f"pd-{j}", 4, 4, "hgx-h100",
                             ("prefill", "prefill", "decode", "decode")))
    return out


def manifests(groups: list[GroupSpec], mode: str, plain: int,
              seed: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(PodGroups, pods in arrival order) for ``mode``: the same pods, labelled
    for our extender (toposerve.io/*) or joined to in-tree PodGroups."""
    pod_groups = []
    out = []
    for g in groups:
        level = "rack"
        if mode == "in-tree":
            pod_groups.append(k.pod_group(g.name, g.pods, "topology.toposerve.io/rack"))
        for i in range(g.pods):
            labels = {GROUP_LABEL: g.name}
            if g.roles:
                labels["llm-d.ai/role"] = g.roles[i]
            spec: dict[str, Any] = {}
            if mode == "toposerve":
                labels.update({"toposerve.io/group": g.name,
                               "toposerve.io/group-size": str(g.pods)})
                labels["toposerve.io/preferred-topology-level" if g.roles else
                       "toposerve.io/topology-level"] = "nvlink" if g.roles else level
            if mode == "in-tree":
                spec = {"schedulingGroup": {"podGroupName": g.name}}
            out.append(k.pod(f"{g.name}-{i}", labels=labels, claim_template=f"gpu{g.gpus}",
                             profile=g.profile, spec=spec))
    out += [k.pod(f"web-{i}", labels={GROUP_LABEL: "plain"}) for i in range(plain)]
    random.Random(seed).shuffle(out)
    return pod_groups, out


@dataclass
class Placement:
    mode: str
    nodes: int
    groups: int
    single_domain: int  # groups wholly bound inside one rack
    could: int  # groups that fit a single rack at submission
    stranded: int  # pods bound for groups that are not wholly bound
    pending: int  # pods of groups never bound
    kv_ms: float  # modelled KV transfer per request, P/D slices, mean
    largest_free_rack: int  # GPUs, after the run
    free_racks: int  # GB200 racks left wholly free
    pods_per_s: float
    seconds: float
    # the extender's filter calls during the run, from its /metrics histogram: the
    # upper bounds of the buckets holding the median and the 99th percentile
    filter_p50_ms: float = float("nan")
    filter_p99_ms: float = float("nan")


def _gpus(profile: str) -> int:
    return len([d for d in load_profile(profile).hardware().devices() if d.kind == "gpu"])


def measure(gc: GpuCluster, groups: list[GroupSpec], mode: str, plain: int, seed: int,
            timeout: float) -> tuple[Placement, dict[str, dict[str, str]]]:
    pgs, arrivals = manifests(groups, mode, plain, seed)
    for pg in pgs:
        rest(gc.api).request("POST", "/apis/scheduling.k8s.io/v1beta1/namespaces/default/"
                                     "podgroups", body=pg)
    total = len(arrivals)
    started = time.monotonic()
    create_pods(gc.api, arrivals)
    last = [0, started]

    def settled() -> bool:
        bound = sum(1 for p in pods(gc.api, GROUP_LABEL) if p["spec"].get("nodeName"))
        if bound != last[0]:
            last[:] = [bound, time.monotonic()]
        # all bound, or nothing new for 15 s (the rest waits for good)
        return bound == total or time.monotonic() - last[1] > 15
    wait_for(f"{mode}: pods settled", settled, timeout=timeout, interval=0.5)
    where: dict[str, dict[str, str]] = defaultdict(dict)
    for p in pods(gc.api, GROUP_LABEL):
        g = p["metadata"]["labels"][GROUP_LABEL]
        if p["spec"].get("nodeName") and g != "plain":
            where[g][p["metadata"]["name"]] = p["spec"]["nodeName"]
    single = stranded = pending = 0
    kv: list[float] = []
    for g in groups:
        nodes = where.get(g.name, {})
        racks = {gc.paths[n].rack for n in nodes.values()}
        if len(nodes) == g.pods and len(racks) == 1:
            single += 1
        if 0 < len(nodes) < g.pods:
            stranded += len(nodes)
        pending += g.pods - len(nodes)
        if g.roles and len(nodes) == g.pods:
            kv.append(_kv(gc.paths, g, nodes))
    used: dict[str | None, int] = defaultdict(int)
    cap: dict[str | None, int] = defaultdict(int)
    for path in gc.paths.values():
        if path.host.startswith("gb200"):
            cap[path.rack] += _gpus("gb200-nvl72")
    for g in groups:
        for n in where.get(g.name, {}).values():
            used[gc.paths[n].rack] += g.gpus
    bound_pods = last[0]
    span = max(1e-9, last[1] - started)
    p50, p99 = call_quantiles(gc.extender.metrics(), "filter", (0.5, 0.99)) \
        if gc.extender is not None else (float("nan"), float("nan"))
    return Placement(mode, len(gc.paths), len(groups), single, sum(1 for g in groups if g.demand <=
                                                    (72 if not g.roles else 32)),
                     stranded, pending, 1000 * sum(kv) / len(kv) if kv else float("nan"),
                     max((cap[r] - used[r] for r in cap), default=0),
                     sum(1 for r in cap if used[r] == 0), bound_pods / span, span,
                     1000 * p50, 1000 * p99), dict(where)


def call_quantiles(metrics: str, verb: str, qs: tuple[float, ...]) -> tuple[float, ...]:
    """Seconds: for each quantile, the upper bound of the histogram bucket of
    ``toposerve_extender_call_seconds{verb}`` that holds it."""
    from prometheus_client.parser import text_string_to_metric_families

    buckets: list[tuple[float, float]] = []
    for fam in text_string_to_metric_families(metrics):
        if fam.name == "toposerve_extender_call_seconds":
            buckets = sorted((float(s.labels["le"]), s.value) for s in fam.samples
                             if s.name.endswith("_bucket") and s.labels.get("verb") == verb)
    total = buckets[-1][1] if buckets else 0.0
    return tuple(next((le for le, n in buckets if n >= q * total), float("nan"))
                 if total else float("nan") for q in qs)


def _kv(paths: dict[str, DomainPath], g: GroupSpec, nodes: dict[str, str]) -> float:
    links = load_profile(g.profile).links()
    pre = [paths[nodes[f"{g.name}-{i}"]] for i, r in enumerate(g.roles) if r == "prefill"]
    dec = [paths[nodes[f"{g.name}-{i}"]] for i, r in enumerate(g.roles) if r == "decode"]
    kv_bytes = 8 * 2**30
    return sum(min(kv_transfer_seconds(kv_bytes, p, d, links) for p in pre)
               for d in dec) / len(dec)


def placement_runs(args: argparse.Namespace, workdir: Path) -> tuple[list[Placement],
                                                                       dict[str, Any]]:
    groups = mix(args.racks, args.hgx // 4, args.ep_groups)
    shape = [("gb200-nvl72", args.racks * 18), ("hgx-h100", args.hgx)]
    rows: list[Placement] = []
    landed: dict[str, Any] = {}
    for mode in args.modes:
        with gpu_cluster(f"extbench-{mode}", shape, workdir, extender=mode == "toposerve",
                         workload_gates=mode == "in-tree",
                         controller_manager_qps=args.cm_qps,
                         progress=lambda m, mode=mode: print(f"[{mode}] {m}",
                                                             file=sys.stderr)) as gc:
            row, where = measure(gc, groups, mode, args.plain, args.seed, args.timeout)
            rows.append(row)
            if gc.extender is not None:  # its decisions, to read where a group went and why
                out = Path(args.out)
                out.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(gc.extender.workdir / f"extender-{gc.extender.starts}.log",
                                out / f"{args.name}-extender.log")
            landed[mode] = {g: sorted({str(gc.paths[n].rack) for n in w.values()})
                            for g, w in where.items()}
            landed[mode + "/gpus"] = _rack_use(gc, groups, where)
            print(f"[{mode}] {row}", file=sys.stderr)
    return rows, landed


def _rack_use(gc: GpuCluster, groups: list[GroupSpec],
              where: dict[str, dict[str, str]]) -> dict[str, dict[str, int]]:
    """rack -> group -> GPUs, for the picture."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for g in groups:
        for n in where.get(g.name, {}).values():
            out[str(gc.paths[n].rack)][g.name] += g.gpus
    return {r: dict(v) for r, v in sorted(out.items())}


# --- extender call latency: the extender in its own process, over loopback HTTP ---------

@dataclass
class Latency:
    nodes: int
    kind: str  # ordinary | group | ordinary+claim (a pod of no group asking 4 GPUs)
    #            | pd-slice (HGX nodes: a P/D slice's member, the first PD_SLICES calls
    #              each a slice's first, which decides its domain)
    calls: int
    filter_p50_ms: float
    filter_p99_ms: float
    prioritize_p50_ms: float
    prioritize_p99_ms: float


LATENCY_GROUPS = 8  # groups of 18 pods held in racks
# which pods each fleet's rows call about: GB200 racks, and HGX nodes with P/D slices
FLEETS = {"gb200-nvl72": ("ordinary", "group", "ordinary+claim"), "hgx-h100": ("pd-slice",)}
PD_SLICE = mix(0, 1, 0)[0]  # 2 prefill + 2 decode pods of 4 GPUs, NVLink preferred
PD_SLICES = 100  # as many as hgx-1000 has; none bound, so every promise stays live


def latency_pods(nodes: int) -> tuple[list[str], list[list[dict[str, Any]]]]:
    """The node names and the group pods of the GB200 latency rows (the same
    in the extender's process and the client's)."""
    names = [n.name for n in k.planned(("gb200-nvl72", nodes))]
    return names, [k.toposerve_pods(f"g{i}", 18, claim_template="gpu4", level="rack",
                                    uid_prefix=f"g{i}") for i in range(LATENCY_GROUPS)]


def pd_pods(nodes: int) -> tuple[list[str], list[list[dict[str, Any]]]]:
    """The HGX node names and the P/D slices' pods, labelled as
    ``manifests`` labels them for the extender."""
    names = [n.name for n in k.planned(("hgx-h100", nodes))]
    slices = [GroupSpec(f"pd-{i}", PD_SLICE.pods, PD_SLICE.gpus, PD_SLICE.profile,
                        PD_SLICE.roles) for i in range(PD_SLICES)]
    _, pods = manifests(slices, "toposerve", 0, 0)
    by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for p in pods:
        p["metadata"]["uid"] = p["metadata"]["name"]
        by_group[p["metadata"]["labels"][GROUP_LABEL]].append(p)
    return names, [sorted(by_group[g.name], key=lambda p: p["metadata"]["name"])
                   for g in slices]


def _latency_extender(nodes: int, fleet: str) -> Extender:
    """The watched state of ``nodes`` nodes of ``fleet`` and its groups'
    pods (created, none bound), warmed."""
    planned = k.planned((fleet, nodes))
    state = k.cluster_state(planned, templates=[k.template("gpu4", 4)])
    groups = (latency_pods if fleet == "gb200-nvl72" else pd_pods)(nodes)[1]
    for group in groups:
        for p in group:
            state.pod("ADDED", p)
    ext = Extender(ExtenderConfig(), state)
    ext.warm()  # as the server does once every watch has listed
    return ext


def _requests(nodes: int, calls: int, fleet: str) -> dict[str, list[dict[str, Any]]]:
    if fleet == "hgx-h100":
        # each slice's first member decides its domain (the first PD_SLICES calls),
        # later calls are members of slices decided
        names, slices = pd_pods(nodes)
        return {"pd-slice": [{"Pod": slices[i % PD_SLICES][i // PD_SLICES % PD_SLICE.pods],
                              "NodeNames": names} for i in range(calls)]}
    names, groups = latency_pods(nodes)
    ordinary = [k.pod(f"o{i}", uid=f"o{i}") for i in range(calls)]
    # after the group rows: pods of no group asking GPUs meet the groups' promises
    claimed = [k.pod(f"c{i}", uid=f"c{i}", claim_template="gpu4") for i in range(calls)]
    return {"ordinary": [{"Pod": p, "NodeNames": names} for p in ordinary],
            "group": [{"Pod": groups[i % len(groups)][i // len(groups) % 18],
                       "NodeNames": names} for i in range(calls)],
            "ordinary+claim": [{"Pod": p, "NodeNames": names} for p in claimed]}


def cpu_latency(nodes: int, calls: int, fleet: str) -> list[Latency]:
    """The same calls by the CPU time they cost in process (one thread's, so
    other work on the machine does not count): the request's decoding, the
    decision and the answer's encoding; not aiohttp's share."""
    import orjson

    ext = _latency_extender(nodes, fleet)
    out = []
    for kind, reqs in _requests(nodes, calls, fleet).items():
        times: dict[str, list[float]] = {"filter": [], "prioritize": []}
        for r in reqs:
            body = orjson.dumps(r)
            t0 = time.thread_time()
            _, answer, _ = ext.answer("filter", body)
            times["filter"].append(1000 * (time.thread_time() - t0))
            body = orjson.dumps({**r, "NodeNames": orjson.loads(answer)["NodeNames"]})
            t0 = time.thread_time()
            ext.answer("prioritize", body)
            times["prioritize"].append(1000 * (time.thread_time() - t0))
        f, p = times["filter"], times["prioritize"]
        out.append(Latency(nodes, kind, len(reqs), pct(f, 0.5), pct(f, 0.99),
                           pct(p, 0.5), pct(p, 0.99)))
    return out


def _serve_latency(nodes: int, fleet: str, conn: Any) -> None:
    """The extender's process: ``_latency_extender`` served as ``serve``
    serves it (uvloop, aiohttp); sends its port on ``conn``, stops when
    ``conn`` speaks."""
    import uvloop
    from aiohttp import web

    ext = _latency_extender(nodes, fleet)

    async def run() -> None:
        runner = web.AppRunner(ext.app(), access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        conn.send(runner.addresses[0][1])
        await asyncio.get_running_loop().run_in_executor(None, conn.recv)
        await runner.cleanup()
    uvloop.run(run())


def latency(nodes: int, calls: int, fleet: str) -> list[Latency]:
    """Call times as the scheduler sees them: one blocking keep-alive HTTP
    client (like the scheduler's), the extender in a process of its own, so
    the client's CPU is not the extender's. Prioritize is asked about the
    nodes the filter passed, as the scheduler asks."""
    import http.client
    import multiprocessing

    import orjson

    body = _requests(nodes, calls, fleet)
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=_serve_latency, args=(nodes, fleet, there), daemon=True)
    proc.start()
    try:
        if not here.poll(300):
            raise RuntimeError("the extender process did not start")
        http_conn = http.client.HTTPConnection("127.0.0.1", here.recv(), timeout=30)

        def call(verb: str, data: bytes) -> tuple[float, bytes]:
            t0 = time.perf_counter()
            http_conn.request("POST", f"/{verb}", body=data,
                              headers={"Content-Type": "application/json"})
            resp = http_conn.getresponse()
            got = resp.read()
            took = 1000 * (time.perf_counter() - t0)
            assert resp.status == 200, got[:200]
            return took, got

        out = []
        for kind, reqs in body.items():
            times: dict[str, list[float]] = {"filter": [], "prioritize": []}
            for r in reqs:
                took, got = call("filter", orjson.dumps(r))
                times["filter"].append(took)
                passed = orjson.loads(got)["NodeNames"]
                took, _ = call("prioritize", orjson.dumps({**r, "NodeNames": passed}))
                times["prioritize"].append(took)
            f, p = times["filter"], times["prioritize"]
            out.append(Latency(nodes, kind, len(reqs), pct(f, 0.5), pct(f, 0.99),
                               pct(p, 0.5), pct(p, 0.99)))
        http_conn.close()
        return out
    finally:
        here.send("stop")
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()


def latency_runs(nodes: list[int], calls: int, runs: int, cpu: bool = False,
                 fleets: Sequence[str] = tuple(FLEETS)) -> list[Latency]:
    """Each row the median over ``runs`` runs of its p50s and p99s (calls summed)."""
    measure = cpu_latency if cpu else latency
    return medians([x for _ in range(runs) for n in nodes for f in fleets
                    for x in measure(n, calls, f)], ("nodes", "kind"), summed=("calls",))


def table(rows: list[Placement]) -> str:
    base = next((r.pods_per_s for r in rows if r.mode == "default"), float("nan"))

    def line(r: Placement) -> list[object]:
        ext = f"≤ {r.filter_p50_ms:g} / ≤ {r.filter_p99_ms:g}" \
            if r.filter_p99_ms == r.filter_p99_ms else "-"  # nan: no extender
        return [r.nodes, r.mode, f"{r.single_domain}/{r.groups}",
                f"{100 * r.single_domain / max(1, r.could):.0f}%", r.stranded, r.pending,
                f"{r.kv_ms:.1f}", r.largest_free_rack, r.free_racks, f"{r.pods_per_s:.1f}",
                f"{r.pods_per_s / base:.0%}", ext]
    return md_table(["nodes", "scheduler", "groups in one rack", "of those that could",
                  "pods stranded", "pods never placed", "KV ms/request (P/D)",
                  "largest free GB200 rack (GPUs)", "GB200 racks wholly free", "pods/s",
                  "vs default", "extender filter p50 / p99 ms"], map(line, rows))


def latency_table(lat: list[Latency]) -> str:
    return md_table(["nodes", "pod", "calls", "filter p50 ms", "filter p99 ms", "prioritize p50 ms",
                  "prioritize p99 ms"],
                 ([x.nodes, x.kind, x.calls, *(f"{v:.2f}" for v in (
                     x.filter_p50_ms, x.filter_p99_ms, x.prioritize_p50_ms,
                     x.prioritize_p99_ms))] for x in lat))


def plot(landed: dict[str, Any], path: Path) -> None:
    modes = [m for m in MODES if m in landed]
    fig, axes = pyplot().subplots(1, len(modes), figsize=(5 * len(modes), 4), sharey=True,
                             squeeze=False)
    names = sorted({g for m in modes for r in landed[m + "/gpus"].values() for g in r})
    for ax, mode in zip(axes[0], modes, strict=True):
        racks = landed_bars(ax, landed[mode + "/gpus"], names, linewidth=0.5)
        ax.set_xticks(range(len(racks)), [r.split("-")[-1] if "gb200" not in r else
                                          "gb" + r.split("-")[-1] for r in racks],
                      rotation=45, fontsize=7)
        ax.set_title(mode)
        ax.set_xlabel("rack")
    axes[0][0].set_ylabel("GPUs of each group")
    axes[0][-1].legend(fontsize=6, ncol=2, loc="upper right")
    fig.suptitle("where each group's pods landed (one colour a group)")
    save(fig, path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.extender_bench", description=__doc__)
    ap.add_argument("--racks", type=count_or_zero, default=4,
                    help="GB200 NVL72 racks (18 nodes each)")
    ap.add_argument("--hgx", type=count_or_zero, default=16, help="HGX H100 nodes (racks of 4)")
    ap.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES),
                    help="which schedulers to run, in this order")
    ap.add_argument("--ep-groups", type=count_or_zero, default=10,
                    help="wide-EP groups in the mix (within 7/8 of the GB200 racks)")
    ap.add_argument("--plain", type=count_or_zero, default=20, help="ordinary pods in the mix")
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--timeout", type=positive, default=240)
    ap.add_argument("--cm-qps", type=count, default=None,
                    help="the controller-manager's client QPS and burst (default: its own, "
                         "which limits how fast claims are made)")
    ap.add_argument("--nodes", type=count, nargs="*", default=[1000, 5000],
                    help="node counts for the extender's call latency")
    ap.add_argument("--calls", type=count, default=300, help="calls per latency row")
    ap.add_argument("--runs", type=count, default=1,
                    help="latency runs; each row is their median")
    ap.add_argument("--fleets", nargs="+", choices=list(FLEETS), default=list(FLEETS),
                    help="the latency rows' nodes: GB200 racks (ordinary, group and "
                         "ordinary+claim pods) and HGX nodes (pd-slice: 100 P/D slices of 4 "
                         "pods, the first 100 calls each a slice's first member, which "
                         "decides its domain)")
    ap.add_argument("--latency-only", action="store_true",
                    help="only the extender's call latency (no cluster)")
    ap.add_argument("--cpu", action="store_true",
                    help="with --latency-only: the calls' CPU time in process, not over HTTP "
                         "(writes extender_latency_cpu.*)")
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--name", default="extender_bench",
                    help="file name of the outputs (the 5,000-node run: extender_scale)")
    args = ap.parse_args(argv)
    if args.latency_only:
        lat = latency_runs(args.nodes, args.calls, args.runs, args.cpu, args.fleets)
        write(Path(args.out), "extender_latency" + ("_cpu" if args.cpu else ""),
              latency_table(lat),
              {"latency": [asdict(x) for x in lat], "args": vars(args)})
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        rows, landed = placement_runs(args, Path(tmp))
    lat = latency_runs(args.nodes, args.calls, args.runs, fleets=args.fleets)
    md = table(rows) + ("\n\n" + latency_table(lat) if lat else "")
    write(Path(args.out), args.name, md,
          {"placement": [asdict(r) for r in rows], "latency": [asdict(x) for x in lat],
           "landed": landed, "args": vars(args)}, lambda p: plot(landed, p))
    return 0


if __name__ == "__main__":
    sys.exit(main())
