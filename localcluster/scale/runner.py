"""One scale run: for each setup of the scenario, one local cluster of its
size (the cached real binaries), slices from ``driver simulate``, the
extender when the setup has it, the workload submitted at the scenario's
rate, churn, and the figures; then the cluster is torn down, whatever
happened (an interrupt included), before the next setup starts."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import orjson
import urllib3
import yaml
from tqdm import tqdm

from toposerve.dra_driver.simulate import label_partitions
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster import crds
from toposerve.localcluster.cluster import ClusterSpec, down, running_clusters, up
from toposerve.localcluster.clusters import ClusterError, api_client, cluster_dir
from toposerve.localcluster.nodes import node_manifest
from toposerve.localcluster.ports import free_port
from toposerve.localcluster.processes import commands_under, end_process
from toposerve.localcluster.scale import controllers as ctl
from toposerve.localcluster.scale import fit, measure, profile, quality
from toposerve.localcluster.scale.scenario import ScaleScenario, Setup
from toposerve.localcluster.scale.workload import (
    DEVICE_CLASSES,
    GROUPS_SCHEDULER,
    NAMESPACE,
    SCALE_LABEL,
    Plan,
    PodPlan,
    Workers,
    again,
    plan,
)
from toposerve.topology.labels import PRESETS, PROFILE_LABEL, DialectName, from_labels
from toposerve.topology.layout import PlannedNode, plan_nodes
from toposerve.topology.profiles import load_profile

WORKLOAD_GATES = "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"
WORKLOAD_API = "scheduling.k8s.io/v1beta1=true"
Say = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def scheduler_config(sc: ScaleScenario, setup: Setup, extender_url: str) -> dict[str, Any]:
    """The scheduler's configuration for ``setup``, with the scenario's client limits."""
    from toposerve.scheduler_ext.scheduler_config import scheduler_config as with_extender

    lim = sc.client_limits
    pct = sc.scheduler.percentage_of_nodes_to_score
    # an extender that waits out samples lacking its groups' domains lets the
    # scheduler sample as in the other setups (docs/extender.md, sampledNodes)
    sampled = sc.extender.placement is not None and sc.extender.placement.sampled_nodes
    if setup is Setup.TOPOSERVE:
        # groups' pods through a profile of their own that sees every node;
        # the rest through the default profile, sampling as in the other setups
        cfg = with_extender(extender_url, percentage_of_nodes_to_score=pct if sampled else 100,
                            scheduler_name=GROUPS_SCHEDULER,
                            ungrouped_scheduler_name="default-scheduler",
                            ungrouped_percentage=pct or 0)
    else:
        cfg = {"apiVersion": "kubescheduler.config.k8s.io/v1",
               "kind": "KubeSchedulerConfiguration"}
        if pct is not None:
            cfg["percentageOfNodesToScore"] = pct
    if lim.scheduler_qps:
        cfg["clientConnection"] = {"qps": lim.scheduler_qps, "burst": lim.scheduler_burst}
    return cfg


def cluster_spec(sc: ScaleScenario, setup: Setup, name: str, sched_file: Path) -> ClusterSpec:
    lim = sc.client_limits
    gates = setup is Setup.IN_TREE
    return ClusterSpec(name=name, groups=[(g.profile, g.count) for g in sc.nodes],
                       scheduler_config=sched_file,
                       controller_manager_qps=lim.controller_manager_qps or None,
                       controller_manager_burst=lim.controller_manager_burst or None,
                       feature_gates=WORKLOAD_GATES if gates else "",
                       scheduler_feature_gates=sc.scheduler.gates_flag(),
                       gogc={str(k): v for k, v in sc.gogc.items()},
                       node_status_s=sc.node_status_seconds,
                       runtime_config=WORKLOAD_API if gates else "",
                       # the run makes the StatefulSets' pods itself, as LWS's are made
                       controllers="*,-statefulset-controller",
                       ready_timeout_s=120 + 0.2 * sc.node_count())


@dataclass
class Child:
    """A toposerve subprocess of the run (``driver simulate``, ``extender``)."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    url: str

    def get(self, path: str) -> tuple[int, bytes]:
        try:
            r = urllib3.PoolManager().request("GET", self.url + path, timeout=5, retries=False)
            return r.status, r.data
        except urllib3.exceptions.HTTPError:
            return 0, b""

    def alive(self) -> None:
        if self.popen.poll() is not None:
            tail = self.log.read_text().splitlines()[-5:] if self.log.exists() else []
            raise ClusterError(f"{self.name} exited ({self.popen.returncode}): "
                               + " | ".join(tail)[-400:])

    def stop(self) -> None:
        end_process(self.popen, 15)


