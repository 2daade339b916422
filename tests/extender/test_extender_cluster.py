"""The extender under the real kube-scheduler (v1.37.2) on a kwok cluster of
three GB200 NVL72 racks and two HGX H100 racks, with GPU ResourceSlices and
claims allocated by the scheduler's DRA plugin; pods shaped like the real
controllers' output."""

from __future__ import annotations

import os
import random
import re
from collections import Counter
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
import urllib3

from harness import extender_objects as k
from harness.extender_cluster import (
    GpuCluster,
    LwsGroups,
    SlowBinder,
    bound_nodes,
    create,
    create_disaggregated,
    create_lws,
    create_pods,
    create_workers,
    delete_all,
    gpu_cluster,
    pods,
    post,
    rest,
    scheduling_events,
    wait_bound,
)
from harness.waiting import wait_for
from toposerve.dra_driver.gpu.devices import DRIVER
from toposerve.localcluster.scale import controllers as ctl
from toposerve.localcluster.scale.controllers import collection

pytestmark = pytest.mark.cluster

NAME = (os.environ.get("TOPOSERVE_TEST_CLUSTER", "toposerve-test") + "-ext")[:32]
GROUPS = [("gb200-nvl72", 54), ("hgx-h100", 8)]


@pytest.fixture(scope="module")
def gc(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuCluster]:
    with gpu_cluster(NAME, GROUPS, tmp_path_factory.mktemp("ext"), workload_gates=True,
                     extender_config={"placement": {"promiseTTLSeconds": 60},
                                      # the profile gpu_cluster's scheduler config has
                                      "schedulerName": "default-scheduler"}) as c:
        yield c


@pytest.fixture
def clean(gc: GpuCluster) -> Iterator[GpuCluster]:
    yield gc
    delete_all(gc.api)


def racks(gc: GpuCluster, nodes: dict[str, str]) -> set[str | None]:
    return {gc.paths[n].rack for n in nodes.values()}


def owner_chain(gc: GpuCluster, pod: dict[str, Any]) -> list[str]:
    """The kinds of a pod's controller, its controller's, and so on, each
    read back from the API by the uid in the reference."""
    kinds = []
    obj = pod
    while refs := [r for r in obj["metadata"].get("ownerReferences") or [] if r.get("controller")]:
        ref = refs[0]
        obj = rest(gc.api).request("GET", f"{collection(ref['kind'])}/{ref['name']}")
        assert obj["metadata"]["uid"] == ref["uid"], f"{ref['kind']} {ref['name']}: other uid"
        kinds.append(ref["kind"])
    return kinds


def test_wide_ep_groups_land_whole_in_one_rack_in_any_interleaving(clean: GpuCluster) -> None:
    gc = clean
    rnd = random.Random(16)
    # a whole rack as a LeaderWorkerSet with exclusive placement: owner objects and
    # pods with real owner references, labels, annotations and affinity as LWS writes them
    lws = ctl.leader_worker_set("lws-a", 1, 18, exclusive="topology.toposerve.io/rack")
    b = k.toposerve_pods("ep-b", 9, claim_template="gpu4", level="rack")
    c = k.toposerve_pods("ep-c", 9, claim_template="gpu4", level="rack")
    plain = [ctl.pod(f"web-{i}", labels={"app": "web"}) for i in range(4)]
    first: list[dict[str, Any] | None] = [None, *b, *c, *plain]  # None: the LWS and its leader
    rnd.shuffle(first)
    groups: LwsGroups | None = None
    for item in first:
        if item is None:
            groups = create_lws(gc.api, lws, claim_template="gpu4")
        else:
            create_pods(gc.api, [item])
    assert groups is not None
    # LeaderWorkerSet creates the workers only once the leader is placed, pinned to its rack
    wait_bound(gc.api, "leaderworkerset.sigs.k8s.io/worker-index=0", 1)
    workers = create_workers(gc.api, groups, 0)
    placed = {g: wait_bound(gc.api, sel, n) for g, sel, n in (
        ("lws-a", "leaderworkerset.sigs.k8s.io/name=lws-a", 18),
        ("ep-b", "toposerve.io/group=ep-b", 9), ("ep-c", "toposerve.io/group=ep-c", 9))}
    wait_bound(gc.api, "app=web", 4)
    for group, nodes in placed.items():
        assert len(racks(gc, nodes)) == 1, f"{group} split over {racks(gc, nodes)}"
    # b and c share a rack (best fit) and the LWS group has one of its own
    assert racks(gc, placed["ep-b"]) == racks(gc, placed["ep-c"])
    assert racks(gc, placed["lws-a"]) != racks(gc, placed["ep-b"])
    assert owner_chain(gc, workers[-1]) == ["StatefulSet", "Pod", "StatefulSet",
                                            "LeaderWorkerSet"]


