"""A local cluster whose real kube-scheduler calls a real extender process:
kwok nodes from GB200 NVL72 racks and HGX H100 blocks, GPU ResourceSlices
published by the DRA publisher from the same topology model, a GPU
DeviceClass and claim templates. For the extender's cluster tests and its
benchmark."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import urllib3
import yaml

from harness.cluster_claim import claimed
from harness.extender_objects import GPU_CLASS, device_class, template
from harness.waiting import wait_for
from toposerve.dra_driver.gpu.devices import DRIVER, gpu_pool
from toposerve.dra_driver.resourceslice import SlicePublisher
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster.cluster import ClusterSpec, up
from toposerve.localcluster.clusters import api_client
from toposerve.localcluster.ports import free_port
from toposerve.localcluster.processes import end_process
from toposerve.localcluster.scale import controllers as ctl
from toposerve.localcluster.scale.controllers import DS_API, LWS_API, collection
from toposerve.localcluster.scale.runner import install_crds as scale_install_crds
from toposerve.scheduler_ext.scheduler_config import render, scheduler_config
from toposerve.topology.labels import PRESETS, PROFILE_LABEL, DialectName, from_labels
from toposerve.topology.model import DomainPath, NodeTopology
from toposerve.topology.profiles import load_profile
from toposerve.topology.workloads import LWS

WORKLOAD_GATES = "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"
WORKLOAD_API = "scheduling.k8s.io/v1beta1=true"
# pods here are made by the tests as LWS and the StatefulSet controller would make
# them, owned by StatefulSets that exist (else the garbage collector deletes the
# pods) but that no StatefulSet controller may act on (it would make its own)
CONTROLLERS = "*,-statefulset-controller"


@dataclass
class ExtenderProc:
    """``toposerve extender`` as a subprocess, restartable on its port."""

    kubeconfig: Path
    port: int
    workdir: Path
    config: dict[str, Any] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        cfg = self.workdir / "extender.yaml"
        cfg.write_text(yaml.safe_dump({"apiVersion": "toposerve.io/v1",
                                       "kind": "ExtenderConfig", **self.config}))
        self.starts += 1
        log = (self.workdir / f"extender-{self.starts}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "toposerve.main", "extender", "--config", str(cfg),
             "--kubeconfig", str(self.kubeconfig), "--port", str(self.port)],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        http = urllib3.PoolManager()

        def ready() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"extender exited: {self.log_tail()}")
            try:
                return http.request("GET", f"{self.url}/ready", timeout=1,
                                    retries=False).status == 200
            except urllib3.exceptions.HTTPError:
                return False
        wait_for("the extender to be ready", ready, timeout=60, interval=0.2)

    def stop(self) -> None:
        if self.proc is not None:
            end_process(self.proc, 10)
        self.proc = None

    def log_tail(self, lines: int = 20) -> str:
        path = self.workdir / f"extender-{self.starts}.log"
        return "\n".join(path.read_text().splitlines()[-lines:]) if path.exists() else ""

    def placements(self) -> list[dict[str, Any]]:
        """The 'group placement' lines of its current log (pod, group, outcome, reason)."""
        path = self.workdir / f"extender-{self.starts}.log"
        lines = path.read_text().splitlines() if path.exists() else []
        return [e for e in (orjson.loads(x) for x in lines if x.startswith("{"))
                if e.get("msg") == "group placement"]

    def metrics(self) -> str:
        r = urllib3.PoolManager().request("GET", f"{self.url}/metrics", timeout=5)
        return str(r.data.decode())


@dataclass
class GpuCluster:
    name: str
    api: Any
    kubeconfig: Path
    paths: dict[str, DomainPath]  # node -> its place
    extender: ExtenderProc | None


def rest(api: Any) -> JsonApi:
    return JsonApi(api)


def publish_gpu_slices(api: Any) -> int:
    """GPU slices for every node, from its profile label, by the publisher
    the real driver uses (standing in for ``toposerve driver simulate``)."""
    pools = []
    for n in rest(api).request("GET", "/api/v1/nodes")["items"]:
        md = n["metadata"]
        profile = (md.get("labels") or {}).get(PROFILE_LABEL)
        if not profile:
            continue
        topo = NodeTopology(name=md["name"], profile=profile,
                            path=from_labels(md["name"], md.get("labels") or {},
                                             PRESETS[DialectName.TOPOSERVE]),
                            hardware=load_profile(profile).hardware())
        pools.append(gpu_pool(topo, node_uid=md["uid"]))
    pub = SlicePublisher(api, DRIVER)  # its workers write in parallel (5,000 nodes: minutes)
    pub.start()
    try:
        pub.wait_synced()
        pub.set_pools(pools)

        def written() -> bool:
            if not pub.idle():
                return False
            got = rest(api).request("GET", "/apis/resource.k8s.io/v1/resourceslices")
            return len(got["items"]) >= len(pools)
        wait_for("every node's GPU slice written", written, timeout=60 + 0.1 * len(pools),
                 interval=0.5)
    finally:
        pub.stop()
    return len(pools)


def create(api: Any, path: str, obj: dict[str, Any]) -> None:
    """POST, tolerating an object that is already there."""
    try:
        rest(api).request("POST", path, body=obj)
    except ApiError as err:
        if err.status != 409:
            raise


OWNERS = [f"/apis/{LWS_API}/namespaces/{{ns}}/leaderworkersets",
          f"/apis/{DS_API}/namespaces/{{ns}}/disaggregatedsets",
          "/apis/apps/v1/namespaces/{ns}/statefulsets"]


def install_crds(api: Any) -> None:
    """LeaderWorkerSet and DisaggregatedSet, established before anything watches them."""
    scale_install_crds(rest(api))


def post(api: Any, obj: dict[str, Any]) -> dict[str, Any]:
    """Create ``obj`` in its namespace by its kind; the object as stored (uid and all)."""
    path = collection(obj["kind"], obj["metadata"].get("namespace", "default"))
    got: dict[str, Any] = rest(api).request("POST", path, body=obj)
    return got


@dataclass
class LwsGroups:
    """A LeaderWorkerSet as created so far: the LWS, its leader StatefulSet and leader pods."""

    lws: dict[str, Any]
    leader_sts: dict[str, Any]
    leaders: list[dict[str, Any]]
    claim_template: str
    profile: str | None


def create_lws(api: Any, lws: dict[str, Any], *, claim_template: str,
               profile: str | None = "gb200-nvl72", revision: str = "5d8f9c7b6") -> LwsGroups:
    """What LWS makes first: the LWS object (unless it has a uid: made
    already), its leader StatefulSet and a leader pod per replica, each
    owned by the one before (real uids)."""
    lws = lws if lws["metadata"].get("uid") else post(api, lws)
    sts = post(api, ctl.leader_statefulset(lws, revision))
    leaders = [post(api, ctl.lws_leader(lws, sts, g, claim_template=claim_template,
                                      profile=profile))
               for g in range(lws["spec"]["replicas"])]
    return LwsGroups(lws, sts, leaders, claim_template, profile)


def create_workers(api: Any, groups: LwsGroups, index: int) -> list[dict[str, Any]]:
    """What LWS makes for group ``index`` once its leader exists (with
    exclusive placement: once it is bound, its workers pinned to the
    leader's domain): the worker StatefulSet owned by the leader pod, and
    its pods."""
    leader = groups.leaders[index]
    topology = None
    key = (groups.lws["metadata"].get("annotations") or {}).get(
        f"{LWS}/exclusive-topology")
    if key:
        bound = rest(api).request("GET", f"/api/v1/namespaces/{leader['metadata']['namespace']}"
                                         f"/pods/{leader['metadata']['name']}")
        node = rest(api).request("GET", f"/api/v1/nodes/{bound['spec']['nodeName']}")
        topology = node["metadata"]["labels"][key]
    sts = post(api, ctl.worker_statefulset(groups.lws, leader, topology=topology))
    size = groups.lws["spec"]["leaderWorkerTemplate"]["size"]
    return [post(api, ctl.lws_worker(groups.lws, leader, sts, w,
                                   claim_template=groups.claim_template,
                                   profile=groups.profile)) for w in range(1, size)]


def create_disaggregated(api: Any, name: str, slice_: int, roles: dict[str, tuple[int, int]], *,
                         claim_template: str, profile: str | None = "gb200-nvl72",
                         revision: str = "7f9b8c1d") -> list[dict[str, Any]]:
    """A DisaggregatedSet slice as its controller and LWS make it: the set,
    a LeaderWorkerSet per role owned by it (all in one reconcile), then every
    group's leader and workers (no exclusive placement: workers come with
    their leader)."""
    ds = post(api, ctl.disaggregated_set(name, roles))
    pods: list[dict[str, Any]] = []
    for lws in [post(api, x) for x in ctl.disaggregated_lws(ds, slice_, revision)]:
        groups = create_lws(api, lws, claim_template=claim_template, profile=profile,
                            revision=revision)
        for g, leader in enumerate(groups.leaders):
            pods += [leader, *create_workers(api, groups, g)]
    return pods


def create_classes_and_templates(api: Any, gpus: list[int], namespace: str = "default") -> None:
    create(api, "/apis/resource.k8s.io/v1/deviceclasses",
           device_class(GPU_CLASS, f"device.driver == '{DRIVER}'"))
    for g in gpus:
        create(api, f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
               template(f"gpu{g}", g, namespace))


@contextmanager
def gpu_cluster(name: str, groups: list[tuple[str, int]], workdir: Path, *,
                extender: bool = True, workload_gates: bool = False, qps: int = 1000,
                controller_manager_qps: int | None = None,
                extender_config: dict[str, Any] | None = None,
                progress: Any = None) -> Iterator[GpuCluster]:
    """Up, with the extender wired into the scheduler (or not), slices
    published; torn down on exit whatever happened. ``qps``: the
    scheduler's client limits; the controller-manager's, its defaults
    unless ``controller_manager_qps``."""
    port = free_port()
    sched = workdir / f"{name}-scheduler.yaml"
    cfg = scheduler_config(f"http://127.0.0.1:{port}", qps=qps)
    if not extender:
        del cfg["extenders"]
    sched.write_text(render(cfg))
    say = progress or (lambda m: print(f"[{name}] {m}", file=sys.stderr))
    spec = ClusterSpec(name=name, groups=groups, scheduler_config=sched,
                       feature_gates=WORKLOAD_GATES if workload_gates else "",
                       runtime_config=WORKLOAD_API if workload_gates else "",
                       controllers=CONTROLLERS, controller_manager_qps=controller_manager_qps)
    with claimed(name, progress=say):
        kubeconfig = up(spec, progress=say)
        proc: ExtenderProc | None = None
        try:
            api = api_client(name)
            publish_gpu_slices(api)
            create_classes_and_templates(api, [1, 2, 4, 8])
            install_crds(api)
            paths = {n["metadata"]["name"]: from_labels(n["metadata"]["name"],
                                                        n["metadata"].get("labels") or {},
                                                        PRESETS[DialectName.TOPOSERVE])
                     for n in rest(api).request("GET", "/api/v1/nodes")["items"]}
            if extender:
                proc = ExtenderProc(kubeconfig, port, workdir, dict(extender_config or {}))
                proc.start()
            yield GpuCluster(name, api, kubeconfig, paths, proc)
        finally:
            if proc is not None:
                proc.stop()


def pods(api: Any, selector: str = "", namespace: str = "default") -> list[dict[str, Any]]:
    query = [("labelSelector", selector)] if selector else []
    items: list[dict[str, Any]] = rest(api).request(
        "GET", f"/api/v1/namespaces/{namespace}/pods", query)["items"]
    return items


def bound_nodes(api: Any, selector: str, namespace: str = "default") -> dict[str, str | None]:
    """pod name -> node (None while pending) for pods matching ``selector``."""
    return {p["metadata"]["name"]: p["spec"].get("nodeName")
            for p in pods(api, selector, namespace)}


def wait_bound(api: Any, selector: str, count: int, timeout: float = 90) -> dict[str, str]:
    def check() -> dict[str, str]:
        got = bound_nodes(api, selector)
        if len(got) == count and all(got.values()):
            return {k: v for k, v in got.items() if v}
        return {}
    return wait_for(f"{count} pods of {selector} bound", check, timeout=timeout, interval=0.3)


def create_pods(api: Any, items: list[dict[str, Any]], namespace: str = "default") -> None:
    for p in items:
        rest(api).request("POST", f"/api/v1/namespaces/{namespace}/pods", body=p)


class SlowBinder:
    """A stand-in scheduler for pods whose ``schedulerName`` is ``NAME``, so a
    test decides where pods go and when they bind. It asks the extender as
    the scheduler does (filter, then prioritize over what passed), allocates
    the pod's claim on a node that passed (the test's choice, or the
    extender's top one) and binds the pod, or leaves it unbound to hold open
    the window the real scheduler leaves between its DRA plugin writing the
    allocation (PreBind) and the binding."""

    NAME = "slow-binder"

    def __init__(self, gc: GpuCluster) -> None:
        assert gc.extender is not None
        self.api, self.url = gc.api, gc.extender.url
        self.http = urllib3.PoolManager()

    def _ask(self, verb: str, pod: dict[str, Any], names: list[str]) -> Any:
        r = self.http.request("POST", f"{self.url}/{verb}", timeout=10,
                              body=orjson.dumps({"Pod": pod, "NodeNames": names}))
        assert r.status == 200, f"{verb}: {r.status} {r.data!r}"
        return orjson.loads(r.data)

    def schedule(self, name: str, names: list[str], node: str | None = None, *,
                 bind: bool = True, namespace: str = "default") -> str:
        """The node the pod's claim is allocated on (and the pod bound to)."""
        def made() -> dict[str, Any]:
            got: dict[str, Any] = rest(self.api).request(
                "GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
            return got if (got.get("status") or {}).get("resourceClaimStatuses") else {}
        pod = wait_for(f"{name}'s claim made", made, timeout=30, interval=0.2)

        def passed() -> list[str]:  # once the extender's watches show what came before
            got: list[str] = self._ask("filter", pod, names)["NodeNames"]
            return got if node is None or node in got else []
        scores = self._ask("prioritize", pod, wait_for(
            f"the extender to pass {name} on {node or 'a node'}", passed, timeout=10,
            interval=0.2))
        if node is None:
            node = str(max(scores, key=lambda s: s["Score"])["Host"])
        claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
        used = {int(m.group(1)) for c in rest(self.api).request("GET", claims)["items"]
                for r in (((c.get("status") or {}).get("allocation") or {}).get("devices") or
                          {}).get("results") or []
                if r["pool"] == node and (m := re.match(r"gpu-(\d+)", r["device"]))}
        (status,) = pod["status"]["resourceClaimStatuses"]
        claim = rest(self.api).request("GET", f"{claims}/{status['resourceClaimName']}")
        (request,) = claim["spec"]["devices"]["requests"]
        free = [i for i in range(_gpus_on(self.api, node)) if i not in used]
        claim["status"] = {
            "allocation": {"devices": {"results": [
                {"request": request["name"], "driver": DRIVER, "pool": node, "device": f"gpu-{i}"}
                for i in free[:request["exactly"]["count"]]]}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": pod["metadata"]["uid"]}]}
        rest(self.api).request("PUT", f"{claims}/{claim['metadata']['name']}/status", body=claim)
        if bind:
            self.bind(name, node, namespace)
        return node

    def bind(self, name: str, node: str, namespace: str = "default") -> None:
        rest(self.api).request("POST", f"/api/v1/namespaces/{namespace}/pods/{name}/binding",
                               body={"apiVersion": "v1", "kind": "Binding",
                                     "metadata": {"name": name},
                                     "target": {"apiVersion": "v1", "kind": "Node",
                                                "name": node}})


def _gpus_on(api: Any, node: str) -> int:
    labels = rest(api).request("GET", f"/api/v1/nodes/{node}")["metadata"]["labels"]
    return len([d for d in load_profile(labels[PROFILE_LABEL]).hardware().devices()
                if d.kind == "gpu"])


def scheduling_events(api: Any, pod: str, namespace: str = "default") -> list[str]:
    evs = rest(api).request("GET", f"/api/v1/namespaces/{namespace}/events",
                            [("fieldSelector", f"involvedObject.name={pod}")])["items"]
    return [str(e.get("message") or "") for e in evs if e.get("reason") == "FailedScheduling"]


def delete_all(api: Any, namespace: str = "default") -> None:
    """Every pod and owner object of the namespace, at once; back when
    their claims are gone too."""
    r = rest(api)
    for path in OWNERS:
        r.request("DELETE", path.format(ns=namespace))
    r.request("DELETE", f"/api/v1/namespaces/{namespace}/pods",
              [("gracePeriodSeconds", 0)])

    def gone() -> bool:
        claims = r.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{namespace}/"
                                  "resourceclaims")["items"]
        return not pods(api, namespace=namespace) and not claims
    wait_for("pods and their claims gone", gone, timeout=60, interval=0.3)
