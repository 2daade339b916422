"""Placement as pure functions: domains, packing, look-ahead, promises,
preferred-level climbing, P/D scoring, and whole runs of a toy scheduler
over interleaved groups in any arrival order."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.extender.sim import Sim, cluster, gang
from toposerve.scheduler_ext.placement import pack
from toposerve.scheduler_ext.placement.decide import (
    Outcome,
    Policy,
    filter_member,
    modelled_kv_seconds,
    prioritize_member,
    prioritize_ungrouped,
    reservations,
)
from toposerve.scheduler_ext.placement.levels import (
    UnknownLevel,
    climb,
    contains,
    display,
    domain_of,
    parse_level,
)
from toposerve.scheduler_ext.placement.model import Decision, Group, NodeState, Source, View
from toposerve.topology.labels import PRESETS, DialectName
from toposerve.topology.model import DomainPath, Tier, TierLink
from toposerve.topology.profiles import load_profile

TOPO = PRESETS[DialectName.TOPOSERVE]


def links(profile: str | None) -> dict[Tier, TierLink]:
    return load_profile(profile or "gb200-nvl72").links()


POLICY = Policy(promise_ttl_s=30, links=links)


def rack_of(view: View, node: str) -> str | None:
    return view.nodes[node].path.rack


# --- levels ---------------------------------------------------------------

def test_levels_by_name_and_by_label_key() -> None:
    assert parse_level("rack", TOPO) == Tier.RACK
    assert parse_level("NVLink-Domain", TOPO) == Tier.NVLINK
    assert parse_level("topology.toposerve.io/rack", TOPO) == Tier.RACK
    assert parse_level("kubernetes.io/hostname", TOPO) == Tier.SAME_NODE
    gke = PRESETS[DialectName.GKE]
    assert parse_level("cloud.google.com/gce-topology-subblock", gke) == Tier.RACK
    with pytest.raises(UnknownLevel, match="unknown topology level 'shelf'"):
        parse_level("shelf", TOPO)


def test_domains_are_path_prefixes_and_gaps_share_nothing() -> None:
    p = DomainPath(zone="z", block="b", rack="r", nvlink="n", host="h")
    assert domain_of(p, Tier.RACK) == ("z", "b", "r")
    assert domain_of(p, Tier.BEYOND) == ()
    assert contains(("z", "b"), domain_of(p, Tier.NVLINK) or ())
    assert domain_of(DomainPath(zone="z", rack="r", host="h"), Tier.RACK) is None
    assert display(("z", "b", "r"), Tier.RACK) == "rack r"
    assert climb(Tier.RACK) == [Tier.RACK, Tier.BLOCK, Tier.ZONE, Tier.BEYOND]


# --- packing ----------------------------------------------------------------

def test_best_fit_takes_the_tightest_node() -> None:
    got = pack.best_fit([4, 2], {"a": 8, "b": 4, "c": 2})
    assert got == [(4, "b"), (2, "c")]
    assert pack.best_fit([4, 4, 4], {"a": 8, "b": 3}) is None
    assert pack.best_fit([0], {}) == [(0, None)]


@given(st.lists(st.integers(1, 8), max_size=12),
       st.dictionaries(st.sampled_from("abcdefgh"), st.integers(0, 8), max_size=8))
def test_best_fit_never_overfills(demands: list[int], free: dict[str, int]) -> None:
    got = pack.best_fit(demands, free)
    if got is None:
        assert not pack.fits(demands, free)
        return
    used = Counter[str]()
    for d, n in got:
        assert n is not None
        used[n] += d
    assert all(used[n] <= free[n] for n in used)
    assert sorted(d for d, _ in got) == sorted(demands)


def test_plan_uses_one_nvlink_domain_when_one_fits_and_the_tightest() -> None:
    free = {"a1": 4, "a2": 4, "b1": 4, "c1": 4, "c2": 4, "c3": 4}
    sub = {"a1": "A", "a2": "A", "b1": "B", "c1": "C", "c2": "C", "c3": "C"}
    p = pack.plan([4, 4], free, sub)
    assert p is not None and p.subdomains == ("A",)
    p = pack.plan([4, 4, 4, 4], free, sub)  # needs two: C (3) + the smallest that completes, B
    assert p is not None and sorted(p.subdomains) == ["B", "C"]
    assert pack.plan([4] * 7, free, sub) is None


# --- groups on a cluster of GB200 racks and HGX blocks ---------------------------

def test_first_member_picks_the_best_fit_rack_and_the_rest_are_held_there() -> None:
    view = View(cluster(("gb200-nvl72", 54)))  # three racks of 18 trays, 72 GPUs each
    # rack r0 is half used, so a 32-GPU group fits it most tightly
    for n in sorted(view.nodes)[:9]:
        view.nodes[n] = view.nodes[n].__class__(**{**view.nodes[n].__dict__, "used": 4})
    g = gang("ep", 8, 4, required=Tier.RACK)
    view.groups[g.key] = g
    sim = Sim(view, POLICY)
    first = sim.attempt(g.key, "ep-3")
    assert first is not None and rack_of(view, first) == "gb200-nvl72-b0-r0"
    sim.run([(g.key, f"ep-{i}") for i in (0, 1, 2, 4, 5, 6, 7)])
    assert {rack_of(view, n) for n in sim.placed(g.key)} == {"gb200-nvl72-b0-r0"}
    assert len(sim.placed(g.key)) == 8


def test_outside_nodes_get_a_reason_naming_the_domain() -> None:
    view = View(cluster(("gb200-nvl72", 36)))
    g = gang("ep", 4, 4, required=Tier.RACK)
    view.groups[g.key] = g
    sim = Sim(view, POLICY)
    node = sim.attempt(g.key, "ep-0")
    assert node is not None
    res = filter_member(view, view.groups[g.key], "ep-1", sorted(view.nodes), POLICY, 1.0)
    assert res.outcome == Outcome.HELD
    outside = [n for n in view.nodes if rack_of(view, n) != rack_of(view, node)]
    assert set(outside) <= set(res.failed)
    assert f"is held to rack {rack_of(view, node)}" in res.failed[outside[0]]


def test_a_group_that_fits_nowhere_places_nothing_and_says_why() -> None:
    view = View(cluster(("gb200-nvl72", 36)))
    g = gang("huge", 19, 4, required=Tier.RACK)  # 76 GPUs > 72 in a rack
    view.groups[g.key] = g
    sim = Sim(view, POLICY)
    sim.run([(g.key, f"huge-{i}") for i in range(19)])
    assert sim.placed(g.key) == []
    assert g.key not in view.decisions
    reason = next(iter((sim.reasons or {}).values()))
    assert "needs 76 accelerators for 19 pods in one rack" in reason
    assert "the most free in one rack is 72" in reason


def test_promised_capacity_is_not_handed_to_another_group() -> None:
    view = View(cluster(("gb200-nvl72", 36)))
    a = gang("a", 18, 4, required=Tier.RACK)  # a whole rack
    b = gang("b", 18, 4, required=Tier.RACK)
    view.groups.update({a.key: a, b.key: b})
    sim = Sim(view, POLICY)
    assert sim.attempt("a", "a-0") is not None  # a promised the best rack
    assert sum(reservations(view, sim.now, exclude="b").values()) == 17 * 4
    # b's first pod must take the other rack though a has only one pod bound
    got = sim.attempt("b", "b-0")
    assert got is not None and rack_of(view, got) != rack_of(view, sim.placed("a")[0])


def test_kept_promise_layouts_equal_fresh_ones_as_members_bind() -> None:
    view = View(cluster(("gb200-nvl72", 54)))
    groups = [gang(f"g{i}", n, 4, required=Tier.RACK) for i, n in enumerate((9, 6, 12, 4))]
    view.groups.update({g.key: g for g in groups})
    sim = Sim(view, POLICY)
    order = [(g.key, m.uid) for i in range(12) for g in groups if i < len(g.members)
             for m in [g.members[i]]]
    kept_any = False
    for step, (key, uid) in enumerate(order):
        before = dict(view.layouts)
        sim.attempt(key, uid)
        other = next((lay for k, lay in view.layouts.items() if k != key and lay.mine), None)
        if step % 3 == 2 and other is not None:  # an ordinary pod fills a node it holds
            n = view.nodes[next(iter(other.mine))]
            view.nodes[n.name] = replace(n, used=n.capacity)
            view.memo.clear()
        kept = reservations(view, sim.now, exclude=None)
        # a group whose nodes did not move keeps its layout object
        kept_any |= any(view.layouts.get(k) is lay for k, lay in before.items() if k != key)
        view.memo.clear()
        view.layouts = {}
        assert reservations(view, sim.now, exclude=None) == kept
    assert kept_any


def test_an_unused_promise_expires() -> None:
    view = View(cluster(("gb200-nvl72", 18)))
    whole = gang("a", 18, 4, required=Tier.RACK)
    a = replace(whole, members=whole.members[:1])  # of 18, one pod made
    b = gang("b", 4, 4, required=Tier.RACK)
    view.groups.update({a.key: a, b.key: b})
    sim = Sim(view, POLICY)
    assert sim.attempt("a", "a-0") is not None
    assert sim.attempt("b", "b-0") is None  # the rack is promised to a
    sim.now = POLICY.promise_ttl_s + 1  # a's other pods never came
    assert sim.attempt("b", "b-0") is not None


def test_a_partly_placed_groups_promise_outlives_its_ttl_while_its_pods_wait() -> None:
    # 5,000 nodes on a loaded machine: a member waited in the scheduler's queue
    # past the TTL, others took the rack, and its group re-decided the zone
    view = View(cluster(("gb200-nvl72", 18)))
    a = gang("a", 18, 4, required=Tier.RACK)
    b = gang("b", 4, 4, required=Tier.RACK)
    view.groups.update({a.key: a, b.key: b})
    sim = Sim(view, POLICY)
    assert sim.attempt("a", "a-0") is not None
    sim.now = POLICY.promise_ttl_s * 10  # no call for a's 17 waiting pods since
    assert sim.attempt("b", "b-0") is None  # still promised to a
    res = filter_member(view, view.groups["a"], "a-1", sorted(view.nodes), POLICY, sim.now)
    assert res.outcome == Outcome.HELD and res.passed  # renewed, not decided anew


def test_preferred_level_climbs_one_level_at_a_time() -> None:
    view = View(cluster(("hgx-h100", 8)))  # NVLink domain = one node of 8 GPUs; racks of 4
    g = gang("tp16", 2, 8, preferred=Tier.NVLINK)
    view.groups[g.key] = g
    sim = Sim(view, POLICY)
    sim.run([(g.key, "tp16-0"), (g.key, "tp16-1")])
    assert view.decisions[g.key].tier == Tier.RACK  # not block: one level up was enough
    assert len({rack_of(view, n) for n in sim.placed(g.key)}) == 1


def test_a_required_level_never_climbs() -> None:
    view = View(cluster(("hgx-h100", 8)))
    g = gang("tp16", 2, 8, required=Tier.NVLINK)
    view.groups[g.key] = g
    sim = Sim(view, POLICY)
    sim.run([(g.key, "tp16-0"), (g.key, "tp16-1")])
    assert sim.placed(g.key) == []
    assert "in one NVLink domain;" in next(iter((sim.reasons or {}).values()))


def first_placed(nodes: tuple[str, int], g: Group) -> tuple[View, str]:
    """A view of ``nodes`` where the toy scheduler placed ``g``'s first member."""
    view = View(cluster(nodes))
    view.groups[g.key] = g
    first = Sim(view, POLICY).attempt(g.key, g.members[0].uid)
    assert first is not None
    return view, first


