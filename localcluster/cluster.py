"""Bring a real local cluster up and down: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler as local processes (kwokctl's
binary runtime), plus kwok's controller making fake nodes Ready and fake
pods Running. Everything listens on 127.0.0.1."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import urllib3
import yaml

from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster import crds
from toposerve.localcluster.clusters import (
    ClusterError,
    api_client,
    cluster_dir,
    kubeconfig_path,
    kwok_workdir,
)
from toposerve.localcluster.nodes import KWOK_ANNOTATION, MAX_NODES, node_manifest
from toposerve.localcluster.processes import commands_under, end_processes
from toposerve.localcluster.tools import Tools, ToolsMissing, find_tools
from toposerve.topology.config_file import ConfigError
from toposerve.topology.labels import PRESETS, DialectName
from toposerve.topology.layout import plan_nodes
from toposerve.topology.profiles import load_profile

# kwok gives each pod an IP from its node's podCIDR (127.x, see nodes.py);
# a node without one falls back to this range, which is loopback too.
KWOK_ARGS = ["--extra-args", "kwok-controller=cidr=127.15.0.0/16",
             # only the fake nodes: a real kubelet node (localcluster.realnode) is left alone
             "--extra-args", "kwok-controller=manage-all-nodes=false",
             "--extra-args",
             f"kwok-controller=manage-nodes-with-annotation-selector={KWOK_ANNOTATION}=fake"]
HEARTBEAT_FACTOR = 5
NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,30}[a-z0-9])?$")
META_FILE = "toposerve.json"
NODES = "/api/v1/nodes"
Progress = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class ClusterSpec:
    name: str = "toposerve"
    groups: list[tuple[str, int]] = field(default_factory=list)  # (profile, node count)
    scheduler_config: Path | None = None
    dialect: DialectName = DialectName.TOPOSERVE
    ready_timeout_s: float | None = None  # default: 60 s + 0.2 s a node
    # the controller-manager's client QPS and burst (its default limits claim creation)
    controller_manager_qps: int | None = None
    controller_manager_burst: int | None = None  # default: the same as its QPS
    # the controller-manager's --controllers, e.g. "*,-statefulset-controller" for tests
    # whose pods are owned by StatefulSets that no controller should act on
    controllers: str = ""
    # Kubernetes feature gates and built-in APIs for every component, e.g. the
    # in-tree workload scheduling: "GenericWorkload=true,TopologyAwareWorkloadScheduling=true"
    # and "scheduling.k8s.io/v1beta1=true" (docs/design.md §5)
    feature_gates: str = ""
    runtime_config: str = ""
    # gates for the scheduler alone, e.g. "SchedulerPreQueueingHints=true"
    scheduler_feature_gates: str = ""
    # GOGC of Go components by name ("kube-apiserver": 400): the collector's
    # share of their CPU against the memory they hold (docs/scale.md)
    gogc: dict[str, int] = field(default_factory=dict)
    # seconds between a kwok node's full status patches, 600 or more (kwok
    # waits between this and 1.1x; None: kwokctl's 600 s, which sends every
    # node's patch within the same ten seconds: 500 a second at 5,000 nodes)
    node_status_s: int | None = None
    # CRDs installed once the nodes are up, by name (toposerve.localcluster.crds.CRDS),
    # e.g. ("inference-pool",): the InferencePool of the Gateway API Inference Extension
    crds: tuple[str, ...] = ()


def _kwokctl(tools: Tools, *args: str, check: bool = True,
             timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KWOK_WORKDIR": str(kwok_workdir())}
    proc = subprocess.run([str(tools.kwokctl), *args], env=env, text=True,
                          capture_output=True, timeout=timeout, check=False)
    if check and proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ClusterError(f"kwokctl {' '.join(args[:3])} failed: {last}")
    return proc


def running_clusters(tools: Tools | None = None) -> list[str]:
    tools = tools or find_tools()
    out = _kwokctl(tools, "get", "clusters").stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


SCHEDULER_OPEN_PATHS = "/healthz,/readyz,/livez,/metrics,/debug/pprof/*"


def _scheduler_gates(spec: ClusterSpec) -> str:
    """The scheduler's own --feature-gates: every component's gates too,
    should kwokctl's flag for those give way to it."""
    if not spec.scheduler_feature_gates:
        return ""
    return ",".join(g for g in (spec.feature_gates, spec.scheduler_feature_gates) if g)


