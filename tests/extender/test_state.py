"""The watch-fed cache: free accelerators from slices, claims and bound
pods; groups as each controller labels them; decisions read back from pods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from harness import extender_objects as k
from toposerve.localcluster.scale import controllers as ctl
from toposerve.scheduler_ext.config import ExtenderConfig
from toposerve.scheduler_ext.placement.groups import identify
from toposerve.scheduler_ext.placement.model import Decision, Shape, Source
from toposerve.scheduler_ext.state.cache import ClusterState
from toposerve.scheduler_ext.state.facts import PLACEMENT_ANNOTATION, decision_annotation
from toposerve.topology.labels import PRESETS, DialectName
from toposerve.topology.layout import PlannedNode
from toposerve.topology.model import Tier

TOPO = PRESETS[DialectName.TOPOSERVE]


def state_with(*groups: tuple[str, int]) -> tuple[ClusterState, list[PlannedNode]]:
    nodes = k.planned(*groups)
    return k.cluster_state(nodes, templates=[k.template("gpu4", 4), k.template("gpu8", 8)]), nodes


def bound(p: dict[str, Any], node: str, uid: str) -> dict[str, Any]:
    p["metadata"]["uid"] = uid
    p["spec"]["nodeName"] = node
    p["status"] = {"phase": "Running"}
    return p


def test_capacity_counts_each_gpu_once_even_with_partitions() -> None:
    st, nodes = state_with(("hgx-h100", 2), ("gb200-nvl72", 1))
    view = st.snapshot()
    hgx, gb = nodes[0].name, nodes[2].name
    assert view.nodes[hgx].capacity == 8  # partitions share their GPU's counter set
    assert view.nodes[gb].capacity == 4
    assert view.nodes[hgx].partitioned and not view.nodes[gb].partitioned
    assert view.nodes[hgx].path.rack == nodes[0].path.rack


def test_only_the_newest_generation_of_a_pool_counts() -> None:
    st, nodes = state_with(("gb200-nvl72", 1))
    old = k.gpu_slice(nodes[0], generation=1)
    new = k.gpu_slice(nodes[0], generation=2)
    new["metadata"]["name"] += "-v2"
    new["spec"]["devices"] = new["spec"]["devices"][:2]
    st.resource_slice("ADDED", new)
    assert st.snapshot().nodes[nodes[0].name].capacity == 2
    st.resource_slice("DELETED", new)
    st.resource_slice("MODIFIED", old)
    assert st.snapshot().nodes[nodes[0].name].capacity == 4


def allocated_claim(name: str, node: str, pod: str, uid: str) -> dict[str, Any]:
    """A claim for 4 GPUs as the scheduler's DRA plugin leaves it: allocated on ``node``."""
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": k.GPU_CLASS, "count": 4}}]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": "gpu.toposerve.io", "pool": node,
                 "device": f"gpu-{i}"} for i in range(4)]}},
                "reservedFor": [{"resource": "pods", "name": pod, "uid": uid}]}}


def test_used_counts_allocated_claims_and_bound_pods_not_yet_allocated() -> None:
    st, nodes = state_with(("gb200-nvl72", 1))
    name = nodes[0].name
    p = bound(ctl.pod("w", claim_template="gpu4"), name, "u1")
    st.pod("ADDED", p)
    assert st.snapshot().nodes[name].used == 4  # bound, claim not made yet: its demand
    claim = allocated_claim("w-gpu-abc", name, "w", "u1")
    st.resource_claim("ADDED", claim)
    p["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": "w-gpu-abc"}]
    st.pod("MODIFIED", p)
    view = st.snapshot()
    assert view.nodes[name].used == 4 and view.nodes[name].free == 0  # not 8
    st.pod("DELETED", p)
    st.resource_claim("DELETED", claim)
    assert st.snapshot().nodes[name].used == 0


def test_a_relist_drops_what_is_gone() -> None:
    st, nodes = state_with(("gb200-nvl72", 2))
    st.relist("nodes", [k.node(nodes[0])])
    assert set(st.snapshot().nodes) == {nodes[0].name}


def test_lws_group_as_lws_labels_it() -> None:
    st, _ = state_with(("gb200-nvl72", 18))
    leader, *workers = k.lws_pods("ep", 0, 9, claim_template="gpu4", uid_prefix="ep")
    st.pod("ADDED", leader)  # the workers do not exist until the leader is placed
    ref = identify(leader, TOPO)
    assert ref is not None and ref.required == Tier.RACK
    g = st.snapshot().groups[ref.key]
    assert g.source == Source.LWS and g.size == 9 and len(g.members) == 1
    assert g.pending() == [4] * 9
    for w in workers:
        st.pod("ADDED", w)
    assert len(st.snapshot().groups[ref.key].members) == 9