def spawn(name: str, argv: list[str], workdir: Path, url: str) -> Child:
    log = workdir / f"{name.replace(' ', '-')}.log"
    # its own session: a Ctrl-C reaches only us, and we stop it in order
    popen = subprocess.Popen([sys.executable, "-m", "toposerve.main", *argv],
                             stdout=log.open("wb"), stderr=subprocess.STDOUT,
                             env={**os.environ, "PYTHONUNBUFFERED": "1"},
                             start_new_session=True)
    return Child(name, popen, log, url)


def wait(what: str, check: Callable[[], bool], timeout: float, interval: float = 0.25) -> float:
    """Seconds until ``check`` held; ClusterError after ``timeout``."""
    t0 = time.monotonic()
    while not check():
        if time.monotonic() - t0 > timeout:
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - t0


def whole_gpu_nodes(sc: ScaleScenario) -> list[str]:
    """The nodes that publish whole GPUs only: each group's last
    ``count - partitioned`` (its nodes are planned in group order)."""
    planned = plan_nodes([(load_profile(g.profile), g.count) for g in sc.nodes])
    out: list[str] = []
    start = 0
    for g in sc.nodes:
        out += [n.name for n in planned[start + g.count - g.whole_gpu_nodes():start + g.count]]
        start += g.count
    return out


def extra_nodes(sc: ScaleScenario) -> list[PlannedNode]:
    """Churn's added nodes: more of the first group's profile, with fresh indexes."""
    first = sc.nodes[0]
    have = sum(g.count for g in sc.nodes if g.profile == first.profile)
    more = plan_nodes([(load_profile(first.profile), have + sc.churn.nodes_added)])[have:]
    return [replace(n, index=sc.node_count() + i) for i, n in enumerate(more)]


