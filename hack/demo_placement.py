"""``make demo``, placement: the installed extender and the second
kube-scheduler that calls it (``toposerve-scheduler``, pods on the real node) place
a wide-EP group and two P/D sets; the same pods, in the same interleaved
order, are placed once by kube-scheduler alone. The demo prints where each
pod landed (rack / NVLink domain), why, and the two side by side."""

from __future__ import annotations

import random
import textwrap
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from demo_support import (
    DemoError,
    create,
    http_ok,
    items,
    wait_until,
)

from toposerve.kubeapi import JsonApi
from toposerve.localcluster.clusters import api_client
from toposerve.localcluster.nodes import KWOK_TOLERATION
from toposerve.manifests.values import DeviceClasses, Scheduler
from toposerve.scheduler_ext.config import ExtenderConfig
from toposerve.scheduler_ext.placement.levels import display, domain_of, parse_level
from toposerve.scheduler_ext.state.facts import PLACEMENT_ANNOTATION
from toposerve.topology.distance import kv_transfer_seconds, node_tier
from toposerve.topology.labels import PRESETS, PROFILE_LABEL, DialectName, from_labels
from toposerve.topology.model import DomainPath, Tier
from toposerve.topology.profiles import load_profile
from toposerve.topology.quantity import parse_quantity
from toposerve.topology.workloads import GROUP, GROUP_SIZE, LEVEL, PREFERRED_LEVEL, ROLE

Say = Callable[[str], None]
SCHEDULER = Scheduler().scheduler_name  # the install's default
DIALECT = PRESETS[DialectName.TOPOSERVE]
GPU_CLASS = DeviceClasses().gpu
WHOLE_GPU = "device.attributes['gpu.toposerve.io'].type == 'gpu'"
KV_BYTES = parse_quantity(ExtenderConfig().placement.kv_size_per_request)
RUNS = (("kube-scheduler alone", "default-scheduler", "by-kube-scheduler"),
        ("with the extender", SCHEDULER, "by-extender"))


@dataclass(frozen=True)
class GroupSpec:
    name: str
    profile: str
    roles: tuple[tuple[str, int], ...]  # (role, pods); role "" for a wide-EP gang
    gpus: int  # per pod
    level: tuple[str, str]  # (label, level): required or preferred
    what: str

    def pods(self) -> list[tuple[str, str]]:
        return [(f"{self.name}-{role + '-' if role else ''}{i}", role)
                for role, n in self.roles for i in range(n)]


GROUPS = (
    GroupSpec("wide-ep", "gb200-nvl72", (("", 16),), 4, (LEVEL, "rack"),
              "wide-EP gang, 16 pods x 4 GPUs (EP 64), required level: rack"),
    GroupSpec("pd", "gb200-nvl72", (("prefill", 1), ("decode", 4)), 4,
              (PREFERRED_LEVEL, "nvlink"),
              "P/D set, 1 prefill + 4 decode pods x 4 GPUs, preferred level: NVLink domain"),
)

# a gang no rack can hold: 76 GPUs, a rack has 72
TOO_BIG = GroupSpec("wide-ep-xl", "gb200-nvl72", (("", 19),), 4, (LEVEL, "rack"),
                    "19 pods x 4 GPUs in one rack")


@dataclass
class Placed:
    """Where one run put each group's pods, and the extender's word on it."""

    took_s: float
    nodes: dict[str, dict[str, str]] = field(default_factory=dict)  # group -> pod -> node
    roles: dict[str, str] = field(default_factory=dict)  # pod -> role
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)  # group -> annotation


def _template(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "gpus-4", "namespace": namespace},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": GPU_CLASS, "count": 4,
                "selectors": [{"cel": {"expression": WHOLE_GPU}}]}}]}}}}


def _pod(g: GroupSpec, pod: str, role: str, namespace: str, scheduler: str) -> dict[str, Any]:
    labels = {"app": "demo-placement", GROUP: g.name,
              GROUP_SIZE: str(sum(n for _, n in g.roles)), g.level[0]: g.level[1]}
    if role:
        labels[ROLE] = role
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod, "namespace": namespace, "labels": labels},
            "spec": {"schedulerName": scheduler,
                     "containers": [{"name": "main", "image": "vllm/vllm-openai"}],
                     "tolerations": [KWOK_TOLERATION],
                     "nodeSelector": {PROFILE_LABEL: g.profile},
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "gpus-4"}]}}