def test_groups_claiming_through_a_sites_own_device_classes_land_whole(
        clean: GpuCluster) -> None:
    # a site's classes for our driver, not named as the extender's config names
    # them: counted as no GPUs, three groups were promised one rack and 9 pods
    # never scheduled
    gc = clean
    big = f'device.capacity["{DRIVER}"].memory.compareTo(quantity("100Gi")) >= 0'
    for c in (k.device_class("site-gpu", f"device.driver == '{DRIVER}'"),
              k.device_class("site-gb200", f"device.driver == '{DRIVER}'",
                             f'device.attributes["{DRIVER}"].productName == "NVIDIA GB200"',
                             big)):
        create(gc.api, "/apis/resource.k8s.io/v1/deviceclasses", c)
    templates = {"ep-x": k.template("site4", 4, device_class="site-gpu"),
                 "ep-y": k.template("gb4", 4, device_class="site-gb200"),
                 "ep-z": k.template("site4-big", 4, device_class="site-gpu", exprs=(big,))}
    for t in templates.values():
        create(gc.api, "/apis/resource.k8s.io/v1/namespaces/default/resourceclaimtemplates", t)
    two = sorted({str(p.rack) for n, p in gc.paths.items() if n.startswith("gb200")})[:2]
    only = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "topology.toposerve.io/rack", "operator": "In", "values": two}]}]}}}
    groups = []
    for name, t in templates.items():
        members = k.toposerve_pods(name, 9, claim_template=t["metadata"]["name"], level="rack")
        for p in members:
            p["spec"]["affinity"] = only
        groups.append(members)
    create_pods(gc.api, [p for trio in zip(*groups, strict=True) for p in trio])  # interleaved
    placed = {g: wait_bound(gc.api, f"toposerve.io/group={g}", 9) for g in templates}
    for group, nodes in placed.items():
        assert len(racks(gc, nodes)) == 1, f"{group} split over {racks(gc, nodes)}"
    assert set().union(*(racks(gc, nodes) for nodes in placed.values())) == set(two)


def test_a_group_that_fits_nowhere_waits_whole_with_a_reason(clean: GpuCluster) -> None:
    gc = clean
    huge = k.toposerve_pods("huge", 19, claim_template="gpu4", level="rack")  # 76 GPUs > 72
    create_pods(gc.api, huge)
    reason = wait_for("a FailedScheduling event naming the group",
                      lambda: next((m for m in scheduling_events(gc.api, "huge-0")
                                    if "group toposerve/default/huge needs 76" in m), ""),
                      timeout=90)  # the first attempt can wait on a loaded machine
    assert "in one rack" in reason
    assert not any(bound_nodes(gc.api, "toposerve.io/group=huge").values())


def test_pd_slices_keep_decode_beside_prefill_and_fall_back_one_level(
        clean: GpuCluster) -> None:
    gc = clean
    # HGX: one node is an NVLink domain (8 GPUs); 16 GPUs fall back to the rack
    hgx = create_disaggregated(gc.api, "hgx", 0, {"prefill": (2, 1), "decode": (1, 2)},
                               claim_template="gpu4", profile="hgx-h100")
    # GB200: a slice of 4 prefill + 2 decode fits one NVLink domain (the rack); the
    # slice's size is known only from its LeaderWorkerSets (the extender watches them)
    create_disaggregated(gc.api, "inf", 0, {"prefill": (4, 1), "decode": (1, 2)},
                         claim_template="gpu4")
    gb = wait_bound(gc.api, "disaggregatedset.x-k8s.io/name=inf", 6)
    on_hgx = wait_bound(gc.api, "disaggregatedset.x-k8s.io/name=hgx", 4)
    assert len({gc.paths[n].nvlink for n in gb.values()}) == 1
    assert len(racks(gc, on_hgx)) == 1 and len(set(on_hgx.values())) == 2
    decode_worker = next(p for p in hgx if p["metadata"]["name"].endswith("decode-0-1"))
    assert owner_chain(gc, decode_worker) == ["StatefulSet", "Pod", "StatefulSet",
                                              "LeaderWorkerSet", "DisaggregatedSet"]


def slice_pods(name: str) -> list[dict[str, Any]]:
    """A P/D slice as the benchmark makes it: 2 prefill + 2 decode of 4 GPUs on
    HGX, preferring one NVLink domain (8 GPUs: it falls back to the rack)."""
    out = k.toposerve_pods(name, 4, claim_template="gpu4", preferred="nvlink",
                           profile="hgx-h100")
    for p, role in zip(out, ("prefill", "prefill", "decode", "decode"), strict=True):
        p["metadata"]["labels"]["llm-d.ai/role"] = role
    return out