class Submitter:
    """Creates pods from a thread pool at a paced rate; when each create
    was sent and which failed. A wide-EP leader's workers follow it as LWS
    makes them (``follow``)."""

    def __init__(self, rest: JsonApi, uids: ctl.Uids, workers: dict[str, Workers] | None = None,
                 threads: int = 24) -> None:
        self._rest = rest
        self._uids = uids  # of the owner objects (and created pods), for owner references
        # by leader name, not made yet: right after the leader, or once it is bound
        self._with_leader = {n: w for n, w in (workers or {}).items() if w.pin is None}
        self._when_bound = {n: w for n, w in (workers or {}).items() if w.pin is not None}
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="submit")
        self.created: dict[str, float] = {}
        self.failed: dict[str, str] = {}
        self._futures: deque[Future[None]] = deque()  # appended to from the pool too

    def _create(self, p: PodPlan) -> None:
        self.created[p.name] = time.monotonic()
        try:
            got = self._rest.request("POST", ctl.collection("Pod", NAMESPACE),
                                     body=ctl.with_owner_uids(p.body, self._uids))
            self._uids[("Pod", p.name)] = got["metadata"]["uid"]
        except ApiError as err:
            self.failed[p.name] = str(err)[:200]
            return
        if (w := self._with_leader.pop(p.name, None)) is not None:
            self._make_workers(w, None)

    def _make_workers(self, w: Workers, topology: str | None) -> None:
        sts, pods = w.make(topology)
        try:
            got = self._rest.request("POST", ctl.collection("StatefulSet", NAMESPACE),
                                     body=ctl.with_owner_uids(sts, self._uids))
        except ApiError as err:
            self.failed.update({x.name: f"worker StatefulSet: {str(err)[:180]}" for x in pods})
            return
        self._uids[("StatefulSet", sts["metadata"]["name"])] = got["metadata"]["uid"]
        self._futures.extend(self._pool.submit(self._create, x) for x in pods)

    def _pinned(self, w: Workers, leader: str) -> None:
        """The workers of a bound leader, pinned to its node's domain."""
        try:
            pod = self._rest.request("GET", f"{ctl.collection('Pod', NAMESPACE)}/{leader}")
            node = self._rest.request("GET", f"/api/v1/nodes/{pod['spec']['nodeName']}")
        except ApiError as err:
            self.failed[leader] = f"leader's node: {str(err)[:180]}"
            return
        self._make_workers(w, (node["metadata"].get("labels") or {}).get(w.pin or ""))

    def follow(self, bound: dict[str, float]) -> None:
        """Start the workers of the exclusive-placement leaders now bound."""
        for leader in [n for n in self._when_bound if n in bound]:
            w = self._when_bound.pop(leader)
            self._futures.append(self._pool.submit(self._pinned, w, leader))

    def submit(self, pods: list[PodPlan], rate: float, tick: Callable[[], None]) -> None:
        """``pods`` at ``rate``, but those that follow a leader (made by ``follow``)."""
        t0 = time.monotonic()
        for i, p in enumerate(x for x in pods if x.leader is None):
            if rate:
                delay = t0 + i / rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
            self._futures.append(self._pool.submit(self._create, p))
            if i % 50 == 0:
                tick()

    def drain(self) -> None:
        """Wait for every create sent so far (and those they started)."""
        while self._futures:
            self._futures.popleft().result()

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _bar(total: int, desc: str, enabled: bool) -> tqdm[Any]:
    return tqdm(total=total, desc=desc, unit="pod", file=sys.stderr, disable=not enabled,
                dynamic_ncols=True, leave=True)


def settle(names: set[str], pods: measure.Watched, settle_s: float, timeout_s: float,
           bar: tqdm[Any], alive: Callable[[], None]) -> int:
    """Wait until every pod of ``names`` is bound or nothing new binds for
    ``settle_s``; how many are bound."""
    t0 = last_change = time.monotonic()
    last = -1
    while True:
        alive()
        bound = len(names & pods.snapshot().keys())
        if bound != last:
            bar.update(bound - bar.n)
            last, last_change = bound, time.monotonic()
        now = time.monotonic()
        if bound >= len(names) or now - last_change > settle_s or now - t0 > timeout_s:
            return bound
        time.sleep(0.2)