def test_disaggregated_slice_is_one_pd_group_per_revision() -> None:
    st, _ = state_with(("gb200-nvl72", 18))
    sets, pods = k.disaggregated_pods("inf", 0, {"prefill": (4, 1), "decode": (1, 2)},
                                      claim_template="gpu4", uid_prefix="s0")
    st.pod("ADDED", pods[0])  # only the first prefill pod so far
    ref = identify(pods[0], TOPO)
    assert ref is not None
    g = st.snapshot().groups[ref.key]
    assert (g.size, g.size_known) == (1, False)  # no LeaderWorkerSet seen: what is there
    # the pods do not say how many there will be; the slice's LeaderWorkerSets do
    st.relist("lws", sets[:1])
    g = st.snapshot().groups[ref.key]
    assert (g.size, g.size_known) == (4, True)  # the prefill role's 4x1 pods
    st.leader_worker_set("ADDED", sets[1])
    g = st.snapshot().groups[ref.key]
    assert g.size == 6
    for p in pods[1:]:
        st.pod("ADDED", p)
    g = st.snapshot().groups[ref.key]
    assert g.size == 6 and g.shape == Shape.PD
    assert g.roles() == {"prefill": 4, "decode": 2}
    st.relist("lws", sets[1:])  # the prefill LWS went away
    assert st.snapshot().groups[ref.key].size == 6  # its pods are still there
    st.leader_worker_set("DELETED", sets[1])
    assert st.snapshot().groups[ref.key].size == 6
    _, other = k.disaggregated_pods("inf", 0, {"prefill": (1, 1)}, claim_template="gpu4",
                                    revision="newrev00", uid_prefix="s0new")
    assert identify(other[0], TOPO) != ref  # a new revision is a group of its own


def test_the_waiting_pods_of_a_group_are_handed_on_once_its_size_is_known() -> None:
    st, nodes = state_with(("gb200-nvl72", 18))
    told: list[tuple[str, list[tuple[str, str]]]] = []
    st.on_size_known = lambda g, pods: told.append((g.key, pods))
    sets, pods = k.disaggregated_pods("inf", 0, {"prefill": (2, 1), "decode": (1, 1)},
                                      claim_template="gpu4", uid_prefix="s0")
    st.pod("ADDED", bound(pods[0], nodes[0].name, "s0-0-0-0"))  # joined after a restart
    for p in pods[1:]:
        st.pod("ADDED", p)
    st.relist("podgroups", [k.pod_group("other", 2)])  # not this group's size
    assert told == []
    st.relist("lws", sets)
    ref = identify(pods[0], TOPO)
    assert ref is not None
    waiting = [("default", p["metadata"]["name"]) for p in pods[1:]]
    assert [(key, sorted(ps)) for key, ps in told] == [(ref.key, sorted(waiting))]
    st.leader_worker_set("MODIFIED", sets[0])  # known already: nothing to retry
    assert len(told) == 1
    gang = k.pod_group_pods("gang", 2, claim_template="gpu4", uid_prefix="pg")
    for p in gang:
        st.pod("ADDED", p)
    st.pod_group("ADDED", k.pod_group("gang", 2))
    assert told[-1] == ("podgroup/default/gang", [("default", "gang-0"), ("default", "gang-1")])


