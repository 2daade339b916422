"""Groups read from pods as kubernetes-sigs/lws (060ab4d) leaves them: the
labels and annotations its LeaderWorkerSet controller and pod webhook put on
leaders and workers (subgroups included), and a DisaggregatedSet's system
labels; the extender's group key, size and required level from them."""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any

import pytest

from harness.extender_objects import disaggregated_pods, lws_pods
from toposerve.localcluster.scale import controllers as ctl
from toposerve.scheduler_ext.placement.groups import identify
from toposerve.scheduler_ext.placement.groups import lws_pods as lws_pod_count
from toposerve.scheduler_ext.placement.levels import parse_level
from toposerve.scheduler_ext.placement.model import Source
from toposerve.topology.labels import PRESETS, DialectName
from toposerve.topology.workloads import (
    DS_NAME,
    DS_REVISION,
    DS_ROLE,
    DS_SLICE,
    LLMD_ROLE,
    LWS_EXCLUSIVE,
    LWS_GROUP_INDEX,
    LWS_GROUP_KEY,
    LWS_LEADER_NAME,
    LWS_NAME,
    LWS_REVISION,
    LWS_SIZE,
    LWS_SUBGROUP_EXCLUSIVE,
    LWS_SUBGROUP_INDEX,
    LWS_SUBGROUP_KEY,
    LWS_SUBGROUP_POLICY,
    LWS_SUBGROUP_SIZE,
    LWS_WORKER_INDEX,
)