def bound_of(gc: GpuCluster, selector: str, count: int) -> dict[str, str]:
    """Wait until ``count`` pods of ``selector`` are bound (others may wait)."""
    return wait_for(f"{count} pods of {selector} bound", lambda: (
        got if len(got := {p: n for p, n in bound_nodes(gc.api, selector).items() if n}) ==
        count else {}), timeout=90, interval=0.3)


def test_a_slice_stays_in_its_rack_beside_another_groups_slow_binding(
        clean: GpuCluster) -> None:
    # make scale's one split slice, small: a slice of 16 GPUs in an HGX rack whose
    # last member's room is on a node where another group's pod is between its
    # claim's allocation and its binding. Counted both at its claim and where the
    # extender assumed it, that node looked full; so did the rack, and the last
    # member climbed to the block and split its slice.
    gc = clean
    binder = SlowBinder(gc)
    hgx = sorted(n for n in gc.paths if n.startswith("hgx"))  # two racks of four
    rack = gc.paths[hgx[0]].rack
    web = [ctl.pod("web-0", claim_template="gpu8", profile="hgx-h100",
                   scheduler=SlowBinder.NAME),
           ctl.pod("web-1", claim_template="gpu4", profile="hgx-h100",
                   scheduler=SlowBinder.NAME)]
    pd = slice_pods("pd")
    solo = k.toposerve_pods("solo", 1, claim_template="gpu4", preferred="nvlink",
                            profile="hgx-h100")
    for p in [*pd[:3], *solo]:
        p["spec"]["schedulerName"] = SlowBinder.NAME
    create_pods(gc.api, [*web, *pd[:3], *solo])
    # where the scheduler put them (the extender passed those nodes): the slice's
    # last member's room is on the rack's fourth node, whose other half is the
    # best fit of a one-pod group
    for name, node in [("web-0", hgx[0]), ("web-1", hgx[2]), ("pd-0", hgx[1]),
                       ("pd-1", hgx[1]), ("pd-2", hgx[2])]:
        binder.schedule(name, hgx, node)
    assert binder.schedule("solo-0", hgx, bind=False) == hgx[3]
    create_pods(gc.api, pd[3:])  # the real scheduler, while solo-0 is not bound yet
    placed = wait_bound(gc.api, "toposerve.io/group=pd", 4)
    binder.bind("solo-0", hgx[3])
    assert racks(gc, placed) == {rack}, f"the slice split: {placed}"
    assert placed["pd-3"] == hgx[3]


def test_pods_of_no_group_leave_a_slices_promised_room_alone(clean: GpuCluster) -> None:
    # hgx-1000, small: single-GPU claims the scheduler spreads over every node
    # arrive between a slice's first member and the rest; they took its
    # rack's room, and 96 of 100 slices split
    gc = clean
    pd = slice_pods("pd")
    create_pods(gc.api, pd[:1])
    first = wait_bound(gc.api, "toposerve.io/group=pd", 1)
    # 40 of the 64 GPUs; the 12 promised to the slice and 12 more stay free
    create_pods(gc.api, [ctl.pod(f"one-{i}", labels={"app": "one"}, claim_template="gpu1",
                                 profile="hgx-h100") for i in range(40)])
    wait_bound(gc.api, "app=one", 40)
    create_pods(gc.api, pd[1:])
    placed = wait_bound(gc.api, "toposerve.io/group=pd", 4)
    assert racks(gc, placed) == racks(gc, first), f"the slice split: {placed}"
    assert gc.extender is not None
    # some of the 40 were refused the promised nodes (the scheduler spreads them)
    assert 'toposerve_extender_decisions_total{reason="kept-off"}' in gc.extender.metrics()


def test_a_held_slice_binds_soon_after_its_leaderworkersets_appear(clean: GpuCluster) -> None:
    gc = clean
    ds = post(gc.api, ctl.disaggregated_set("slow", {"prefill": (2, 1), "decode": (2, 1)}))
    sets = ctl.disaggregated_lws(ds, 0, "7f9b8c1d")
    members = []
    for lws in sets:
        sts = ctl.leader_statefulset(lws, "7f9b8c1d")
        for g in range(lws["spec"]["replicas"]):
            p = ctl.lws_leader(lws, sts, g, claim_template="gpu4")
            del p["metadata"]["ownerReferences"]  # its owners do not exist yet
            members.append(p)
    create_pods(gc.api, members)
    names = [f"default/{p['metadata']['name']}" for p in members]

    def settled() -> bool:
        # each pod refused twice for its size with all four seen: the scheduler
        # wrote that reason once (an update of the pod, which requeues it) and
        # then found nothing new, so it waits in its unschedulable pool now and
        # nothing else is going to happen in the cluster
        assert gc.extender is not None
        tries = Counter(e["pod"] for e in gc.extender.placements()
                        if e["outcome"] == "size-unknown" and "4 pods so far" in e["reason"])
        return all(tries[n] >= 2 for n in names)
    wait_for("the slice's pods held for its size", settled, timeout=90, interval=0.5)
    for lws in sets:
        post(gc.api, lws)
    # the scheduler retries them at once (the extender marks them), not at its
    # 5-minute flush of unschedulable pods; within its 10 s backoff at most
    placed = wait_bound(gc.api, "disaggregatedset.x-k8s.io/name=slow", 4, timeout=30)
    assert len({gc.paths[n].nvlink for n in placed.values()}) == 1