@contextlib.contextmanager
def setup_cluster(sc: ScaleScenario, setup: Setup, name: str, workdir: Path, say: Say,
                  keep: Path | None = None
                  ) -> Iterator[tuple[Any, dict[str, Any], list[Child]]]:
    """The setup's cluster, slices published and extender ready: (api,
    figures, children). Torn down on exit, when the figures get every
    process's CPU and peak RSS (and ``keep``, when given, every log)."""
    ext_port = free_port()
    sched_file = workdir / "scheduler.yaml"
    sched_file.write_text(yaml.safe_dump(scheduler_config(sc, setup,
                                                          f"http://127.0.0.1:{ext_port}")))
    if name in running_clusters():
        down(name, progress=say)  # left over from an interrupted run
    children: list[Child] = []
    sampler = measure.ProcSampler()
    figures: dict[str, Any] = {}
    t0 = time.monotonic()
    kubeconfig = up(cluster_spec(sc, setup, name, sched_file), say)
    try:
        figures["cluster_up_s"] = round(time.monotonic() - t0, 1)
        api = api_client(name)
        figures["crds_s"] = round(install_crds(JsonApi(api)), 1)
        sampler.watch({**commands_under(cluster_dir(name)), os.getpid(): "scale (this run)"})
        sampler.start()
        if whole := whole_gpu_nodes(sc):
            label_partitions(api, whole, on=False)  # before the simulator lists them
            say(f"{len(whole)} nodes publish whole GPUs only")
        sim_port = free_port()
        sim = spawn("driver simulate", ["driver", "simulate", "--cluster", name,
                                        "--drivers", ",".join(sc.drivers),
                                        "--http-address", f"127.0.0.1:{sim_port}"],
                    workdir, f"http://127.0.0.1:{sim_port}")
        children.append(sim)
        sampler.watch({sim.popen.pid: sim.name})

        status: dict[str, Any] = {}

        def published() -> bool:
            sim.alive()
            code, body = sim.get("/status")
            status.update(orjson.loads(body) if code == 200 else {})
            return bool(status.get("ready")) and status.get("nodes") == sc.node_count()
        figures["slice_publish_s"] = round(wait("every node's slices", published,
                                                600 + sc.node_count() * 0.5), 1)
        # nodes published per driver, from the desired state: the slice count
        # is the publisher's watch of its own writes, which may still lag here
        figures["pools_by_driver"] = {p["driver"]: p["pools"]
                                      for p in status.get("publishers", ())}
        figures["scheduler_gates"] = measure.gates_enabled(
            profile.fetch(name, "kube-scheduler", "/metrics").decode(),
            sc.scheduler.feature_gates) if sc.scheduler.feature_gates else {}
        say(f"slices for {sc.node_count()} nodes published in {figures['slice_publish_s']}s")
        if setup is Setup.TOPOSERVE:
            cfg = workdir / "extender.yaml"
            ext_cfg: dict[str, Any] = {"apiVersion": "toposerve.io/v1",
                                       "kind": "ExtenderConfig",
                                       "accelerators": {"deviceClasses": list(DEVICE_CLASSES)}}
            if sc.extender.placement is not None:
                ext_cfg["placement"] = sc.extender.placement.model_dump(
                    mode="json", by_alias=True, exclude_unset=True)
            cfg.write_text(yaml.safe_dump(ext_cfg))
            ext = spawn("extender", ["extender", "--config", str(cfg), "--kubeconfig",
                                     str(kubeconfig), "--port", str(ext_port)], workdir,
                        f"http://127.0.0.1:{ext_port}")
            children.append(ext)
            sampler.watch({ext.popen.pid: ext.name})

            def ready() -> bool:
                ext.alive()
                return ext.get("/ready")[0] == 200
            figures["extender_ready_s"] = round(wait("the extender", ready, 120), 1)
        yield api, figures, children
    finally:
        with _uninterrupted():
            for c in reversed(children):
                c.stop()
            figures["processes"] = sampler.stop()
            if keep is not None:
                keep_logs(workdir, cluster_dir(name), keep)
            down(name, progress=say)


def keep_logs(workdir: Path, cluster: Path, dest: Path) -> None:
    """Before the cluster goes: the logs of every process the setup started
    (the control plane, kwok, the extender, driver simulate), the
    scheduler's and extender's configs and kwok's as kwokctl wrote it."""
    dest.mkdir(parents=True, exist_ok=True)
    for f in [*workdir.glob("*.log"), *workdir.glob("*.yaml"),
              *(cluster / "logs").glob("*.log"), cluster / "kwok.yaml"]:
        if f.is_file():
            shutil.copyfile(f, dest / f.name)


def install_crds(rest: JsonApi) -> float:
    """The LWS project's CRDs with upstream's schemas (LeaderWorkerSet,
    DisaggregatedSet and its role scaler), served before the extender starts
    (it looks for them once); the seconds it took."""
    return crds.install(rest, ctl.CRDS, "the LWS and DisaggregatedSet CRDs")