DIALECT = PRESETS[DialectName.TOPOSERVE]
RACK = DIALECT.rack or ""
def sha1(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


KEY = f"lws/default/wide/{sha1('default/wide-0')}/5d8f9c7b6"  # group 0 of "wide"
STS_LABELS = {"statefulset.kubernetes.io/pod-name", "apps.kubernetes.io/pod-index",
              "controller-revision-hash"}


def group(size: int, *, exclusive: str | None = RACK, subgroup: tuple[int, str] | None = None,
          subgroup_exclusive: str | None = None) -> list[dict[str, Any]]:
    """Group 0 of a LeaderWorkerSet ``wide`` of ``size`` pods: leader first."""
    lws = ctl.leader_worker_set("wide", 1, size, exclusive=exclusive,
                                template_labels={"app": "llm"}, subgroup=subgroup,
                                subgroup_exclusive=subgroup_exclusive, uid="lws-uid")
    return lws_pods("wide", 0, size, claim_template="t", lws=lws)


@pytest.mark.unit
def test_pods_carry_exactly_what_lws_writes() -> None:
    leader, worker, _ = group(3, subgroup=(1, "LeaderWorker"), subgroup_exclusive=RACK)
    key = leader["metadata"]["labels"][LWS_GROUP_KEY]
    assert key == sha1("default/wide-0")  # upstream's genGroupUniqueKey(namespace, leader)
    sub = {i: sha1(f"wide-0/{i}") for i in (0, 1)}  # genGroupUniqueKey(leader, index)
    lab, ann = (leader["metadata"][k] for k in ("labels", "annotations"))
    assert {k: v for k, v in lab.items() if k not in STS_LABELS} == {
        "app": "llm", LWS_NAME: "wide", LWS_WORKER_INDEX: "0", LWS_REVISION: "5d8f9c7b6",
        LWS_GROUP_INDEX: "0", LWS_GROUP_KEY: key, LWS_SUBGROUP_INDEX: "0",
        LWS_SUBGROUP_KEY: sub[0]}
    assert ann == {LWS_SIZE: "3", LWS_EXCLUSIVE: RACK, LWS_SUBGROUP_POLICY: "LeaderWorker",
                   LWS_SUBGROUP_SIZE: "1", LWS_SUBGROUP_EXCLUSIVE: RACK}
    lab, ann = (worker["metadata"][k] for k in ("labels", "annotations"))
    assert {k: v for k, v in lab.items() if k not in STS_LABELS} == {
        "app": "llm", LWS_NAME: "wide", LWS_WORKER_INDEX: "1", LWS_REVISION: "5d8f9c7b6",
        LWS_GROUP_INDEX: "0", LWS_GROUP_KEY: key, LWS_SUBGROUP_INDEX: "1",
        LWS_SUBGROUP_KEY: sub[1]}
    assert ann == {LWS_SIZE: "3", LWS_EXCLUSIVE: RACK, LWS_LEADER_NAME: "wide-0",
                   LWS_SUBGROUP_POLICY: "LeaderWorker", LWS_SUBGROUP_SIZE: "1",
                   LWS_SUBGROUP_EXCLUSIVE: RACK}
    # the webhook's affinity terms: one for the group, one for the subgroup
    terms = leader["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert [t["labelSelector"]["matchExpressions"][0]["values"] for t in terms] == [[key], [sub[0]]]


@pytest.mark.unit
def test_a_group_is_one_group_of_its_size_in_its_exclusive_domain() -> None:
    pods = group(4)
    refs = [identify(p, DIALECT) for p in pods]
    assert all(r is not None for r in refs)
    assert {(r.key, r.source, r.size, r.required) for r in refs if r} == {
        (KEY, Source.LWS, 4, parse_level(RACK, DIALECT))}


@pytest.mark.unit
@pytest.mark.parametrize(("size", "sub", "policy"), [
    (5, 2, "LeaderWorker"),    # only size-1 divides: the leader is the first subgroup's extra
    (4, 2, "LeaderWorker"),    # size divides: the leader is one of the first subgroup's
    (5, 2, "LeaderExcluded"),  # the leader in no subgroup
    (3, 1, "LeaderWorker"),    # both divide: the leader alone in subgroup 0
    (9, 4, "LeaderExcluded"),
])
def test_exclusive_subgroups_are_groups_of_the_size_lws_makes_them(size: int, sub: int,
                                                                   policy: str) -> None:
    pods = group(size, exclusive=None, subgroup=(sub, policy), subgroup_exclusive=RACK)
    refs = [identify(p, DIALECT) for p in pods]
    members = Counter(r.key for r in refs if r)
    assert len(members) > 1
    for p, r in zip(pods, refs, strict=True):
        assert r is not None
        # every pod of a subgroup says the size it has; the group waits for no one else
        assert r.size == members[r.key], (p["metadata"]["name"], r)
        in_subgroup = LWS_SUBGROUP_KEY in p["metadata"]["labels"]
        assert r.required == (parse_level(RACK, DIALECT) if in_subgroup else None)
        assert in_subgroup or (policy == "LeaderExcluded" and r.key.endswith("/leader"))
    assert sum(members.values()) == size


@pytest.mark.unit
def test_group_exclusive_wins_over_subgroup_exclusive() -> None:
    refs = [identify(p, DIALECT) for p in group(5, subgroup=(2, "LeaderWorker"),
                                                subgroup_exclusive=DIALECT.block)]
    assert {(r.key, r.size, r.required) for r in refs if r} == {
        (KEY, 5, parse_level(RACK, DIALECT))}


@pytest.mark.unit
def test_disaggregated_set_slice_pods_and_their_leaderworkersets() -> None:
    sets, pods = disaggregated_pods("pd", 1, {"prefill": (2, 1), "decode": (1, 2)},
                                    claim_template="t", revision="7f9b8c1d")
    assert [s["metadata"]["name"] for s in sets] == ["pd-1-7f9b8c1d-prefill",
                                                     "pd-1-7f9b8c1d-decode"]
    for s in sets:  # the system labels on the LeaderWorkerSet and its template
        role = s["metadata"]["labels"][DS_ROLE]
        system = {"app": f"pd-1-{role}", DS_ROLE: role, DS_SLICE: "1", DS_NAME: "pd",
                  DS_REVISION: "7f9b8c1d"}
        assert s["metadata"]["labels"] == system
        assert s["spec"]["leaderWorkerTemplate"]["workerTemplate"]["metadata"]["labels"] == {
            LLMD_ROLE: role, **system}
    refs = [identify(p, DIALECT) for p in pods]
    key = "disaggregatedset/default/pd/1/7f9b8c1d"
    assert {(r.key, r.source, r.size) for r in refs if r} == {
        (key, Source.DISAGGREGATED_SET, None)}
    assert Counter(r.role for r in refs if r) == {"prefill": 2, "decode": 2}
    # the slice's size comes from its LeaderWorkerSets
    assert [lws_pod_count(s) for s in sets] == [(key, 2, None), (key, 2, None)]
    assert sum(n for _, n, _ in map(lws_pod_count, sets)) == len(pods)