def _config_documents(spec: ClusterSpec) -> str:
    # Bind every component to loopback. (kwok's pod range is set by flag in
    # KWOK_ARGS: a KwokConfiguration document here would replace kwok's
    # defaults rather than amend them.)
    docs: list[dict[str, Any]] = [
        {"apiVersion": "config.kwok.x-k8s.io/v1alpha1", "kind": "KwokctlConfiguration",
         "options": {"runtime": "binary", "bindAddress": "127.0.0.1",
                     "kubeAuthorization": True, "kubeAdmission": True}},
    ]
    if spec.node_status_s:
        # kwokctl multiplies the frequency by heartbeatFactor (the leases'
        # duration too): pinned here to its default, 5
        docs[0]["options"] |= {"heartbeatFactor": HEARTBEAT_FACTOR,
                               "nodeStatusUpdateFrequencyMilliseconds":
                                   spec.node_status_s * 1000 // HEARTBEAT_FACTOR}
    # One of each runs, so nothing to elect; with election on, a lease renewal
    # that a loaded machine delays past its deadline exits the process, and
    # the cluster silently stops creating or scheduling pods.
    no_election = {"key": "leader-elect", "value": "false"}
    args: dict[str, list[dict[str, str]]] = {"kube-controller-manager": [no_election]}
    if spec.controller_manager_qps:
        # here, not as --extra-args: kwokctl 0.8.0 panics on five of those
        q = str(spec.controller_manager_qps)
        burst = str(spec.controller_manager_burst or spec.controller_manager_qps)
        args["kube-controller-manager"] += [{"key": "kube-api-qps", "value": q},
                                            {"key": "kube-api-burst", "value": burst}]
    if spec.controllers:
        args["kube-controller-manager"].append({"key": "controllers", "value": spec.controllers})
    # CPU profiles of the scheduler (scale runs, bench.dra_sched): it cannot
    # authenticate our client cert (no delegated authn), and it listens on
    # loopback only, so let its pprof paths through as kwokctl lets /metrics
    args["kube-scheduler"] = [no_election, {"key": "authorization-always-allow-paths",
                                            "value": SCHEDULER_OPEN_PATHS}]
    if gates := _scheduler_gates(spec):
        # a second --feature-gates adds to the one kwokctl writes for every component
        args["kube-scheduler"].append({"key": "feature-gates", "value": gates})
    patches: list[dict[str, Any]] = []
    for name in sorted(set(args) | set(spec.gogc)):
        patch: dict[str, Any] = {"name": name}
        if args.get(name):
            patch["extraArgs"] = args[name]
        if name in spec.gogc:
            patch["extraEnvs"] = [{"name": "GOGC", "value": str(spec.gogc[name])}]
        if len(patch) > 1:
            patches.append(patch)
    docs[0]["componentsPatches"] = patches
    return yaml.safe_dump_all(docs)


def validate(spec: ClusterSpec) -> None:
    """Every check that needs no cluster, so bad input fails before anything starts."""
    if not NAME_RE.fullmatch(spec.name):
        raise ClusterError(f"--name {spec.name!r}: use 1-32 lower-case letters, digits and '-'")
    if not spec.groups:
        raise ClusterError("give at least one --profile (e.g. --profile hgx-h100 --nodes 4)")
    for profile, count in spec.groups:
        if count <= 0:
            raise ClusterError(f"node count for {profile} must be > 0, got {count}")
        try:
            load_profile(profile)
        except ConfigError as err:
            raise ClusterError(str(err).splitlines()[0]) from None
    total = sum(c for _, c in spec.groups)
    if total > MAX_NODES:
        raise ClusterError(f"{total} nodes requested; at most {MAX_NODES} fit the loopback ranges")
    if spec.scheduler_config is not None and not spec.scheduler_config.is_file():
        raise ClusterError(f"--scheduler-config {spec.scheduler_config}: no such file")
    for comp, value in spec.gogc.items():
        if comp not in COMPONENTS or value < 1:
            raise ClusterError(f"gogc: {comp}={value}: give a component of "
                               f"{', '.join(COMPONENTS)} and a GOGC of at least 1")
    for name in spec.crds:
        if name not in crds.CRDS:
            raise ClusterError(f"--crd {name}: give one of {', '.join(crds.CRDS)}")


def _create_nodes(api: Any, manifests: list[dict[str, Any]], progress: Progress) -> None:
    rest = JsonApi(api)
    done = 0
    with ThreadPoolExecutor(max_workers=16) as pool:
        for _ in pool.map(lambda m: rest.request("POST", NODES, body=m), manifests):
            done += 1
            if done % 250 == 0 or done == len(manifests):
                progress(f"created {done}/{len(manifests)} nodes")


def _ready(node: dict[str, Any]) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def wait_nodes_ready(api: Any, count: int, timeout_s: float, progress: Progress,
                     name: str) -> None:
    rest = JsonApi(api)
    deadline = time.monotonic() + timeout_s
    last = -1
    while True:
        nodes = rest.request("GET", NODES, [("labelSelector", "type=kwok")]).get("items") or []
        ready = sum(1 for n in nodes if _ready(n))
        if ready != last:
            progress(f"{ready}/{count} nodes Ready")
            last = ready
        if ready >= count:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"only {ready}/{count} nodes Ready after {timeout_s:.0f}s; "
                               f"kwok-controller: {_last_log_line(name, 'kwok-controller')}")
        time.sleep(0.5)