def test_in_tree_pod_group_pods_are_a_group(clean: GpuCluster) -> None:
    gc = clean
    groups = "/apis/scheduling.k8s.io/v1beta1/namespaces/default/podgroups"
    rest(gc.api).request("POST", groups, body=k.pod_group("pg", 9))
    members = k.pod_group_pods("pg", 9, claim_template="gpu4")
    for p in members:
        p["metadata"]["labels"]["test"] = "pg"
    create_pods(gc.api, members)
    (got,) = [p for p in pods(gc.api, "test=pg") if p["metadata"]["name"] == "pg-0"]
    # the gate let the field through
    assert got["spec"]["schedulingGroup"] == {"podGroupName": "pg"}
    placed = wait_bound(gc.api, "test=pg", 9)
    assert len(racks(gc, placed)) == 1
    rest(gc.api).request("DELETE", f"{groups}/pg")


def test_restart_mid_group_keeps_it_in_one_domain_and_plain_pods_never_wait(
        clean: GpuCluster) -> None:
    gc = clean
    assert gc.extender is not None
    members = k.toposerve_pods("rs", 12, claim_template="gpu4", level="rack")
    create_pods(gc.api, members[:5])
    first = wait_bound(gc.api, "toposerve.io/group=rs", 5)
    notes = [p["metadata"].get("annotations") or {} for p in pods(gc.api, "toposerve.io/group=rs")
             if p["metadata"]["name"] in first]
    assert any("toposerve.io/placement" in n for n in notes)
    gc.extender.stop()
    # the extender is down: an ordinary pod is still scheduled (ignorable)
    create_pods(gc.api, [ctl.pod("lonely", labels={"app": "lonely"})])
    wait_bound(gc.api, "app=lonely", 1, timeout=30)
    gc.extender.start()
    create_pods(gc.api, members[5:])
    placed = wait_bound(gc.api, "toposerve.io/group=rs", 12)
    assert len(racks(gc, placed)) == 1


def test_a_groups_pod_sent_to_another_scheduler_gets_a_warning_event(
        clean: GpuCluster) -> None:
    gc = clean
    ext = gc.extender
    assert ext is not None
    stray = k.toposerve_pods("stray", 2, claim_template="gpu4", level="rack")
    for p in stray:
        p["spec"]["schedulerName"] = "nobody-scheduler"  # none runs: they stay pending
    create_pods(gc.api, stray)

    def warnings() -> dict[str, str]:
        evs = rest(gc.api).request("GET", "/api/v1/namespaces/default/events",
                                   [("fieldSelector", "reason=NotScheduledAsGroup")])["items"]
        got = {e["involvedObject"]["name"]: str(e["message"]) for e in evs
               if e["involvedObject"]["name"].startswith("stray-")}
        return got if len(got) == 2 else {}

    said = wait_for("the extender's warnings on the stray pods", warnings, timeout=30)
    assert "'nobody-scheduler'" in said["stray-0"]
    assert "spec.schedulerName: default-scheduler" in said["stray-0"]
    assert "toposerve_extender_group_pods_elsewhere 2.0" in ext.metrics()
    rest(gc.api).request("DELETE", "/api/v1/namespaces/default/pods",
                         [("labelSelector", "toposerve.io/group=stray")])
    wait_for("the count back to 0", lambda: "toposerve_extender_group_pods_elsewhere 0.0"
             in ext.metrics(), timeout=30)


def test_the_live_extender_answers_bad_json_and_unknown_pods(gc: GpuCluster) -> None:
    assert gc.extender is not None
    http = urllib3.PoolManager()
    r = http.request("POST", f"{gc.extender.url}/filter", body=b"{", timeout=5)
    assert r.status == 400 and "Error" in orjson.loads(r.data)
    names = sorted(gc.paths)
    stranger: dict[str, Any] = ctl.pod("stranger", uid="never-seen")
    r = http.request("POST", f"{gc.extender.url}/filter", timeout=5,
                     body=orjson.dumps({"Pod": stranger, "NodeNames": names}))
    assert r.status == 200 and orjson.loads(r.data)["NodeNames"] == names
    text = gc.extender.metrics()
    assert 'toposerve_extender_decisions_total{reason="pass-through"}' in text
    # this process (restarted above) picked up the group it found half placed
    assert re.search(r'toposerve_extender_decisions_total\{reason="(held|decided)"\} [1-9]',
                     text)