def test_a_held_group_climbs_when_its_domain_fills_unexpectedly() -> None:
    g = gang("pair", 2, 4, preferred=Tier.NVLINK)
    view, first = first_placed(("hgx-h100", 8), g)
    assert view.decisions[g.key].tier == Tier.NVLINK
    # someone outside any group takes the rest of that node
    n = view.nodes[first]
    view.nodes[first] = n.__class__(**{**n.__dict__, "used": 8})
    view.memo.clear()
    res = filter_member(view, view.groups[g.key], "pair-1", sorted(view.nodes), POLICY, 1.0)
    assert res.outcome == Outcome.CLIMBED and res.decision is not None
    assert res.decision.tier == Tier.RACK
    assert {rack_of(view, x) for x in res.passed} == {rack_of(view, first)}


def test_a_held_group_waits_out_a_sample_without_its_domain() -> None:
    # hgx-200 with a sampling scheduler: members whose rack was left out of the
    # attempt's sample climbed to the block, and 8 of 20 P/D slices split
    g = gang("pd", 4, 4, roles=["prefill", "prefill", "decode", "decode"])
    view, first = first_placed(("hgx-h100", 8), g)
    assert view.decisions[g.key].tier == Tier.RACK
    elsewhere = sorted(n for n in view.nodes if rack_of(view, n) != rack_of(view, first))
    sampled = replace(POLICY, sampled=True)
    res = filter_member(view, view.groups[g.key], "pd-1", elsewhere, sampled, 1.0)
    assert res.outcome == Outcome.HELD and res.passed == []
    assert res.decision is not None and res.decision.tier == Tier.RACK
    assert all("is held to" in r for r in res.failed.values())
    # every feasible node offered (no sampling): none of them is in the rack, so it is full
    res = filter_member(view, view.groups[g.key], "pd-1", elsewhere, POLICY, 1.0)
    assert res.outcome == Outcome.CLIMBED
    # the rack full by the extender's own count: a sampling scheduler's pod climbs too
    for n in view.nodes:
        if rack_of(view, n) == rack_of(view, first) and n != first:
            view.nodes[n] = replace(view.nodes[n], used=8)
    view.memo.clear()
    res = filter_member(view, view.groups[g.key], "pd-1", elsewhere, sampled, 2.0)
    assert res.outcome == Outcome.CLIMBED and res.decision is not None
    assert res.decision.tier > Tier.RACK