def _submit_and_wait(rest: JsonApi, namespace: str, scheduler: str,
                     alive: Callable[[], bool]) -> Placed:
    """Create every group's pods, interleaved (the same order each run);
    wait until all are bound; read where they went."""
    create(rest, "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                        "metadata": {"name": namespace}})
    create(rest, f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaimtemplates",
           _template(namespace))
    pods = [(g, pod, role) for g in GROUPS for pod, role in g.pods()]
    random.Random(16).shuffle(pods)
    started = time.monotonic()
    for g, pod, role in pods:
        rest.request("POST", f"/api/v1/namespaces/{namespace}/pods",
                     body=_pod(g, pod, role, namespace, scheduler))
    path = f"/api/v1/namespaces/{namespace}/pods"

    def bound() -> list[dict[str, Any]]:
        got = items(rest, path, "app=demo-placement") if alive() else []
        return got if len(got) == len(pods) and all(p["spec"].get("nodeName")
                                                    for p in got) else []
    try:
        got = wait_until(f"{len(pods)} pods bound by {scheduler}", bound, timeout=120)
    except DemoError:
        _print_pending(rest, namespace)
        raise
    took = time.monotonic() - started
    if scheduler == SCHEDULER:
        # the extender records a group's decision on a pod after answering
        # the filter call: it may land just after the pods are bound
        def recorded() -> list[dict[str, Any]]:
            got = items(rest, path, "app=demo-placement")
            have = {p["metadata"]["labels"][GROUP] for p in got
                    if PLACEMENT_ANNOTATION in (p["metadata"].get("annotations") or {})}
            return got if have >= {g.name for g in GROUPS} else []
        got = wait_until("the extender's decisions on the groups' pods", recorded, timeout=20)
    out = Placed(took)
    for p in got:
        md = p["metadata"]
        group = md["labels"][GROUP]
        out.nodes.setdefault(group, {})[md["name"]] = p["spec"]["nodeName"]
        out.roles[md["name"]] = md["labels"].get(ROLE, "")
        note = (md.get("annotations") or {}).get(PLACEMENT_ANNOTATION)
        if note:
            out.decisions[group] = orjson.loads(note)
    return out


def _print_pending(rest: JsonApi, namespace: str) -> None:
    for p in items(rest, f"/api/v1/namespaces/{namespace}/pods", "app=demo-placement"):
        if p["spec"].get("nodeName"):
            continue
        evs = items(rest, f"/api/v1/namespaces/{namespace}/events")
        said = [e.get("message", "") for e in evs
                if e["involvedObject"].get("name") == p["metadata"]["name"]]
        print(f"     still pending: {p['metadata']['name']}: {said[-1] if said else '(no event)'}")


def _clean(rest: JsonApi, namespace: str) -> None:
    """Delete the run's pods; back once their claims are gone too (so the
    next run starts from the same free devices)."""
    pods = f"/api/v1/namespaces/{namespace}/pods"
    rest.request("DELETE", pods, [("gracePeriodSeconds", 0)])
    claims = f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims"
    wait_until(f"the pods and claims of {namespace} gone",
               lambda: not items(rest, pods) and not items(rest, claims), timeout=90)


def _no_fit(rest: JsonApi, alive: Callable[[], bool]) -> None:
    """A group that fits no rack: pending with the extender's reason, and
    none of its pods stranded on a node."""
    ns = RUNS[1][2]
    path = f"/api/v1/namespaces/{ns}/pods"
    for pod, role in TOO_BIG.pods():
        rest.request("POST", path, body=_pod(TOO_BIG, pod, role, ns, SCHEDULER))

    def reason() -> str | None:
        for e in items(rest, f"/api/v1/namespaces/{ns}/events") if alive() else []:
            if e.get("reason") == "FailedScheduling" and \
                    e["involvedObject"].get("name", "").startswith(TOO_BIG.name):
                return str(e.get("message", ""))
        return None
    msg = wait_until(f"the scheduler's reason for {TOO_BIG.name}", reason, timeout=60)
    bound = [p["metadata"]["name"] for p in items(rest, path, f"{GROUP}={TOO_BIG.name}")
             if p["spec"].get("nodeName")]
    print(f"   then {TOO_BIG.name}, {TOO_BIG.what} (76 GPUs; a rack has 72), to the extender: "
          f"{len(bound)} of 19 pods bound;\n   the scheduler's event:")
    print(textwrap.fill(msg, width=96, initial_indent="     ", subsequent_indent="     "))
    if bound:
        raise DemoError(f"pods {bound} of {TOO_BIG.name} stranded on nodes")
    _clean(rest, ns)


def _kv_ms(g: GroupSpec, nodes: dict[str, str], roles: dict[str, str],
           paths: dict[str, DomainPath]) -> tuple[float, Tier] | None:
    """Mean modelled time (ms) for a decode pod to pull one request's KV
    from its nearest prefill pod, and the farthest tier crossed."""
    pre = [paths[n] for p, n in nodes.items() if roles[p] == "prefill"]
    dec = [paths[n] for p, n in nodes.items() if roles[p] == "decode"]
    if not pre or not dec:
        return None
    links = load_profile(g.profile).links()
    best = [min(pre, key=lambda s: kv_transfer_seconds(KV_BYTES, s, d, links)) for d in dec]
    ms = [1000 * kv_transfer_seconds(KV_BYTES, s, d, links) for s, d in zip(best, dec,
                                                                              strict=True)]
    return sum(ms) / len(ms), max(node_tier(s, d) for s, d in zip(best, dec, strict=True))


def _natural(pod: str) -> tuple[str, int]:
    stem, _, index = pod.rpartition("-")
    return stem, int(index)


def _where(g: GroupSpec, placed: Placed, paths: dict[str, DomainPath]) -> list[str]:
    """One line per NVLink domain the group uses: its rack and its pods."""
    by: dict[tuple[str, str], list[str]] = defaultdict(list)
    for pod, node in sorted(placed.nodes[g.name].items(), key=lambda kv: _natural(kv[0])):
        p = paths[node]
        by[(p.rack or "?", p.nvlink or "?")].append(pod.removeprefix(g.name + "-"))
    return [f"rack {rack}, NVLink domain {nvl}: {' '.join(names)}"
            for (rack, nvl), names in sorted(by.items())]


def _summary(g: GroupSpec, placed: Placed, paths: dict[str, DomainPath]) -> str:
    nodes = placed.nodes[g.name]
    racks = len({paths[n].rack for n in nodes.values()})
    nvl = len({paths[n].nvlink for n in nodes.values()})
    text = f"{racks} rack{'s' * (racks > 1)}, {nvl} NVLink domain{'s' * (nvl > 1)}"
    kv = _kv_ms(g, nodes, placed.roles, paths)
    if kv is not None:
        text += f"; KV {kv[0]:.1f} ms/request"
    return text


def _why(g: GroupSpec, placed: Placed, paths: dict[str, DomainPath],
         extender: bool) -> list[str]:
    nodes = placed.nodes[g.name]
    kv = _kv_ms(g, nodes, placed.roles, paths)
    pull = [] if kv is None else [
        f"KV: a decode pod pulls a request's {KV_BYTES / 2**30:g} GiB from the nearest "
        f"prefill in {kv[0]:.1f} ms on average ({kv[1].name.lower()} tier at most)"]
    if not extender:
        return ["why: one pod at a time, no notion of the group: any node with 4 free GPUs "
                "will do", *pull]
    d = placed.decisions.get(g.name)
    if d is None:
        raise DemoError(f"the extender wrote no placement decision on the pods of {g.name}")
    tier = parse_level(d["level"], DIALECT)
    how = "required" if d["required"] else "preferred"
    return [f"why: the extender chose {display(tuple(d['domain']), tier)} for the whole group "
            f"on its first pod ({how} level {d['level']}):",
            f"     room for all {len(nodes)} pods, fewest NVLink domains, then least left over",
            *pull]


def summary_rows(runs: list[tuple[str, Placed]], paths: dict[str, DomainPath]
                 ) -> list[list[str]]:
    """group, scheduler, where it landed, why: a row each, for the summary."""
    out = []
    for g in GROUPS:
        for (title, placed), (_, scheduler, _) in zip(runs, RUNS, strict=True):
            d = placed.decisions.get(g.name) if scheduler == SCHEDULER else None
            why = ("one pod at a time, any node with 4 free GPUs" if d is None else
                   f"extender chose {display(tuple(d['domain']), parse_level(d['level'], DIALECT))}"
                   f" ({'required' if d['required'] else 'preferred'} level {d['level']})")
            out.append([g.name, title, _summary(g, placed, paths), why])
    return out


def _check_held(placed: Placed, paths: dict[str, DomainPath]) -> None:
    """Every group inside the domain the extender decided for it."""
    for g in GROUPS:
        d = placed.decisions[g.name]
        tier = parse_level(d["level"], DIALECT)
        out = [p for p, n in placed.nodes[g.name].items()
               if domain_of(paths[n], tier) != tuple(d["domain"])]
        if out:
            raise DemoError(f"{g.name}: pods {out} landed outside "
                            f"{display(tuple(d['domain']), tier)}, the extender's decision")


def _report(runs: list[tuple[str, Placed]], paths: dict[str, DomainPath]) -> None:
    for (title, placed), (_, scheduler, _) in zip(runs, RUNS, strict=True):
        print(f"   {title} (schedulerName {scheduler}): "
              f"{sum(len(v) for v in placed.nodes.values())} pods bound in {placed.took_s:.1f}s")
        for g in GROUPS:
            lines = _where(g, placed, paths)
            print(f"     {g.name:9} " + f"\n     {'':9} ".join(lines))
            for line in _why(g, placed, paths, scheduler == SCHEDULER):
                print(f"     {'':9} {line}")
    print("   side by side:")
    print(f"     {'group':9} {RUNS[0][0]:48} {RUNS[1][0]}")
    for g in GROUPS:
        print(f"     {g.name:9} {_summary(g, runs[0][1], paths):48} "
              f"{_summary(g, runs[1][1], paths)}")


def _decisions(url: str) -> str:
    import urllib3

    text = urllib3.request("GET", f"{url}/metrics", timeout=5).data.decode()
    counts: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("toposerve_extender_decisions_total{"):
            reason = line.split('reason="', 1)[1].split('"', 1)[0]
            counts[reason] += int(float(line.rsplit(" ", 1)[1]))
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "(none)"


def placement(name: str, say: Say, extender_url: str
              ) -> tuple[list[tuple[str, Placed]], dict[str, DomainPath]]:
    """Step: the groups placed by the installed second scheduler and
    extender, and by kube-scheduler alone; both runs and the places of the
    nodes they could use."""
    say("5. Placement: a wide-EP group and a P/D set, with the extender and without it")
    rest = JsonApi(api_client(name))
    # the groups' profile's nodes: where they can land
    profiles = {g.profile for g in GROUPS}
    paths = {n["metadata"]["name"]: from_labels(n["metadata"]["name"],
                                                n["metadata"]["labels"], DIALECT)
             for n in items(rest, "/api/v1/nodes")
             if (n["metadata"].get("labels") or {}).get(PROFILE_LABEL) in profiles}
    print(f"   the installed extender ({extender_url}, the real node's network) and the "
          f"second kube-scheduler\n   (schedulerName {SCHEDULER}) that calls it: filter, "
          "prioritize, preempt")
    print("   the same pods, shuffled together, submitted once to each scheduler "
          "(GPUs by DRA claim templates):")
    for g in GROUPS:
        print(f"     {g.name:9} {g.what}")

    def alive() -> bool:
        if not http_ok(f"{extender_url}/ready"):
            raise DemoError("the installed extender stopped answering /ready")
        return True
    runs: list[tuple[str, Placed]] = []
    for title, scheduler, namespace in RUNS:
        runs.append((title, _submit_and_wait(rest, namespace, scheduler, alive)))
        _clean(rest, namespace)
    _report(runs, paths)
    _check_held(runs[1][1], paths)
    _no_fit(rest, alive)
    print(f"   extender filter outcomes: {_decisions(extender_url)}")
    return runs, paths