def _create_objects(rest: JsonApi, p: Plan) -> ctl.Uids:
    """The plan's objects in order, each owner's uid given to what it owns;
    the uids of all of them."""
    uids: ctl.Uids = {}
    for path, obj in p.objects:
        try:
            got = rest.request("POST", path, body=ctl.with_owner_uids(obj, uids))
            uids[(obj["kind"], obj["metadata"]["name"])] = got["metadata"]["uid"]
        except ApiError as err:
            if err.status != 409:
                raise
    return uids


def run_setup(sc: ScaleScenario, setup: Setup, name: str, workdir: Path, say: Say,
              show_bar: bool, keep: Path | None = None) -> dict[str, Any]:
    p = plan(sc, setup)
    with setup_cluster(sc, setup, name, workdir, say, keep) as (api, figures, children):
        rest = JsonApi(api)
        uids = _create_objects(rest, p)
        pods = measure.Watched(rest, f"/api/v1/namespaces/{NAMESPACE}/pods", SCALE_LABEL,
                               measure.bound_pod).start()
        claims_path = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"
        # one watch for both claim times: each claim's events come once
        claims = measure.Watched(rest, claims_path, "", measure.allocated_claim_pod,
                                 made=measure.claim_pod).start()
        ext = next((c for c in children if c.name == "extender"), None)

        sub = Submitter(rest, uids, p.workers)

        def alive() -> None:
            for c in children:
                c.alive()
            sub.follow(pods.snapshot())
        try:
            api_before, ext_before = measure.scrape(api), ext and measure.scrape_url(
                ext.url + "/metrics")
            sched_before = profile.fetch(name, "kube-scheduler", "/metrics").decode()
            started = time.monotonic()
            # as scheduler_perf does: the unmeasured pods are scheduled before
            # the measured ones are created, so the measured span is theirs alone
            waves = [p.pods[:sc.arrival.unmeasured], p.pods[sc.arrival.unmeasured:]]
            with _bar(len(p.pods), f"{setup.value}: bound", show_bar) as bar:
                sent: set[str] = set()
                for wave in (w for w in waves if w):
                    sub.submit(wave, sc.arrival.rate, alive)
                    sub.drain()
                    sent |= {x.name for x in wave}
                    left = started + sc.arrival.timeout_seconds - time.monotonic()
                    settle(sent, pods, sc.arrival.settle_seconds, max(left, 1.0), bar, alive)
                    if wave is waves[0]:
                        figures["unmeasured_settled_s"] = round(time.monotonic() - started, 2)
            churn = do_churn(sc, rest, p, pods, sub, children, say, show_bar, alive)
            seconds = time.monotonic() - started
            api_after = measure.scrape(api)
            sched_after = profile.fetch(name, "kube-scheduler", "/metrics").decode()
            ext_after = ext and measure.scrape_url(ext.url + "/metrics")
            where = {x["metadata"]["name"]: x["spec"]["nodeName"]
                     for x in rest.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods",
                                           [("labelSelector", SCALE_LABEL)])["items"]
                     if x["spec"].get("nodeName")}
            node_objs = rest.request("GET", "/api/v1/nodes")["items"]
        finally:
            sub.close()
            for w in (pods, claims):
                w.stop()
    dialect = PRESETS[DialectName.TOPOSERVE]
    paths = {n["metadata"]["name"]: from_labels(n["metadata"]["name"],
                                                n["metadata"].get("labels") or {}, dialect)
             for n in node_objs}
    profiles = {n["metadata"]["name"]: (n["metadata"].get("labels") or {}).get(
        PROFILE_LABEL, "") for n in node_objs}
    plans = {x.name: x for x in p.pods} | churn.pop("_plans")
    used: dict[str, int] = {}
    for pod_name, node in where.items():
        if pod_name in plans:
            used[node] = used.get(node, 0) + plans[pod_name].gpus
    result = figures | figures_of(sc, p, sub, pods.snapshot(), claims.snapshot(),
                                  claims.snapshot("made"), started, seconds)
    result |= {
        "setup": setup.value, "cluster": name, "churn": churn,
        "apiserver_requests": measure.request_rates(api_before, api_after, seconds),
        "scheduler": measure.scheduler_work(sched_before, sched_after),
        "extender_calls": measure.call_latency(ext_before, ext_after) if ext_before and
        ext_after else {},
        "extender_phases": measure.call_latency(
            ext_before, ext_after, "toposerve_extender_call_phase_seconds", ("verb", "phase"))
        if ext_before and ext_after else {},
        "placement": quality.as_dict(quality.placement(p.groups, where, paths, profiles,
                                                       used)),
        "landed": quality.landed(p.groups, where, paths),
    }
    return result