def test_a_held_group_waits_while_a_pod_in_flight_fills_its_domain() -> None:
    g = gang("pair", 2, 4, preferred=Tier.NVLINK)
    view, first = first_placed(("hgx-h100", 8), g)
    # another group's pod is scored onto the rest of that node, its binding not seen
    other = gang("solo", 1, 4)
    view.groups[other.key] = replace(other, members=(
        replace(other.members[0], node=first, assumed=True),))
    n = view.nodes[first]
    view.nodes[first] = replace(n, used=n.used + 4)
    view.memo.clear()
    res = filter_member(view, view.groups[g.key], "pair-1", sorted(view.nodes), POLICY, 1.0)
    assert res.outcome == Outcome.HELD and res.passed == []  # not climbed: unsure yet
    assert res.decision is not None and res.decision.tier == Tier.NVLINK
    # it binds there: the node is full for sure, and the group climbs one level
    view.groups[other.key] = replace(other, members=(replace(other.members[0], node=first),))
    view.memo.clear()
    res = filter_member(view, view.groups[g.key], "pair-1", sorted(view.nodes), POLICY, 2.0)
    assert res.outcome == Outcome.CLIMBED and res.decision is not None
    assert res.decision.tier == Tier.RACK


def test_wide_ep_over_racks_uses_fewest_nvlink_domains() -> None:
    view = View(cluster(("hgx-h100", 8)))
    for name in sorted(view.nodes)[:3]:  # three nodes half used
        n = view.nodes[name]
        view.nodes[name] = n.__class__(**{**n.__dict__, "used": 4})
    g = gang("ep", 4, 4, required=Tier.BLOCK)  # 16 GPUs: two whole nodes, not four halves
    view.groups[g.key] = g
    sim = Sim(view, POLICY)
    sim.run([(g.key, f"ep-{i}") for i in range(4)])
    assert len(set(sim.placed(g.key))) == 2


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["hgx-h100", "gb200-nvl72"]), st.integers(1, 12),
       st.sampled_from([1, 2, 4, 8]),
       st.lists(st.sampled_from([0, 0.25, 0.5, 0.75, 1]), min_size=48, max_size=48))
