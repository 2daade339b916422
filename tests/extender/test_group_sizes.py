"""Group sizes as pods, LeaderWorkerSets and PodGroups say them, read by one
strict parser: ASCII digits (or a JSON integer), 1 to MAX_GROUP_SIZE;
anything else makes the group's pods fail every node with a reason naming
where the size came from, never a guess and never an exception."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from harness import extender_objects as k
from toposerve.localcluster.scale import controllers as ctl
from toposerve.scheduler_ext.placement.decide import Outcome, Policy, filter_member
from toposerve.scheduler_ext.placement.groups import (
    BadCount,
    count,
    identify,
    lws_pods,
    pod_group_spec,
)
from toposerve.scheduler_ext.placement.model import MAX_GROUP_SIZE
from toposerve.topology.labels import PRESETS, DialectName
from toposerve.topology.workloads import GROUP_SIZE, LWS_SIZE, LWS_SUBGROUP_SIZE

pytestmark = pytest.mark.unit

TOPO = PRESETS[DialectName.TOPOSERVE]


@pytest.mark.parametrize("value, n", [
    ("1", 1), ("3", 3), ("007", 7), (str(MAX_GROUP_SIZE), MAX_GROUP_SIZE), (4, 4),
])
def test_whole_numbers_in_range_are_sizes(value: object, n: int) -> None:
    assert count(value, "size") == n


@pytest.mark.parametrize("value, why", [
    ("0", "less than 1"), ("-3", "not a whole number"), (-3, "less than 1"), (0, "less than 1"),
    ("\u0663", "not a whole number"),  # Arabic-Indic three: int() reads it as 3
    ("\uff13", "not a whole number"),  # fullwidth three
    ("\u00b2", "not a whole number"),  # superscript two: str.isdigit() says yes
    (" 3", "not a whole number"), ("3 ", "not a whole number"), ("+3", "not a whole number"),
    ("3_0", "not a whole number"), ("3.0", "not a whole number"), ("", "not a whole number"),
    ("0x10", "not a whole number"), (3.0, "not a whole number"), (True, "not a whole number"),
    ([3], "not a whole number"),
    (str(MAX_GROUP_SIZE + 1), f"more than {MAX_GROUP_SIZE}"),
    (MAX_GROUP_SIZE + 1, f"more than {MAX_GROUP_SIZE}"),
    ("9" * 5000, f"more than {MAX_GROUP_SIZE}"),  # past int()'s 4300-digit limit, no error
])
def test_anything_else_is_refused_naming_its_source(value: object, why: str) -> None:
    with pytest.raises(BadCount) as err:
        count(value, "toposerve.io/group-size")
    message = str(err.value)
    assert message.startswith("toposerve.io/group-size: ") and why in message
    assert len(message) < 200  # a 250 KiB annotation is not quoted whole


def test_a_count_may_start_at_zero_where_zero_is_real() -> None:
    assert count("0", "spec.replicas", least=0) == 0
    with pytest.raises(BadCount, match="less than 0"):
        count(-1, "spec.replicas", least=0)


def _lws_pod(notes: dict[str, str], labels: dict[str, str] | None = None) -> dict[str, Any]:
    return ctl.pod("wide-0", labels={"leaderworkerset.sigs.k8s.io/name": "wide",
                                     "leaderworkerset.sigs.k8s.io/group-index": "0",
                                     **(labels or {})}, annotations=notes)


@pytest.mark.parametrize("pod, source", [
    (k.toposerve_pods("g", 2, claim_template="gpu4")[0], GROUP_SIZE),
    (_lws_pod({LWS_SIZE: "2"}), LWS_SIZE),
    (_lws_pod({LWS_SIZE: "4", LWS_SUBGROUP_SIZE: "2",
               "leaderworkerset.sigs.k8s.io/subgroup-exclusive-topology": "rack"},
              {"leaderworkerset.sigs.k8s.io/subgroup-key": "s0"}), LWS_SUBGROUP_SIZE),
])
@pytest.mark.parametrize("bad", ["0", "-3", "\u0663", "1" + "0" * 9])
def test_a_pods_bad_size_is_its_groups_problem(pod: dict[str, Any], source: str,
                                               bad: str) -> None:
    pod = copy.deepcopy(pod)  # shared by the parameters
    assert (good := identify(pod, TOPO)) is not None and good.problem is None
    md = pod["metadata"]
    (md["labels"] if source in md.get("labels", {}) else md["annotations"])[source] = bad
    ref = identify(pod, TOPO)
    assert ref is not None and ref.size is None
    assert ref.problem is not None and ref.problem.startswith(f"{source}: {bad!r}")


def _leader_worker_set(replicas: object, size: object) -> dict[str, Any]:
    sets, _ = k.disaggregated_pods("pd", 0, {"prefill": (1, 2)}, claim_template="gpu4")
    lws = sets[0]
    lws["spec"]["replicas"] = replicas
    lws["spec"]["leaderWorkerTemplate"]["size"] = size
    return lws


@pytest.mark.parametrize("replicas, size, pods, problem", [
    (2, 3, 6, None), (0, 3, 0, None),  # scaled to zero: no pods, nothing wrong
    (-1, 3, 0, "spec.replicas: -1 is less than 0"),
    (2, 0, 0, "spec.leaderWorkerTemplate.size: 0 is less than 1"),
    (2, "3", 6, None),  # as digits: the parser reads both spellings
    (2, True, 0, "spec.leaderWorkerTemplate.size: True is not a whole number"),
    (2, 10**9, 0, f"spec.leaderWorkerTemplate.size: 1000000000 is more than {MAX_GROUP_SIZE}"),
])
def test_a_leader_worker_sets_counts(replicas: object, size: object, pods: int,
                                     problem: str | None) -> None:
    key, n, bad = lws_pods(_leader_worker_set(replicas, size))
    assert key is not None and n == pods
    if problem is None:
        assert bad is None
    else:
        assert bad is not None and problem in bad and "LeaderWorkerSet default/" in bad


@pytest.mark.parametrize("min_count, ok", [(6, True), (0, False), (-3, False), (True, False),
                                           ("6", True), ("\u0666", False)])
def test_a_pod_groups_min_count(min_count: object, ok: bool) -> None:
    pg = k.pod_group("gang", 6)
    pg["spec"]["schedulingPolicy"]["gang"]["minCount"] = min_count
    size, _, problem = pod_group_spec(pg, TOPO)
    assert (size, problem is None) == ((6, True) if ok else (None, False))
    if not ok:
        assert problem is not None and problem.startswith(
            "PodGroup spec.schedulingPolicy.gang.minCount: ")


def _filter(st: Any, key: str, uid: str) -> tuple[Outcome, str, bool]:
    view = st.snapshot()
    group = view.groups[key]
    names = sorted(view.nodes)[:3]
    res = filter_member(view, group, uid, names, Policy(), 1000.0)
    assert res.passed == [] and set(res.failed) == set(names)
    return res.outcome, next(iter(res.failed.values())), res.unresolvable


def test_a_pod_group_with_a_bad_min_count_fails_its_pods_with_the_reason() -> None:
    st = k.cluster_state(k.planned(("gb200-nvl72", 18)), templates=[k.template("gpu4", 4)])
    pg = k.pod_group("gang", 2)
    pg["spec"]["schedulingPolicy"]["gang"]["minCount"] = -3
    st.pod_group("ADDED", pg)
    for p in k.pod_group_pods("gang", 2, claim_template="gpu4", uid_prefix="pg"):
        st.pod("ADDED", p)
    outcome, reason, unresolvable = _filter(st, "podgroup/default/gang", "pg-0")
    assert outcome == Outcome.BAD_METADATA and unresolvable
    assert reason == ("cannot place the pod's group: PodGroup "
                      "spec.schedulingPolicy.gang.minCount: -3 is less than 1")


def test_a_slice_whose_leader_worker_set_counts_are_bad_fails_its_pods() -> None:
    st = k.cluster_state(k.planned(("gb200-nvl72", 18)), templates=[k.template("gpu4", 4)])
    sets, pods = k.disaggregated_pods("pd", 0, {"prefill": (1, 2), "decode": (1, 2)},
                                      claim_template="gpu4", uid_prefix="s")
    sets[1]["spec"]["replicas"] = -1
    st.relist("lws", sets)
    for p in pods:
        st.pod("ADDED", p)
    ref = identify(pods[0], TOPO)
    assert ref is not None
    outcome, reason, unresolvable = _filter(st, ref.key, pods[0]["metadata"]["uid"])
    assert outcome == Outcome.BAD_METADATA and unresolvable
    assert reason.startswith("cannot place the pod's group: LeaderWorkerSet default/")
    assert reason.endswith("spec.replicas: -1 is less than 0")