def figures_of(sc: ScaleScenario, p: Plan, sub: Submitter, bound: dict[str, float],
               allocated: dict[str, float], made: dict[str, float], started: float,
               seconds: float) -> dict[str, Any]:
    """Throughput and latencies of the first wave (churn's pods are counted apart)."""
    names = [x.name for x in p.pods]
    measured = names[sc.arrival.unmeasured:]

    def since_create(at: dict[str, float], which: list[str]) -> list[float]:
        return [at[n] - sub.created[n] for n in which if n in at and n in sub.created]
    to_bound = since_create(bound, names)
    claimed = [x.name for x in p.pods if x.claims]
    to_alloc = since_create(allocated, claimed)
    m_bound = [bound[n] for n in measured if n in bound]
    first = min((sub.created[n] for n in measured if n in sub.created), default=started)
    span = max(m_bound, default=first) - first
    return {
        "pods": len(names), "bound": sum(1 for n in names if n in bound),
        "create_errors": len(sub.failed), "measured_pods": len(measured),
        "first_create_error": next(iter(sub.failed.values()), None),
        "unbound_by_kind": dict(Counter(x.kind for x in p.pods if x.name not in bound)),
        "pods_per_s": round(len(m_bound) / span, 1) if span > 0 else None,
        "measured_first_create_s": round(first - started, 2),
        "run_s": round(seconds, 1),
        "timeline": [(round(t, 1), r) for t, r in measure.timeline(bound.values(), started)],
        "to_bound_s": latency(to_bound), "to_allocated_s": latency(to_alloc),
        # the controller-manager's part of create->allocated: making the claim
        "to_claim_made_s": latency(since_create(made, claimed)),
        "cdf": {"to_bound_s": cdf(to_bound), "to_allocated_s": cdf(to_alloc)},
    }


def latency(values: list[float]) -> dict[str, float | int | None]:
    def r(x: float) -> float | None:
        return None if x != x else round(x, 3)  # NaN: no values
    return {"n": len(values), "p50": r(measure.percentile(values, 0.5)),
            "p99": r(measure.percentile(values, 0.99))}


def cdf(values: list[float], points: int = 100) -> list[float]:
    """The sorted values thinned to at most ``points`` quantiles (for the plot)."""
    s = sorted(values)
    if len(s) <= points:
        return [round(v, 3) for v in s]
    return [round(s[int(i * (len(s) - 1) / (points - 1))], 3) for i in range(points)]