def test_a_groups_pod_at_another_scheduler_is_told_once_until_it_comes_back() -> None:
    nodes = k.planned(("gb200-nvl72", 18))
    cfg = ExtenderConfig.model_validate({"schedulerName": "toposerve-scheduler"})
    st = k.cluster_state(nodes, templates=[k.template("gpu4", 4)], cfg=cfg)
    told: list[tuple[str, str, str]] = []
    st.on_elsewhere = lambda p, name: told.append((p.name, p.ref.key if p.ref else "", name))
    ours, stray, default = k.toposerve_pods("ep", 3, claim_template="gpu4", uid_prefix="ep")
    ours["spec"]["schedulerName"] = "toposerve-scheduler"
    stray["spec"]["schedulerName"] = "toposerve-ungrouped"
    default["spec"].pop("schedulerName", None)  # the apiserver's default
    plain = k.pod("web-0", claim_template="gpu4", uid="web-0")  # of no group: anyone's
    plain["spec"]["schedulerName"] = "default-scheduler"
    for p in (ours, stray, default, plain):
        st.pod("ADDED", p)
    assert sorted(told) == [("ep-1", "toposerve/default/ep", "toposerve-ungrouped"),
                            ("ep-2", "toposerve/default/ep", "default-scheduler")]
    assert st.elsewhere == {"ep-1", "ep-2"}
    st.pod("MODIFIED", stray)  # said once a pod, not at each of its updates
    assert len(told) == 2
    st.pod("MODIFIED", bound(stray, nodes[0].name, "ep-1"))  # placed: no longer waiting
    st.pod("DELETED", default)
    assert st.elsewhere == set() and len(told) == 2
    # unset: not checked (a scheduler-config without --scheduler-name: default-scheduler)
    st = k.cluster_state(nodes, templates=[k.template("gpu4", 4)])
    st.on_elsewhere = lambda p, name: told.append((p.name, "", name))
    st.pod("ADDED", k.toposerve_pods("ep", 3, claim_template="gpu4", uid_prefix="ep")[1])
    assert st.elsewhere == set() and len(told) == 2


def test_the_scheduler_name_is_one_a_pod_can_name() -> None:
    with pytest.raises(ValidationError, match=r"no pod's spec\.schedulerName"):
        ExtenderConfig.model_validate({"schedulerName": "Toposerve_Scheduler"})


def test_pod_group_size_and_level_come_from_the_pod_group() -> None:
    st, _ = state_with(("gb200-nvl72", 18))
    st.relist("podgroups", [k.pod_group("gang", 6)])
    for p in k.pod_group_pods("gang", 2, claim_template="gpu4", uid_prefix="pg"):
        st.pod("ADDED", p)
    g = st.snapshot().groups["podgroup/default/gang"]
    assert (g.size, g.required, g.source) == (6, Tier.RACK, Source.POD_GROUP)
    assert g.size_known
    st.relist("podgroups", [])  # its PodGroup not seen: the size is the PodGroup's to say
    g = st.snapshot().groups["podgroup/default/gang"]
    assert (g.size, g.size_known) == (2, False)


def test_toposerve_labels_and_a_bad_level() -> None:
    good = k.toposerve_pods("g", 2, claim_template="gpu4", preferred="nvlink")[0]
    ref = identify(good, TOPO)
    assert ref is not None and ref.preferred == Tier.NVLINK and ref.size == 2
    bad = k.toposerve_pods("g", 2, claim_template="gpu4", level="shelf")[0]
    ref = identify(bad, TOPO)
    assert ref is not None and ref.problem is not None and "shelf" in ref.problem
    assert identify(ctl.pod("plain", labels={"llm-d.ai/role": "decode"}), TOPO) is None


def test_a_decision_written_on_a_pod_is_found_again_and_the_oldest_wins() -> None:
    st, nodes = state_with(("gb200-nvl72", 18))
    p = k.toposerve_pods("g", 3, claim_template="gpu4", uid_prefix="g")
    ref = identify(p[0], TOPO)
    assert ref is not None
    rack = (nodes[0].path.zone, nodes[0].path.block, nodes[0].path.rack)
    older = Decision(ref.key, Tier.RACK, rack, 100.0, 200.0)
    newer = Decision(ref.key, Tier.RACK, ("z", "b", "other"), 150.0, 250.0)
    p[0]["metadata"]["annotations"][PLACEMENT_ANNOTATION] = decision_annotation(newer, st.key)
    p[1]["metadata"]["annotations"][PLACEMENT_ANNOTATION] = decision_annotation(older, st.key)
    st.pod("ADDED", p[0])
    st.pod("ADDED", p[1])
    assert st.snapshot().decisions[ref.key] == older


def test_an_assumed_member_counts_where_it_was_scored_until_it_binds_or_expires() -> None:
    clock = [0.0]
    nodes = k.planned(("gb200-nvl72", 2))
    st = k.cluster_state(nodes, templates=[k.template("gpu4", 4)], clock=lambda: clock[0],
                         assume_ttl_s=10)
    p = k.toposerve_pods("g", 2, claim_template="gpu4", uid_prefix="g")
    for x in p:
        st.pod("ADDED", x)
    a, b = nodes[0].name, nodes[1].name
    st.assume("g-0", a)
    view = st.snapshot()
    assert view.nodes[a].used == 4 and view.groups["toposerve/default/g"].bound()[0].node == a
    st.pod("MODIFIED", bound(p[0], b, "g-0"))  # the scheduler put it elsewhere after all
    view = st.snapshot()
    assert view.nodes[a].used == 0 and view.nodes[b].used == 4
    st.assume("g-1", a)
    clock[0] = 11
    assert st.snapshot().nodes[a].used == 0