def _last_log_line(name: str, component: str) -> str:
    """The component's last log line: the workdir, logs included, is deleted
    when ``up`` fails, so the reason must travel in the message."""
    try:
        lines = (cluster_dir(name) / "logs" / f"{component}.log").read_text().splitlines()
    except OSError:
        return "(no log)"
    return next((x.strip() for x in reversed(lines) if x.strip()), "(empty log)")[-300:]


COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
              "kwok-controller")


def check_components(name: str) -> None:
    """Every component still running (a bad flag or config makes one exit)."""
    running = set(commands_under(cluster_dir(name)).values())
    for comp in COMPONENTS:
        if comp not in running:
            raise ClusterError(f"{comp} exited: {_last_log_line(name, comp)}")


def wait_default_service_account(api: Any, timeout_s: float = 120) -> None:
    """Pods are refused until the controller-manager makes ``default/default``."""
    rest = JsonApi(api)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            rest.request("GET", "/api/v1/namespaces/default/serviceaccounts/default")
            return
        except ApiError as err:
            if err.status != 404 or time.monotonic() > deadline:
                raise ClusterError("default service account never appeared") from err
        time.sleep(0.5)


def up(spec: ClusterSpec, progress: Progress = _stderr, attempts: int = 3) -> Path:
    """Create the cluster; returns its kubeconfig path. On any failure the
    half-made cluster is deleted again, and a bring-up that failed is tried
    again: kwokctl picks free ports before its components bind them, so a
    cluster someone else starts at the same moment can take one first (or
    our client meets the other cluster's apiserver and refuses its
    certificate)."""
    validate(spec)
    try:
        tools = find_tools()
    except ToolsMissing as err:
        raise ClusterError(str(err)) from None
    for name in spec.crds:
        crds.crd_file(name)  # fetched before the cluster starts: no half-made cluster
    if spec.name in running_clusters(tools):
        raise ClusterError(f"cluster {spec.name!r} already exists: run `toposerve cluster "
                           f"down --name {spec.name}` first or pick another --name")
    for attempt in range(1, attempts + 1):
        try:
            return _up_once(spec, tools, progress)
        except (ClusterError, urllib3.exceptions.HTTPError) as err:
            if attempt == attempts:
                raise
            progress(f"cluster {spec.name!r} did not come up ({str(err)[:200]}); again")
    raise AssertionError("unreachable")