def do_churn(sc: ScaleScenario, rest: JsonApi, p: Plan, pods: measure.Watched, sub: Submitter,
             children: list[Child], say: Say, show_bar: bool,
             alive: Callable[[], None]) -> dict[str, Any]:
    """Pods deleted and re-created, nodes added and removed, after the first wave."""
    ch = sc.churn
    out: dict[str, Any] = {"_plans": {}}
    if not (ch.pods or ch.nodes_added or ch.nodes_removed):
        return out
    bound = pods.snapshot()
    victims = [x for x in p.pods if x.group is None and x.name in bound][:ch.pods]
    for x in victims:
        with contextlib.suppress(ApiError):
            rest.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{x.name}",
                         [("gracePeriodSeconds", 0)])
    new = [again(x, 1) for x in victims]
    out["_plans"] = {x.name: x for x in new}
    added = extra_nodes(sc)
    t0 = time.monotonic()
    for n in added:
        rest.request("POST", "/api/v1/nodes", body=node_manifest(
            n, load_profile(n.profile), PRESETS[DialectName.TOPOSERVE]))
    nodes = rest.request("GET", "/api/v1/nodes")["items"]
    busy = set(_where(rest).values())
    order = sorted((n["metadata"]["name"] for n in nodes
                    if n["metadata"]["name"] not in {a.name for a in added}),
                   key=lambda n: (n in busy, random.Random(n).random()))
    for n in order[:ch.nodes_removed]:
        rest.request("DELETE", f"/api/v1/nodes/{n}")
    sim = next(c for c in children if c.name == "driver simulate")
    want = sc.node_count() + len(added) - ch.nodes_removed

    def published() -> bool:
        sim.alive()
        code, body = sim.get("/status")
        st = orjson.loads(body) if code == 200 else {}
        return bool(st.get("ready")) and st.get("nodes") == want
    out["nodes_published_s"] = round(wait("slices of the churned nodes", published, 300), 1)
    t1 = time.monotonic()
    with _bar(len(new), "churn: re-created pods bound", show_bar) as bar:
        sub.submit(new, sc.arrival.rate, alive)
        sub.drain()
        got = settle({x.name for x in new}, pods, sc.arrival.settle_seconds,
                     sc.arrival.timeout_seconds, bar, alive)
    snap = pods.snapshot()
    lat = [snap[x.name] - sub.created[x.name] for x in new if x.name in snap]
    out |= {"pods_deleted": len(victims), "pods_recreated_bound": got,
            "recreated_to_bound_s": latency(lat), "nodes_added": len(added),
            "nodes_removed": min(ch.nodes_removed, len(order)),
            "churn_s": round(time.monotonic() - t0, 1), "recreate_s": round(
                time.monotonic() - t1, 1)}
    say(f"churn: {got}/{len(new)} re-created pods bound, nodes +{len(added)} "
        f"-{out['nodes_removed']}")
    return out


def _where(rest: JsonApi) -> dict[str, str]:
    return {x["metadata"]["name"]: x["spec"]["nodeName"]
            for x in rest.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods")["items"]
            if x["spec"].get("nodeName")}


def run(sc: ScaleScenario, workdir: Path, *, prefix: str = "ts-scale", say: Say = _stderr,
        show_bar: bool = True, available_mib: float | None = None,
        done: Callable[[dict[str, Any]], object] = lambda doc: None,
        keep_logs_in: Path | None = None) -> dict[str, Any]:
    """Every setup of ``sc`` in turn; the whole result document, also given
    to ``done`` after each setup (so a long run interrupted late keeps the
    setups it finished). Refuses (fit.DoesNotFit) before anything starts
    when the scenario does not fit. ``keep_logs_in``: each setup's logs go
    to its subdirectory there, also when the setup fails."""
    est = fit.check(sc, fit.mem_available_mib() if available_mib is None else available_mib)
    # SIGTERM unwinds like Ctrl-C, so every cluster is torn down either way
    old = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        doc: dict[str, Any] = {"scenario": sc.model_dump(mode="json", by_alias=True),
                               "estimate_mib": round(est.total_mib),
                               "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                               "setups": []}
        for setup in sc.setups:
            say(f"== setup {setup.value}")
            d = workdir / setup.value
            d.mkdir(parents=True, exist_ok=True)
            doc["setups"].append(run_setup(
                sc, setup, f"{prefix}-{setup.value}"[:32], d, say, show_bar,
                keep_logs_in / setup.value if keep_logs_in is not None else None))
            done(doc)
        return doc
    finally:
        signal.signal(signal.SIGTERM, old)


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """A second Ctrl-C (or SIGTERM) while a setup is torn down would leave
    half a cluster behind: both wait until the teardown is done."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