def test_the_fewest_nvlink_domains_bound_never_changes_the_pick(
        profile: str, pods: int, demand: int, used: list[float]) -> None:
    """A group's domain search stops at the first plan (in left-over order)
    using as few NVLink domains as any could; it picks what a search
    stopping only at one domain picks, on nodes used at random."""
    nodes = cluster((profile, 48 if profile == "hgx-h100" else 36))
    for (name, n), share in zip(sorted(nodes.items()), used, strict=False):
        nodes[name] = replace(n, used=int(n.capacity * share))
    g = gang("g", pods, demand, preferred=Tier.RACK)
    picks = []
    for widest in (None, 10**9):  # the bound, and none (the exhaustive search)
        view = View(dict(nodes))
        view.groups[g.key] = g
        view.widest = widest
        res = filter_member(view, g, "g-0", sorted(nodes), POLICY, 1.0)
        d = res.decision
        picks.append(None if d is None else (d.tier, d.domain, sorted(res.passed)))
    assert picks[0] == picks[1]


def test_decode_scores_follow_the_kv_cost_model() -> None:
    view = View(cluster(("gb200-nvl72", 36)))  # two racks (one NVLink domain each)
    g = gang("pd", 3, 4, preferred=Tier.BLOCK, roles=["prefill", "prefill", "decode"])
    view.groups[g.key] = g
    sim = Sim(view, POLICY)
    sim.run([(g.key, "pd-0"), (g.key, "pd-1")])
    prefill_rack = rack_of(view, sim.placed(g.key)[0])
    scores = prioritize_member(view, view.groups[g.key], "pd-2", sorted(view.nodes), POLICY,
                               sim.now)
    near = [n for n in view.nodes if rack_of(view, n) == prefill_rack]
    far = [n for n in view.nodes if rack_of(view, n) != prefill_rack]
    assert min(scores[n] for n in near) >= 6 and max(scores.get(n, 0) for n in far) <= 2
    sim.run([(g.key, "pd-2")])
    seconds = modelled_kv_seconds(view, view.groups[g.key], POLICY)
    assert seconds is not None and seconds < 0.02  # NVLink, not the 50 GB/s between racks


