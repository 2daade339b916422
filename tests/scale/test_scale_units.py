"""The scale run's decisions without a cluster: scenarios, the workload's
objects per setup, the fit check, the figures and the report."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from toposerve.localcluster.scale import fit, measure, quality, report
from toposerve.localcluster.scale.controllers import with_owner_uids
from toposerve.localcluster.scale.scenario import (
    Claims,
    ScaleScenario,
    Setup,
    builtins,
    load_scenario,
)
from toposerve.localcluster.scale.workload import GroupPlan, plan
from toposerve.scheduler_ext.config import ExtenderConfig
from toposerve.scheduler_ext.placement.groups import identify
from toposerve.scheduler_ext.state.cache import ClusterState
from toposerve.topology.config_file import ConfigError
from toposerve.topology.labels import PRESETS, DialectName
from toposerve.topology.model import DomainPath, Tier

SMALL = builtins()["small"]
TOPO = PRESETS[DialectName.TOPOSERVE]


def scenario(**changes: object) -> ScaleScenario:
    doc = yaml.safe_load(SMALL.read_text())
    doc.update(changes)
    return ScaleScenario.model_validate(doc)


def test_every_builtin_loads_and_small_has_every_kind_and_setup() -> None:
    assert {"small", "sched-perf-500", "hgx-1000", "nvl72-70-racks", "pd-crowd",
            "mixed-5000"} <= set(builtins())
    for path in builtins().values():
        load_scenario(path)
    small = load_scenario(SMALL)
    kinds = {w.kind for w in small.workload}
    shapes = {str(w.shape) for w in small.workload if isinstance(w, Claims)}
    assert kinds == {"plain", "claim", "wide-ep", "pd", "pod-group"}
    assert shapes == {"one-gpu", "gpus-on-switch", "gpu-nic", "partition"}
    assert set(small.setups) == set(Setup)


def test_bad_scenarios_name_the_field_and_the_fix(tmp_path: Path) -> None:
    doc = yaml.safe_load(SMALL.read_text())
    doc["workload"][1]["profile"] = "a100"
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"workload.*'a100' is none of the scenario's node "
                                          r"profiles.*add nodes of it"):
        load_scenario(bad)
    doc = yaml.safe_load(SMALL.read_text())
    doc["clientLimits"] = {"schedulerQps": 50, "schedulerBurst": 0}
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match="schedulerQps and schedulerBurst: set both"):
        load_scenario(bad)
    doc = yaml.safe_load(SMALL.read_text())
    doc["arrival"]["rate"] = -1
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"arrival.rate: Input should be greater than"):
        load_scenario(bad)
    doc = yaml.safe_load(SMALL.read_text())
    doc["extender"] = {"placement": {"packUngroupd": False}}
    bad.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"extender.placement.packUngroupd: Extra inputs"):
        load_scenario(bad)


def test_each_setup_writes_groups_its_own_way() -> None:
    sc = load_scenario(SMALL)
    by = {s: plan(sc, s) for s in Setup}
    in_tree = by[Setup.IN_TREE]
    kinds = [o["kind"] for _, o in in_tree.objects]
    assert kinds.count("PodGroup") == len(in_tree.groups) == 5
    assert "PodGroup" not in [o["kind"] for _, o in by[Setup.TOPOSERVE].objects]
    grouped = [p for p in in_tree.pods if p.group]
    assert all(p.body["spec"]["schedulingGroup"]["podGroupName"] == p.group for p in grouped)
    ours = {p.kind: p.body["metadata"] for p in by[Setup.TOPOSERVE].pods if p.group}
    assert "leaderworkerset.sigs.k8s.io/exclusive-topology" in ours["wide-ep"]["annotations"]
    assert ours["pd"]["labels"]["disaggregatedset.x-k8s.io/role"] in ("prefill", "decode")
    assert ours["pod-group"]["labels"]["toposerve.io/group-size"] == "6"
    assert "toposerve.io/group" not in {k for p in by[Setup.DEFAULT].pods
                                        for k in p.body["metadata"]["labels"]}
    # ours: groups' pods through the profile that sees every node, the rest the default
    for setup, x in by.items():
        for p in x.pods:
            assert p.body["spec"].get("schedulerName") == (
                "toposerve-scheduler" if setup is Setup.TOPOSERVE and p.group else None), p.name
    # same pods, same order, in every setup
    assert len({tuple(p.name for p in x.pods) for x in by.values()}) == 1
    templates = {o["metadata"]["name"]: o["spec"]["spec"]["devices"]
                 for _, o in in_tree.objects if o["kind"] == "ResourceClaimTemplate"}
    assert templates["gpu-nic-1"]["constraints"][0]["matchAttribute"] == \
        "resource.kubernetes.io/pcieRoot"
    assert templates["gpus-on-switch-2"]["constraints"][0]["matchAttribute"] == \
        "gpu.toposerve.io/pcieSwitch"
    assert templates["partition-1"]["requests"][0]["exactly"]["deviceClassName"] == \
        "scale-gpu-partition"


def test_pd_slices_come_with_their_owners_and_the_extender_knows_their_size() -> None:
    sc = load_scenario(SMALL)
    p = plan(sc, Setup.TOPOSERVE)
    owners = {(o["kind"], o["metadata"]["name"]): o for _, o in p.objects}
    slices = [g for g in p.groups if g.kind == "pd"]
    assert [k for k, _ in owners].count("DisaggregatedSet") == len(slices) == 2
    pods = [x for x in p.pods if x.kind == "pd"]
    st = ClusterState(ExtenderConfig())
    st.relist("lws", [o for (kind, _), o in owners.items() if kind == "LeaderWorkerSet"])
    for i, x in enumerate(pods):
        # every pod's owner chain ends at its slice's DisaggregatedSet, created before it
        chain, obj = [], x.body
        while refs := obj["metadata"].get("ownerReferences"):
            obj = owners[(refs[0]["kind"], refs[0]["name"])]
            chain.append(obj["kind"])
        assert chain == ["StatefulSet", "LeaderWorkerSet", "DisaggregatedSet"], x.name
        assert obj["metadata"]["name"] == x.group
        st.pod("ADDED", {**x.body, "metadata": {**x.body["metadata"], "uid": f"u{i}"}})
    view = st.snapshot()
    for g in slices:
        ref = identify(next(x.body for x in pods if x.group == g.name), TOPO)
        assert ref is not None
        group = view.groups[ref.key]
        assert (group.size, group.size_known) == (g.pods, True)
        assert group.roles() == Counter(g.roles)
        # the figures find the slice's pods by the names the controllers gave them
        names = [g.pod_name(i) for i in range(g.pods)]
        assert sorted(names) == sorted(x.name for x in pods if x.group == g.name)
        assert [next(x.role for x in pods if x.name == n) for n in names] == list(g.roles)
    # owner uids are filled in from what the API gave the owners
    first = pods[0].body
    sts = first["metadata"]["ownerReferences"][0]
    filled = with_owner_uids(first, {(sts["kind"], sts["name"]): "uid-1"})
    assert filled["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert first["metadata"]["ownerReferences"][0]["uid"] == ""  # the plan is not changed


LWS = "leaderworkerset.sigs.k8s.io"
RACK = "topology.toposerve.io/rack"


def _owner(obj: dict[str, Any]) -> tuple[str, str]:
    ref = obj["metadata"]["ownerReferences"][0]
    assert ref["controller"] is True
    return ref["kind"], ref["name"]


@pytest.mark.parametrize("setup", [Setup.DEFAULT, Setup.TOPOSERVE, Setup.IN_TREE])
def test_wide_ep_groups_are_a_leader_worker_set_chain(setup: Setup) -> None:
    sc = load_scenario(SMALL)
    p = plan(sc, setup)
    owners = {(o["kind"], o["metadata"]["name"]): o for _, o in p.objects}
    groups = [g for g in p.groups if g.kind == "wide-ep"]
    assert len(groups) == len(p.workers) == 2
    exclusive = None if setup is Setup.IN_TREE else RACK  # in-tree: the PodGroup has the level
    st = ClusterState(ExtenderConfig())
    for g in groups:
        lws = owners[("LeaderWorkerSet", g.name)]
        assert lws["spec"]["replicas"] == 1
        assert lws["spec"]["leaderWorkerTemplate"]["size"] == g.pods == 9
        assert lws["metadata"]["annotations"].get(f"{LWS}/exclusive-topology") == exclusive
        leader_sts = owners[("StatefulSet", g.name)]
        assert _owner(leader_sts) == ("LeaderWorkerSet", g.name)
        assert leader_sts["metadata"]["annotations"][f"{LWS}/replicas"] == "1"
        # the owners come before what they own, the leader's before the pods
        order = [(o["kind"], o["metadata"]["name"]) for _, o in p.objects]
        assert order.index(("LeaderWorkerSet", g.name)) < order.index(("StatefulSet", g.name))
        planned = {x.name: x for x in p.pods if x.group == g.name}
        leader = planned[g.pod_name(0)]
        assert leader.name == f"{g.name}-0" and leader.leader is None
        lmd = leader.body["metadata"]
        assert _owner(leader.body) == ("StatefulSet", g.name)
        assert lmd["labels"][f"{LWS}/worker-index"] == "0"
        assert lmd["labels"][f"{LWS}/group-index"] == "0"
        key = lmd["labels"][f"{LWS}/group-key"]
        assert lmd["annotations"][f"{LWS}/size"] == "9"
        assert lmd["annotations"].get(f"{LWS}/exclusive-topology") == exclusive
        assert ("affinity" in leader.body["spec"]) == (exclusive is not None)
        # the workers: planned for the figures, made after the leader (pinned once bound)
        w = p.workers[leader.name]
        assert w.pin == exclusive
        sts, workers = w.make("rack-7" if exclusive else None)
        assert _owner(sts) == ("Pod", leader.name) and sts["metadata"]["name"] == leader.name
        assert sts["spec"]["replicas"] == 8 and sts["spec"]["ordinals"] == {"start": 1}
        pinned = sts["spec"]["template"]["spec"]["nodeSelector"]
        assert pinned.get(RACK) == ("rack-7" if exclusive else None)
        assert [x.name for x in workers] == [g.pod_name(i) for i in range(1, 9)]
        assert {x.name for x in workers} | {leader.name} == set(planned)
        for i, x in enumerate(workers, start=1):
            assert planned[x.name].leader == x.leader == leader.name
            md = x.body["metadata"]
            assert _owner(x.body) == ("StatefulSet", leader.name)
            assert md["labels"][f"{LWS}/worker-index"] == str(i)
            assert md["labels"][f"{LWS}/group-key"] == key
            assert md["labels"][f"{LWS}/name"] == g.name
            assert md["annotations"][f"{LWS}/leader-name"] == leader.name
            assert md["annotations"][f"{LWS}/size"] == "9"
            assert md["annotations"].get(f"{LWS}/exclusive-topology") == exclusive
            assert x.body["spec"]["nodeSelector"].get(RACK) == pinned.get(RACK)
            assert (x.body["spec"].get("schedulingGroup") == {"podGroupName": g.name}) == \
                (setup is Setup.IN_TREE)
        for i, x in enumerate([leader, *workers]):
            st.pod("ADDED", {**x.body, "metadata": {**x.body["metadata"], "uid": f"{g.name}-{i}"}})
    if setup is Setup.IN_TREE:
        assert {(o["kind"], o["metadata"]["name"]) for _, o in p.objects} >= \
            {("PodGroup", g.name) for g in groups}
        return
    # the extender sees each group whole from its pods' labels: its size and level
    view = st.snapshot()
    for g in groups:
        ref = identify(next(x.body for x in p.pods if x.name == g.pod_name(0)), TOPO)
        assert ref is not None
        group = view.groups[ref.key]
        assert (group.size, group.size_known, len(group.members)) == (9, True, 9)
        assert group.required == Tier.RACK


def test_fit_refuses_with_both_numbers() -> None:
    sc = load_scenario(SMALL)
    est = fit.estimate(sc).total_mib
    assert fit.check(sc, est + fit.RESERVE_MIB + 1).total_mib == est
    with pytest.raises(fit.DoesNotFit, match=rf"needs about {est:,.0f} MiB .* has 900 MiB "
                                             r"available \(MemAvailable"):
        fit.check(sc, 900)
    big = scenario(nodes=[{"profile": "hgx-h100", "count": 60000},
                          {"profile": "gb200-nvl72", "count": 36},
                          {"profile": "mi300x", "count": 4}])
    assert fit.estimate(big).total_mib > 24 * 1024


def test_scale_run_refuses_what_does_not_fit_before_starting_anything(tmp_path: Path) -> None:
    doc = yaml.safe_load(SMALL.read_text())
    doc["nodes"][0]["count"] = 60000
    doc["name"] = "too-big"
    f = tmp_path / "big.yaml"
    f.write_text(yaml.safe_dump(doc))
    r = subprocess.run([sys.executable, "-m", "toposerve.main", "scale", "run", "-f", str(f),
                        "--out", str(tmp_path / "out"), "--prefix", "ts-scale-never"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, r.stderr
    assert "error: scenario 'too-big' needs about" in r.stderr
    assert "MiB available (MemAvailable" in r.stderr
    assert "starting etcd" not in r.stderr
    assert not (tmp_path / "out").exists()


def test_percentiles_and_histogram_quantiles() -> None:
    assert measure.percentile([3, 1, 2], 0.5) == 2
    assert measure.percentile([0, 10], 0.99) == pytest.approx(9.9)
    assert math.isnan(measure.percentile([], 0.5))
    buckets = [(0.001, 50.0), (0.01, 100.0), (math.inf, 100.0)]
    assert measure.histogram_quantile(buckets, 0.5) == pytest.approx(0.001)
    assert measure.histogram_quantile(buckets, 0.75) == pytest.approx(0.0055)
    assert measure.timeline([10.2, 10.4, 12.1], 10.0) == [(0.0, 2.0), (1.0, 0.0), (2.0, 1.0)]


def test_rates_and_call_latency_come_from_the_difference_of_two_scrapes() -> None:
    def api(n: int) -> str:
        return ("# TYPE apiserver_request_total counter\n"
                f'apiserver_request_total{{verb="POST",resource="pods",subresource="",code="201"}}'
                f" {n}\n"
                f'apiserver_request_total{{verb="POST",resource="pods",subresource="binding",'
                f'code="201"}} {2 * n}\n')
    rows = measure.request_rates(api(10), api(30), 10.0)
    assert rows == [{"verb": "POST", "resource": "pods/binding", "per_s": 4.0, "requests": 40},
                    {"verb": "POST", "resource": "pods", "per_s": 2.0, "requests": 20}]

    def ext(fast: int, slow: int) -> str:
        h = "toposerve_extender_call_seconds"
        return (f"# TYPE {h} histogram\n"
                f'{h}_bucket{{verb="filter",le="0.001"}} {fast}\n'
                f'{h}_bucket{{verb="filter",le="0.01"}} {fast + slow}\n'
                f'{h}_bucket{{verb="filter",le="+Inf"}} {fast + slow}\n'
                f'{h}_count{{verb="filter"}} {fast + slow}\n'
                f'{h}_sum{{verb="filter"}} 0.1\n')
    lat = measure.call_latency(ext(100, 0), ext(190, 10))["filter"]
    assert lat["calls"] == 100
    assert lat["p50_ms"] == pytest.approx(0.5556, rel=1e-3)
    assert 1 < lat["p99_ms"] <= 10
    by_phase = ext(100, 0).replace('verb="filter"', 'verb="filter",phase="lock"')
    phased = measure.call_latency(by_phase, ext(190, 10).replace(
        'verb="filter"', 'verb="filter",phase="lock"'), by=("verb", "phase"))
    assert list(phased) == ["filter/lock"] and phased["filter/lock"]["calls"] == 100

    def sched(ok: int, retried: int, filter_s: float) -> str:
        a, d = "scheduler_schedule_attempts_total", "scheduler_scheduling_attempt_duration_seconds"
        p = "scheduler_framework_extension_point_duration_seconds"
        return (f"# TYPE {a} counter\n"
                f'{a}{{profile="default-scheduler",result="scheduled"}} {ok}\n'
                f'{a}{{profile="default-scheduler",result="unschedulable"}} {retried}\n'
                f"# TYPE {d} histogram\n"
                f'{d}_sum{{profile="default-scheduler",result="scheduled"}} {ok / 10}\n'
                f'{d}_count{{profile="default-scheduler",result="scheduled"}} {ok}\n'
                f"# TYPE {p} histogram\n"
                f'{p}_sum{{extension_point="Filter",profile="default-scheduler",'
                f'status="Success"}} {filter_s}\n'
                f'{p}_sum{{extension_point="Filter",profile="default-scheduler",'
                f'status="Unschedulable"}} 1\n'
                f'{p}_count{{extension_point="Filter",profile="default-scheduler",'
                f'status="Success"}} {ok}\n')
    work = measure.scheduler_work(sched(10, 5, 2.0), sched(30, 5, 5.5))
    # a result that did not move is left out; a point's statuses add up
    assert work == {"attempts": {"scheduled": 20}, "attempt_s": {"scheduled": 2.0},
                    "point_s": {"Filter": 3.5}}


def _paths() -> tuple[dict[str, DomainPath], dict[str, str]]:
    paths = {f"n{r}{i}": DomainPath(zone="z", block="b", rack=f"r{r}", nvlink=f"r{r}",
                                    host=f"n{r}{i}") for r in range(2) for i in range(2)}
    return paths, dict.fromkeys(paths, "gb200-nvl72")


def test_placement_quality_counts_groups_stranded_pods_and_free_room() -> None:
    paths, profiles = _paths()
    groups = [GroupPlan("a", "wide-ep", 2, 4, "gb200-nvl72", "rack"),
              GroupPlan("b", "wide-ep", 2, 4, "gb200-nvl72", "rack"),
              GroupPlan("c", "pod-group", 2, 4, "gb200-nvl72", "rack")]
    where = {"a-0": "n00", "a-1": "n01", "b-0": "n10", "b-1": "n00", "c-0": "n11"}
    used = {"n00": 8, "n01": 4, "n10": 4, "n11": 4}
    q = quality.placement(groups, where, paths, profiles, used)
    assert (q.groups, q.in_one_domain, q.could_fit_one_domain) == (3, 1, 3)
    assert (q.pending_groups, q.stranded_pods, q.never_placed_pods) == (1, 1, 1)
    assert (q.free_gpus, q.largest_free_rack) == (0, 0)
    q = quality.placement(groups[:1], {"a-0": "n00", "a-1": "n01"}, paths, profiles,
                          {"n00": 4, "n01": 4})
    assert (q.free_gpus, q.largest_free_rack, q.fragmentation) == (8, 8, 0.0)
    assert quality.landed(groups[:1], {"a-0": "n00", "a-1": "n10"}, paths) == {
        "r0": {"a": 4}, "r1": {"a": 4}}


def test_kv_time_is_zero_on_one_node_and_grows_across_racks() -> None:
    paths, _ = _paths()
    g = GroupPlan("pd", "pd", 2, 2, "gb200-nvl72", "rack", ("prefill", "decode"))
    assert quality.kv_seconds(g, {"pd-0": "n00", "pd-1": "n00"}, paths) == 0
    near = quality.kv_seconds(g, {"pd-0": "n00", "pd-1": "n01"}, paths)
    far = quality.kv_seconds(g, {"pd-0": "n00", "pd-1": "n10"}, paths)
    assert 0 < near < far
    # churn removed the decode pod's node: the slice is pending, not a KeyError
    q = quality.placement([g], {"pd-0": "n00", "pd-1": "gone"}, paths,
                          {n: "gb200-nvl72" for n in paths}, {"n00": 2})
    assert (q.pending_groups, q.stranded_pods, q.kv_ms) == (1, 1, None)


def test_report_renders_again_from_its_json(tmp_path: Path) -> None:
    setup = {"setup": "default", "cluster": "x", "cluster_up_s": 5.0, "slice_publish_s": 2.0,
             "pods": 3, "bound": 3, "create_errors": 0, "first_create_error": None,
             "measured_pods": 3, "pods_per_s": 30.0, "run_s": 1.0,
             "timeline": [[0.0, 2.0], [1.0, 1.0]],
             "to_bound_s": {"n": 3, "p50": 0.5, "p99": 0.9},
             "to_allocated_s": {"n": 0, "p50": None, "p99": None},
             "cdf": {"to_bound_s": [0.1, 0.5, 0.9], "to_allocated_s": []},
             "churn": {}, "apiserver_requests": [{"verb": "POST", "resource": "pods",
                                                  "requests": 3, "per_s": 3.0}],
             "extender_calls": {}, "processes": [{"process": "etcd", "pid": 1, "cpu_s": 0.1,
                                                  "peak_rss_mib": 50.0}],
             "placement": quality.as_dict(quality.placement([], {}, {}, {}, {})),
             "landed": {"r0": {"g": 4}}}
    doc = {"scenario": load_scenario(SMALL).model_dump(mode="json", by_alias=True),
           "estimate_mib": 900, "started": "now", "setups": [setup]}
    path = report.write(doc, tmp_path)
    first = path.read_text()
    assert "| default | 5.0 | 2.0 | 3/3 | 30.0 |" in first
    assert "## Scheduler attempts" not in first  # a result written before it was measured
    assert "kwok node status every 1800 s; extender placement as shipped." in first
    assert "Not run (the run stopped before them): in-tree, toposerve." in first
    for png in ("pods_per_s.png", "latency_cdf.png", "groups_landed.png"):
        assert (tmp_path / png).stat().st_size > 0
        (tmp_path / png).unlink()
    (tmp_path / report.REPORT).unlink()
    r = subprocess.run([sys.executable, "-m", "toposerve.main", "scale", "report",
                        str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / report.REPORT).read_text() == first
    assert (tmp_path / "groups_landed.png").exists()
    assert json.loads((tmp_path / report.RESULT).read_text())["setups"][0]["bound"] == 3


def test_scheduler_config_states_the_client_limits_and_scoring_per_setup() -> None:
    from toposerve.localcluster.cluster import ClusterSpec, _config_documents
    from toposerve.localcluster.scale.runner import cluster_spec, scheduler_config

    sc = scenario(clientLimits={"schedulerQps": 200, "schedulerBurst": 400,
                                "controllerManagerQps": 0, "controllerManagerBurst": 0},
                  scheduler={"percentageOfNodesToScore": 10})
    plain = scheduler_config(sc, Setup.DEFAULT, "http://127.0.0.1:1")
    assert plain["clientConnection"] == {"qps": 200, "burst": 400}
    assert plain["percentageOfNodesToScore"] == 10 and "extenders" not in plain
    ours = scheduler_config(sc, Setup.TOPOSERVE, "http://127.0.0.1:1")
    assert ours["percentageOfNodesToScore"] == 100
    assert ours["extenders"][0]["urlPrefix"] == "http://127.0.0.1:1"
    # pods of no group sample the nodes as in the other setups (the scenario's 10)
    assert ours["profiles"] == [
        {"schedulerName": "toposerve-scheduler"},
        {"schedulerName": "default-scheduler", "percentageOfNodesToScore": 10}]
    # an extender that waits out samples: the scenario's percentage, or the adaptive default
    sampled = {"placement": {"sampledNodes": True}}
    ours = scheduler_config(scenario(scheduler={"percentageOfNodesToScore": 10},
                                     extender=sampled), Setup.TOPOSERVE, "http://127.0.0.1:1")
    assert ours["percentageOfNodesToScore"] == 10
    ours = scheduler_config(scenario(extender=sampled), Setup.TOPOSERVE, "http://127.0.0.1:1")
    assert "percentageOfNodesToScore" not in ours and ours["extenders"]
    spec = cluster_spec(sc, Setup.IN_TREE, "x", Path("s.yaml"))
    assert "GenericWorkload=true" in spec.feature_gates and spec.controller_manager_qps is None
    assert cluster_spec(sc, Setup.DEFAULT, "x", Path("s.yaml")).feature_gates == ""
    # kwok's nodes patch their status every half hour, not all at once every ten minutes
    assert spec.node_status_s == 1800
    docs = list(yaml.safe_load_all(_config_documents(spec)))
    assert docs[0]["options"]["nodeStatusUpdateFrequencyMilliseconds"] == 360_000
    assert docs[0]["options"]["heartbeatFactor"] == 5  # kwokctl's: it multiplies by it
    assert "nodeStatusUpdateFrequencyMilliseconds" not in next(iter(yaml.safe_load_all(
        _config_documents(ClusterSpec(name="x")))))["options"]


def test_scheduler_gates_reach_the_scheduler_alone_in_every_setup() -> None:
    from toposerve.localcluster.cluster import _config_documents, _scheduler_gates
    from toposerve.localcluster.scale.runner import cluster_spec

    sc = scenario(scheduler={"featureGates": {"SchedulerPreQueueingHints": True,
                                              "NominatedNodeNameForExpectation": False}})
    flag = "NominatedNodeNameForExpectation=false,SchedulerPreQueueingHints=true"
    for setup in Setup:
        assert cluster_spec(sc, setup, "x", Path("s.yaml")).scheduler_feature_gates == flag
    # the in-tree setup's gates stay on the scheduler beside its own
    both = _scheduler_gates(cluster_spec(sc, Setup.IN_TREE, "x", Path("s.yaml")))
    assert both.startswith("GenericWorkload=true") and both.endswith(flag)
    assert _scheduler_gates(cluster_spec(scenario(), Setup.IN_TREE, "x", Path("s.yaml"))) == ""
    spec = cluster_spec(scenario(scheduler={"featureGates": {"SchedulerPreQueueingHints": True}},
                                 gogc={"kube-apiserver": 400}), Setup.DEFAULT, "x", Path("s"))
    spec.controllers = ""
    docs = list(yaml.safe_load_all(_config_documents(spec)))
    patches = {p["name"]: p for p in docs[0]["componentsPatches"]}
    assert {"key": "feature-gates", "value": "SchedulerPreQueueingHints=true"} in \
        patches["kube-scheduler"]["extraArgs"]
    assert patches["kube-apiserver"] == {"name": "kube-apiserver",
                                         "extraEnvs": [{"name": "GOGC", "value": "400"}]}
    assert "extraEnvs" not in patches["kube-scheduler"]
    assert set(patches) == {"kube-apiserver", "kube-controller-manager", "kube-scheduler"}


def test_the_single_scheduler_and_controller_manager_elect_no_leader() -> None:
    """A lost lease exits the process (a loaded machine delays renewals): one
    of each runs, so election is off, with or without a scheduler config."""
    from toposerve.localcluster.cluster import ClusterSpec, _config_documents

    for spec in (ClusterSpec(name="x"),
                 ClusterSpec(name="x", scheduler_config=Path("s.yaml"), controllers="*")):
        docs = list(yaml.safe_load_all(_config_documents(spec)))
        patches = {p["name"]: p for p in docs[0]["componentsPatches"]}
        for comp in ("kube-scheduler", "kube-controller-manager"):
            assert {"key": "leader-elect", "value": "false"} in patches[comp]["extraArgs"], comp
    with pytest.raises(ValueError, match=r"gogc\.kube-proxy"):
        scenario(gogc={"kube-proxy": 200})
    from toposerve.localcluster.cluster import ClusterSpec, validate
    from toposerve.localcluster.clusters import ClusterError
    with pytest.raises(ClusterError, match=r"gogc: kube-apiserver=0: give a component of etcd"):
        validate(ClusterSpec(name="x", groups=[("hgx-h100", 1)], gogc={"kube-apiserver": 0}))


def test_gates_are_read_from_what_the_component_reports() -> None:
    text = ('# HELP kubernetes_feature_enabled x\n# TYPE kubernetes_feature_enabled gauge\n'
            'kubernetes_feature_enabled{name="SchedulerPreQueueingHints",stage="ALPHA"} 1\n'
            'kubernetes_feature_enabled{name="NominatedNodeNameForExpectation",stage="BETA"} 0\n')
    assert measure.gates_enabled(text, ["SchedulerPreQueueingHints",
                                        "NominatedNodeNameForExpectation", "NoSuchGate"]) == {
        "NoSuchGate": False, "NominatedNodeNameForExpectation": False,
        "SchedulerPreQueueingHints": True}


def test_bad_gates_and_drivers_name_the_field_and_the_fix() -> None:
    with pytest.raises(ValueError, match=r"'preQueue' is not a feature gate name"):
        scenario(scheduler={"featureGates": {"preQueue": True}})
    with pytest.raises(ValueError, match=r"the gpu-nic shape needs NICs; add net.toposerve.io"):
        scenario(drivers=["gpu.toposerve.io"])
    with pytest.raises(ValueError, match=r"drivers\.0"):
        scenario(drivers=["nvidia.com"])
    doc = yaml.safe_load(SMALL.read_text())
    doc["workload"] = [w for w in doc["workload"] if w.get("shape") != "gpu-nic"]
    doc["drivers"] = ["gpu.toposerve.io"]
    assert ScaleScenario.model_validate(doc).drivers == ["gpu.toposerve.io"]


def test_churn_adds_new_nodes_with_fresh_names_and_addresses() -> None:
    from toposerve.localcluster.scale.runner import extra_nodes
    from toposerve.topology.layout import plan_nodes
    from toposerve.topology.profiles import load_profile

    sc = load_scenario(SMALL)
    first = plan_nodes([(load_profile(g.profile), g.count) for g in sc.nodes])
    more = extra_nodes(sc)
    assert len(more) == sc.churn.nodes_added
    assert not {n.name for n in more} & {n.name for n in first}
    assert [n.index for n in more] == list(range(len(first), len(first) + len(more)))


def test_an_unknown_scenario_name_lists_the_builtins() -> None:
    from toposerve.localcluster.scale.scenario import resolve

    with pytest.raises(ConfigError, match=r"no built-in scenario of that name \(built-ins: "
                                          r".*small"):
        resolve("no-such-scenario")


def test_partitioned_nodes_are_the_first_of_their_group() -> None:
    from toposerve.localcluster.scale.runner import whole_gpu_nodes

    sc = scenario(nodes=[{"profile": "gb200-nvl72", "count": 36},
                         {"profile": "hgx-h100", "count": 8, "partitioned": 3},
                         {"profile": "mi300x", "count": 4}])
    # the NVL72 and mi300x groups publish everything they have (all partitioned, or none to)
    assert whole_gpu_nodes(sc) == [f"hgx-h100-{i:04d}" for i in range(3, 8)]
    assert whole_gpu_nodes(load_scenario(SMALL)) == [f"hgx-h100-{i:04d}" for i in range(4, 8)]
    # whole-GPU nodes publish fewer devices, and the estimate says so
    assert fit.devices_per_node("hgx-h100", partitions=False) == 8 + 8
    assert fit.devices_per_node("hgx-h100") == 80 + 8
    assert fit.estimate(sc).devices_mib < fit.estimate(load_scenario(SMALL)).devices_mib
    # the GPU driver alone publishes no NICs; a larger GOGC holds more heap
    assert fit.devices_per_node("hgx-h100", False, ("gpu.toposerve.io",)) == 8
    one = {"profile": "hgx-h100", "count": 500, "partitioned": 0}
    claims = [{"kind": "claim", "shape": "one-gpu", "count": 100}]
    both = scenario(nodes=[one], workload=claims)
    alone = scenario(nodes=[one], workload=claims, drivers=["gpu.toposerve.io"])
    assert fit.estimate(alone).devices_mib == pytest.approx(fit.estimate(both).devices_mib / 2)
    roomy = scenario(nodes=[one], workload=claims, gogc={"kube-apiserver": 400})
    assert fit.heap_factor(roomy) == 2.5 and fit.heap_factor(both) == 1
    assert fit.estimate(roomy).devices_mib == pytest.approx(2.5 * fit.estimate(both).devices_mib)
    with pytest.raises(ValueError, match=r"partitioned: 9 of 8 nodes; give at most count"):
        scenario(nodes=[{"profile": "hgx-h100", "count": 8, "partitioned": 9}])