def _up_once(spec: ClusterSpec, tools: Tools, progress: Progress) -> Path:
    profiles = [(load_profile(p), c) for p, c in spec.groups]
    planned = plan_nodes(profiles)
    dialect = PRESETS[spec.dialect]
    by_name = {p.name: p for p, _ in profiles}
    manifests = [node_manifest(n, by_name[n.profile], dialect) for n in planned]

    started = time.monotonic()
    progress(f"starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok "
             f"for cluster {spec.name!r}")
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Path(tmp) / "kwok.yaml"
        cfg.write_text(_config_documents(spec))
        args = ["--name", spec.name, "--config", str(cfg), "create", "cluster",
                "--runtime", "binary", "--kubeconfig", "",
                "--kube-apiserver-binary", str(tools.kube_apiserver),
                "--kube-controller-manager-binary", str(tools.kube_controller_manager),
                "--kube-scheduler-binary", str(tools.kube_scheduler),
                "--kwok-controller-binary", str(tools.kwok),
                "--etcd-binary", str(tools.etcd),
                "--wait", "2m", *KWOK_ARGS]
        if spec.scheduler_config:
            args += ["--kube-scheduler-config", str(spec.scheduler_config.resolve())]
        if spec.feature_gates:
            args += ["--kube-feature-gates", spec.feature_gates]
        if spec.runtime_config:
            args += ["--kube-runtime-config", spec.runtime_config]
        try:
            _kwokctl(tools, *args)
            progress(f"control plane up in {time.monotonic() - started:.1f}s")
            api = api_client(spec.name)
            _create_nodes(api, manifests, progress)
            timeout = spec.ready_timeout_s or 60 + 0.2 * len(manifests)
            wait_nodes_ready(api, len(manifests), timeout, progress, spec.name)
            wait_default_service_account(api)
            if spec.crds:
                took = crds.install_named(JsonApi(api), list(spec.crds))
                progress(f"CRDs {', '.join(spec.crds)} served in {took:.1f}s")
            check_components(spec.name)
            meta = {"name": spec.name, "groups": spec.groups, "dialect": spec.dialect.value,
                    "nodes": len(manifests), "upSeconds": round(time.monotonic() - started, 2)}
            (cluster_dir(spec.name) / META_FILE).write_text(json.dumps(meta, indent=2))
        except BaseException:
            progress(f"cluster {spec.name!r} failed to come up; deleting what was started")
            _delete(tools, spec.name)
            raise
    progress(f"cluster {spec.name!r} ready with {len(manifests)} nodes in "
             f"{time.monotonic() - started:.1f}s")
    return kubeconfig_path(spec.name)


def _delete(tools: Tools, name: str) -> None:
    from toposerve.localcluster.realnode.node import stop as stop_real_node

    try:
        stop_real_node(name)  # first: it drains its pods through the API server
    finally:
        _kwokctl(tools, "--name", name, "delete", "cluster", check=False, timeout=120)
        # kwokctl signals the components and returns; make sure they are gone,
        # and that no workdir is left behind when it could not stop cleanly.
        end_processes(cluster_dir(name))
        shutil.rmtree(cluster_dir(name), ignore_errors=True)


def down(name: str, progress: Progress = _stderr) -> None:
    tools = find_tools()
    if name not in running_clusters(tools):
        raise ClusterError(f"no cluster named {name!r} (see `toposerve cluster status`)")
    _delete(tools, name)
    progress(f"cluster {name!r} deleted")


@dataclass
class ClusterStatus:
    name: str
    kubeconfig: str
    nodes_ready: int | None
    nodes_total: int | None
    groups: list[tuple[str, int]]
    error: str | None = None
    real_nodes: list[str] = field(default_factory=list)  # kubelet nodes, not kwok's


def status() -> list[ClusterStatus]:
    tools = find_tools()
    out = []
    for name in running_clusters(tools):
        meta_file = cluster_dir(name) / META_FILE
        meta = json.loads(meta_file.read_text()) if meta_file.exists() else {}
        st = ClusterStatus(name=name, kubeconfig=str(kubeconfig_path(name)), nodes_ready=None,
                           nodes_total=None, groups=[tuple(g) for g in meta.get("groups", [])])
        try:
            nodes = JsonApi(api_client(name)).request("GET", NODES, timeout=5).get("items") or []
            st.nodes_total = len(nodes)
            st.nodes_ready = sum(1 for n in nodes if _ready(n))
            st.real_nodes = [str(n["metadata"]["name"]) for n in nodes if KWOK_ANNOTATION
                             not in (n["metadata"].get("annotations") or {})]
        except Exception as err:  # report, don't crash: status is for diagnosis
            st.error = f"apiserver not answering: {type(err).__name__}"
        out.append(st)
    return out