def test_pd_slice_lands_in_one_nvlink_domain_when_it_fits() -> None:
    view = View(cluster(("gb200-nvl72", 36)))
    g = gang("pd", 6, 4, roles=["prefill"] * 4 + ["decode"] * 2)  # default preferred: NVLink
    view.groups[g.key] = g
    sim = Sim(view, POLICY)
    sim.run([(g.key, f"pd-{i}") for i in (5, 0, 4, 1, 2, 3)])  # decode first
    assert len({view.nodes[n].path.nvlink for n in sim.placed(g.key)}) == 1


def test_pods_of_no_group_keep_off_what_a_slice_was_promised() -> None:
    # hgx-1000: single-GPU claims filled the best-fit rack a P/D slice was
    # promised between its members' turns, and 96 of 100 slices split
    view = View(cluster(("hgx-h100", 8)))  # two racks of 4 nodes of 8 GPUs
    g = gang("pd", 4, 4, roles=["prefill", "prefill", "decode", "decode"])
    view.groups[g.key] = g
    sim = Sim(view, POLICY)
    first = sim.attempt(g.key, "pd-0")
    assert first is not None
    held = reservations(view, sim.now)
    assert sum(held.values()) == 12 and {rack_of(view, n) for n in held} == {rack_of(view, first)}
    # the fullest node first, as a most-allocated scorer would: 48 fit off the promise
    assert all(sim.loose(1) is not None for _ in range(64 - 16))
    assert sim.loose(1) is None
    assert sim.reasons is not None and set(sim.reasons) == set(held)
    assert all("promised to the pending pods of group pd" in r for r in sim.reasons.values())
    sim.run([(g.key, f"pd-{i}") for i in (1, 2, 3)])
    assert len(sim.placed(g.key)) == 4 and {rack_of(view, n) for n in sim.placed(g.key)} == \
        {rack_of(view, first)}
    assert reservations(view, sim.now) == {}  # nothing pending: nothing held