def test_an_assumed_pod_whose_claim_is_allocated_counts_once_where_the_claim_is() -> None:
    # the scheduler's PreBind writes the allocation, then binds: in between the
    # pod is assumed and its claim allocated (with slow binding, for seconds)
    st, nodes = state_with(("hgx-h100", 2))
    a, b = nodes[0].name, nodes[1].name
    p = ctl.pod("w", claim_template="gpu4", uid="u1")
    p["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "w-gpu"}]}
    made = allocated_claim("w-gpu", a, "w", "u1")
    st.resource_claim("ADDED", {**made, "status": {}})  # made from its template, not allocated
    st.pod("ADDED", p)
    st.assume("u1", a)
    assert st.snapshot().nodes[a].used == 4
    st.resource_claim("MODIFIED", made)
    view = st.snapshot()
    assert view.nodes[a].used == 4 and view.nodes[a].free == 4  # not 8 and 0
    st.resource_claim("MODIFIED", allocated_claim("w-gpu", b, "w", "u1"))  # put elsewhere
    view = st.snapshot()
    assert (view.nodes[a].used, view.nodes[b].used) == (0, 4)


def test_a_node_status_update_keeps_the_domain_indexes_a_label_change_moves_it() -> None:
    st, nodes = state_with(("gb200-nvl72", 36))  # two racks
    first, other = nodes[0], nodes[-1]
    assert first.path.rack != other.path.rack
    view = st.snapshot()
    assert first.name in view.in_domain(Tier.RACK, view.nodes[first.name].domain(Tier.RACK)
                                        or ())
    was = view.nodes[first.name]
    view.memo["derived"] = True
    status = k.node(first)
    status["status"] = {"conditions": [{"type": "Ready", "status": "True"}]}
    st.node("MODIFIED", status)
    view = st.snapshot()
    assert Tier.RACK in view.index  # not rebuilt for a status update
    # nor anything else: the same node object (promise layouts made from it stay valid)
    assert view.nodes[first.name] is was and view.memo.get("derived") is True
    moved = k.node(first)
    assert TOPO.rack is not None and TOPO.nvlink is not None
    moved["metadata"]["labels"][TOPO.rack] = str(other.path.rack)
    moved["metadata"]["labels"][TOPO.nvlink] = str(other.path.nvlink)
    st.node("MODIFIED", moved)
    view = st.snapshot()
    rack = view.nodes[other.name].domain(Tier.RACK)
    assert rack is not None and first.name in view.in_domain(Tier.RACK, rack)


def test_a_pod_status_update_rebuilds_nothing_a_change_does() -> None:
    """Most pod events are the kubelet's status updates: a pod whose facts
    did not change leaves its node, its group and what was derived from
    them as they were; a bind or a deletion moves them."""
    st, nodes = state_with(("gb200-nvl72", 18))
    pods = k.toposerve_pods("g", 2, claim_template="gpu4", uid_prefix="g")
    member = bound(pods[0], nodes[0].name, "g-0")
    st.pod("ADDED", member)
    st.pod("ADDED", pods[1])
    view = st.snapshot()
    was, group = view.nodes[nodes[0].name], view.groups[next(iter(view.groups))]
    view.memo["derived"] = True
    member["status"] = {"phase": "Running", "podIP": "127.0.0.9",
                        "conditions": [{"type": "Ready", "status": "True"}]}
    st.pod("MODIFIED", member)
    view = st.snapshot()
    assert view.memo.get("derived") is True
    assert view.nodes[nodes[0].name] is was and view.groups[group.key] is group
    st.pod("MODIFIED", bound(pods[1], nodes[1].name, "g-1"))  # a bind: a change
    view = st.snapshot()
    assert "derived" not in view.memo and view.groups[group.key] is not group
    assert view.nodes[nodes[1].name].used == 4


def test_the_room_per_domain_follows_a_bind_without_a_rebuild() -> None:
    st, nodes = state_with(("gb200-nvl72", 36))  # two racks of 72 GPUs
    view = st.snapshot()
    key = (Tier.RACK, ("gb200-nvl72",))
    view.room(*key)
    st.pod("ADDED", bound(ctl.pod("p", claim_template="gpu4"), nodes[0].name, "u1"))
    view = st.snapshot()
    kept = dict(view.room(*key))  # moved by the node's difference
    rack = view.nodes[nodes[0].name].domain(Tier.RACK)
    assert rack is not None and kept[rack] == 72 - 4
    view.memo.clear()
    assert view.room(*key) == kept


def test_a_placement_a_pod_wrote_itself_is_never_a_promise(tmp_path: Path) -> None:
    st, nodes = state_with(("gb200-nvl72", 36))
    racks = sorted({(n.path.zone, n.path.block, n.path.rack) for n in nodes})
    forged = []
    for i, rack in enumerate(racks):  # two pending pods hold a rack each for ages
        p = k.toposerve_pods(f"hog{i}", 18, claim_template="gpu4", level="rack",
                             uid_prefix=f"hog{i}")[0]
        ref = identify(p, TOPO)
        assert ref is not None
        d = Decision(ref.key, Tier.RACK, rack, 0.0, 1e18)
        unsigned = orjson.loads(decision_annotation(d, st.key))
        del unsigned["signature"]
        forged.append(orjson.dumps(unsigned).decode())
        # signed, but with a key this extender does not hold
        forged.append(decision_annotation(d, b"someone else's key"))
        p["metadata"]["annotations"][PLACEMENT_ANNOTATION] = forged[-1 - i % 2]
        st.pod("ADDED", p)
    assert st.snapshot().decisions == {}
    p = k.toposerve_pods("hog0", 18, claim_template="gpu4", level="rack", uid_prefix="x")[1]
    for text in forged:
        p["metadata"]["annotations"][PLACEMENT_ANNOTATION] = text
        st.pod("MODIFIED", p)
        assert st.snapshot().decisions == {}
    # a restarted extender with the same key (a mounted Secret) reads its own back
    key = tmp_path / "key"
    key.write_bytes(b"0123456789abcdef0123456789abcdef\n")
    cfg = ExtenderConfig.model_validate({"decisionKeyFile": str(key)})
    first, second = ClusterState(cfg), ClusterState(cfg)
    d = Decision("toposerve/default/hog0", Tier.RACK, racks[0], 100.0, 220.0)
    p["metadata"]["annotations"][PLACEMENT_ANNOTATION] = decision_annotation(d, first.key)
    second.pod("ADDED", p)
    assert second.snapshot().decisions == {d.group: d}
    with pytest.raises(ValidationError, match="at least 16 bytes"):
        key.write_bytes(b"short")
        ExtenderConfig.model_validate({"decisionKeyFile": str(key)})


_EVENT = st.tuples(st.sampled_from(["ADDED", "MODIFIED", "DELETED"]), st.integers(0, 3),
                   st.integers(1, 3), st.integers(0, 4), st.integers(0, 1))


@settings(max_examples=200, deadline=None)
@given(st.lists(_EVENT, max_size=25))
def test_slice_events_in_any_order_index_each_pools_newest_devices(
        events: list[tuple[str, int, int, int, int]]) -> None:
    """Slices come, change generation and device count, move and go, in
    pools of several slices: the device index is what the surviving slices
    say (each pool's newest generation, its devices on their slices'
    nodes), however it got there (a pool is reindexed alone per event)."""
    state, nodes = state_with(("hgx-h100", 2))
    live = {s["metadata"]["name"]: s for s in (k.gpu_slice(n) for n in nodes)}
    for kind, i, generation, count, at in events:
        s = k.gpu_slice(nodes[at], generation=generation)
        s["metadata"]["name"] = f"s{i}"
        s["spec"]["pool"]["name"] = f"pool{i % 2}"  # two slices a pool
        # device names are unique in a pool (the API's rule), not across
        s["spec"]["devices"] = [{**d, "name": f"s{i}-{d['name']}"}
                                for d in s["spec"]["devices"][:count]]
        state.resource_slice(kind, s)
        if kind == "DELETED":
            live.pop(f"s{i}", None)
        else:
            live[f"s{i}"] = s
    newest: dict[str, int] = {}
    for s in live.values():
        pool = s["spec"]["pool"]
        newest[pool["name"]] = max(newest.get(pool["name"], 0), pool["generation"])
    want = {(s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"]): s["spec"]["nodeName"]
            for s in live.values() if s["spec"]["pool"]["generation"] == newest[
                s["spec"]["pool"]["name"]] for d in s["spec"]["devices"]}
    assert {dev: at for dev, (at, _) in state._device.items()} == want