def test_a_pod_of_no_group_that_asks_no_accelerator_goes_anywhere() -> None:
    view = View(cluster(("hgx-h100", 4)))
    g = gang("pd", 4, 8, required=Tier.RACK)
    view.groups[g.key] = g
    sim = Sim(view, POLICY)
    assert sim.attempt(g.key, "pd-0") is not None
    assert sim.loose(1) is None  # every free GPU of the rack is promised
    assert sim.loose(0) is not None


def test_a_pod_of_no_group_scores_the_node_it_fills_best_past_the_promises() -> None:
    view = View(cluster(("hgx-h100", 8)))  # two racks of four
    names = sorted(view.nodes)
    a, b, c = names[0], names[1], names[5]
    for n, used in ((a, 2), (b, 5), (c, 5)):
        view.nodes[n] = replace(view.nodes[n], used=used)
    assert rack_of(view, b) != rack_of(view, c)
    # b and c fit 3 exactly; b's rack has less free (19 against 22)
    assert prioritize_ungrouped(view, 3, names, POLICY, 0) == {b: 10}
    assert prioritize_ungrouped(view, 6, names, POLICY, 0) == {a: 10}
    g = gang("pd", 1, 6, required=Tier.SAME_NODE)  # promised a's 6 free
    view.groups[g.key] = g
    node = view.nodes[a].domain(Tier.SAME_NODE)
    assert node is not None
    view.decisions[g.key] = Decision(g.key, Tier.SAME_NODE, node, 0, POLICY.promise_ttl_s)
    view.memo.clear()
    assert reservations(view, 0) == {a: 6}
    assert prioritize_ungrouped(view, 6, names, POLICY, 0) != {a: 10}
    assert prioritize_ungrouped(view, 0, names, POLICY, 0) == {}
    assert prioritize_ungrouped(view, 3, names, replace(POLICY, pack_ungrouped=False), 0) == {}
    # nodes with partitions last: partition claims fit nowhere else
    view.nodes[b] = replace(view.nodes[b], partitioned=True)
    view.memo.clear()
    assert prioritize_ungrouped(view, 3, names, POLICY, 0) == {c: 10}
    only = [b]
    assert prioritize_ungrouped(view, 3, only, POLICY, 0) == {b: 10}
    # all empty: equal racks by name, then the first node of the first rack
    empty = View(cluster(("hgx-h100", 8)))
    assert prioritize_ungrouped(empty, 3, names[::-1], POLICY, 0) == {names[0]: 10}


def test_a_pod_of_a_group_with_unknown_members_counts_them() -> None:
    # an LWS leader of a size-8 group arrives alone (workers come after it lands)
    view = View(cluster(("gb200-nvl72", 36)))
    full = gang("lws", 8, 4, required=Tier.RACK)
    leader_only = full.__class__(**{**full.__dict__, "members": full.members[:1]})
    view.groups[leader_only.key] = leader_only
    assert leader_only.pending() == [4] * 8
    sim = Sim(view, POLICY)
    assert sim.attempt(leader_only.key, "lws-0") is not None
    assert sum(reservations(view, sim.now, exclude=None).values()) == 7 * 4


def test_a_slice_of_unknown_size_places_nothing_until_its_size_is_known() -> None:
    # a DisaggregatedSet slice's pods do not carry its size; with its
    # LeaderWorkerSets not seen, the pods seen so far are not the slice
    view = View(cluster(("gb200-nvl72", 36)))
    roles = ["prefill"] * 4 + ["decode"] * 2
    full = replace(gang("pd", 6, 4, roles=roles), source=Source.DISAGGREGATED_SET)
    seen = replace(full, size=3, members=full.members[:3], size_known=False)
    view.groups[seen.key] = seen
    res = filter_member(view, seen, "pd-0", sorted(view.nodes), POLICY, 0.0)
    assert res.passed == [] and res.outcome == Outcome.SIZE_UNKNOWN and res.unresolvable
    assert res.decision is None
    reason = next(iter(res.failed.values()))
    assert "group pd: its size is not known yet" in reason
    assert "LeaderWorkerSets" in reason and "3 pods so far" in reason
    view.groups[full.key] = full  # the LeaderWorkerSets arrived: the whole slice
    sim = Sim(view, POLICY)
    sim.run([(full.key, f"pd-{i}") for i in range(6)])
    assert len(sim.placed(full.key)) == 6
    assert len({view.nodes[n].path.nvlink for n in sim.placed(full.key)}) == 1


def test_a_group_of_unknown_size_with_a_bound_member_joins_it() -> None:
    # the size went unknown after placing began (its owner deleted): the
    # rest still goes beside the bound members rather than wait forever
    view = View(cluster(("gb200-nvl72", 36)))
    g = replace(gang("pd", 2, 4, roles=["prefill", "decode"]),
                source=Source.DISAGGREGATED_SET)
    view.groups[g.key] = g
    sim = Sim(view, POLICY)
    first = sim.attempt(g.key, "pd-0")
    assert first is not None
    view.groups[g.key] = replace(view.groups[g.key], size_known=False)
    second = sim.attempt(g.key, "pd-1")
    assert second is not None
    assert view.nodes[second].path.nvlink == view.nodes[first].path.nvlink


# --- many groups, any order --------------------------------------------------

# 54 pods of 4 GPUs: exactly three racks; whole and half racks, so best fit
# always finds room online, whatever the order
MIX = [("a", 18, 4), ("b", 9, 4), ("c", 9, 4), ("d", 9, 4), ("e", 9, 4)]


@settings(max_examples=25, deadline=None)
@given(st.randoms(use_true_random=False))
def test_interleaved_groups_each_land_whole_in_one_rack(rnd: object) -> None:
    import random

    assert isinstance(rnd, random.Random)
    view = View(cluster(("gb200-nvl72", 54)))  # 3 racks x 72 GPUs = exactly the mix's need
    for key, pods, demand in MIX:
        g = gang(key, pods, demand, required=Tier.RACK)
        view.groups[g.key] = g
    order = [(k, f"{k}-{i}") for k, pods, _ in MIX for i in range(pods)]
    rnd.shuffle(order)
    sim = Sim(view, POLICY)
    sim.run(order)
    for key, pods, _ in MIX:
        placed = sim.placed(key)
        # whole or nothing, and in one rack
        assert len(placed) in (0, pods)
        assert len({rack_of(view, n) for n in placed}) <= 1
    # best fit packs the mix into the three racks: nobody is left out
    assert all(len(sim.placed(k)) == p for k, p, _ in MIX)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 20), st.sampled_from([2, 4])), min_size=1,
                max_size=6), st.randoms(use_true_random=False))
def test_no_group_is_ever_split_or_stranded(shapes: list[tuple[int, int]], rnd: object) -> None:
    import random

    assert isinstance(rnd, random.Random)
    view = View(cluster(("gb200-nvl72", 36)))
    keys = []
    for i, (pods, demand) in enumerate(shapes):
        g = gang(f"g{i}", pods, demand, required=Tier.RACK)
        view.groups[g.key] = g
        keys.append((g.key, pods))
    order = [(k, f"{k}-{j}") for k, pods in keys for j in range(pods)]
    rnd.shuffle(order)
    sim = Sim(view, POLICY)
    # pods of no group (1-2 GPUs) come between the groups' pods, fullest node first
    for key, uid in order:
        sim.attempt(key, uid)
        for _ in range(rnd.randint(0, 2)):
            sim.loose(rnd.choice([1, 2]))
    sim.run([(k, u) for k, u in order if u not in {m.uid for m in view.groups[k].bound()}])
    for key, pods in keys:
        placed = sim.placed(key)
        assert len(placed) in (0, pods), f"{key} stranded {len(placed)}/{pods}"
        assert len({rack_of(view, n) for n in placed}) <= 1
    assert all(n.used <= n.capacity for n in view.nodes.values())


def test_pd_roles_pair_up_on_nodes_when_a_slice_spans_nodes() -> None:
    view = View(cluster(("hgx-h100", 8)))  # 8 GPUs a node, its own NVLink domain
    g = gang("pd", 4, 4, roles=["prefill", "prefill", "decode", "decode"])
    view.groups[g.key] = g
    sim = Sim(view, POLICY)
    sim.run([(g.key, f"pd-{i}") for i in range(4)])  # both prefills first
    placed = view.groups[g.key]
    by_node: dict[str, set[str | None]] = {}
    for m in placed.members:
        assert m.node is not None
        by_node.setdefault(m.node, set()).add(m.role)
    assert list(by_node.values()) == [{"prefill", "decode"}] * 2
    assert modelled_kv_seconds(view, placed, POLICY) == 0.0  # each decode beside a prefill


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["go", "come", "move", "use", "grow", "profile"]),
                          st.integers(0, 200)), min_size=1, max_size=12))
def test_node_changes_move_the_derived_indexes_as_a_rebuild_would(
        changes: list[tuple[str, int]]) -> None:
    """A node that comes, goes, moves to another rack, changes profile,
    capacity or use updates the domain indexes, places, profiles, the
    widest NVLink domain and the free room per domain in place; each ends
    equal to a fresh view's."""
    pool = cluster(("hgx-h100", 24), ("gb200-nvl72", 18))  # 6 HGX racks, one NVL72 rack
    nodes = dict(list(pool.items())[:30])
    spare = [n for n in pool if n not in nodes]
    view = View(dict(nodes))
    tiers, kinds = (Tier.RACK, Tier.NVLINK, Tier.BLOCK), (("hgx-h100",), ())

    def derive(v: View) -> None:
        for tier in tiers:
            v.place(tier)
            for profiles in kinds:
                v.room(tier, profiles)
        v.of_profile()
        v.widest_subdomain()

    derive(view)
    for op, i in changes:
        names = sorted(view.nodes)
        name = names[i % len(names)] if names else None
        before: dict[str, NodeState | None] = {}
        if op == "come" and spare:
            name = spare.pop(i % len(spare))
            before[name] = None
            view.nodes[name] = pool[name]
        elif name is None:
            continue
        elif op == "go":
            before[name] = view.nodes.pop(name)
            spare.append(name)
        else:
            n = before[name] = view.nodes[name]
            other = pool[sorted(pool)[i % len(pool)]]
            if op == "move":
                n = replace(n, path=n.path.model_copy(update={
                    "block": other.path.block, "rack": other.path.rack,
                    "nvlink": other.path.nvlink}))
            elif op == "use":
                n = replace(n, used=i % (n.capacity + 1))
            elif op == "grow":
                n = replace(n, capacity=n.capacity + i % 3)
            else:
                n = replace(n, profile="gb200-nvl72" if n.profile == "hgx-h100" else "hgx-h100")
            view.nodes[name] = n
        view.forget(before)
        derive(view)
        fresh = View(dict(view.nodes))
        derive(fresh)
        assert view.index == fresh.index and view.places == fresh.places
        assert view.kinds == fresh.kinds
        assert {k: set(v) for k, v in view.by_profile.items()} == \
            {k: set(v) for k, v in fresh.by_profile.items()}
        assert view.widest == fresh.widest
        assert all(view.room(t, p) == fresh.room(t, p) for t in tiers for p in kinds)


def test_a_node_joining_another_rack_keeps_a_promises_layout_one_joining_its_own_not() -> None:
    pool = cluster(("hgx-h100", 16))  # 4 racks of 4
    names = sorted(pool)
    view = View({n: pool[n] for n in names if n not in (names[3], names[15])})
    rack = view.nodes[names[0]].domain(Tier.RACK)
    assert rack is not None and pool[names[3]].domain(Tier.RACK) == rack
    g = gang("g", 2, 8, required=Tier.RACK)
    view.groups[g.key] = g
    view.decisions[g.key] = Decision(g.key, Tier.RACK, rack, 0.0, 1e9)
    reservations(view, 1.0)
    laid = view.layouts[g.key]
    for name, keeps in ((names[15], True), (names[3], False)):  # the last rack, then its own
        view.nodes[name] = pool[name]
        view.forget({name: None})
        reservations(view, 1.0)
        assert (view.layouts[g.key] is laid) is keeps, name
        assert name in view.in_domain(Tier.RACK, pool[name].domain(Tier.RACK) or ())
