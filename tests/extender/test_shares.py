"""GPU memory shares (DRA consumable capacity) as the extender counts them:
a request asking ``capacity.requests.memory`` of shareable GPUs is a share,
rounded as the GPUs' policy rounds it; a GPU holding shares is used for
whole-GPU requests and has the room its shares leave; two 30Gi shares of
an 80Gi GPU fit it, a third does not and opens another GPU."""

from __future__ import annotations

from typing import Any

import pytest

from harness import extender_objects as k
from toposerve.dra_driver.gpu.devices import DRIVER, gpu_pool
from toposerve.localcluster.scale import controllers as ctl
from toposerve.scheduler_ext.config import ExtenderConfig
from toposerve.scheduler_ext.placement.decide import (
    Policy,
    filter_ungrouped,
    prioritize_ungrouped,
)
from toposerve.scheduler_ext.placement.levels import domain_of
from toposerve.scheduler_ext.placement.model import (
    Decision,
    Group,
    Member,
    NodeState,
    Source,
    View,
)
from toposerve.scheduler_ext.placement.shares import fresh_units, room, round_up
from toposerve.scheduler_ext.state import demand as dm
from toposerve.scheduler_ext.state.cache import ClusterState
from toposerve.topology.layout import PlannedNode
from toposerve.topology.model import DomainPath, NodeTopology, Tier
from toposerve.topology.profiles import load_profile

pytestmark = pytest.mark.unit

GI = 2**30
SHARE = k.device_class("gpu-share", f"device.driver == '{DRIVER}' && "
                                    "device.allowMultipleAllocations")


def test_two_30gi_shares_fit_an_80gi_gpu_a_third_opens_another() -> None:
    assert fresh_units([30 * GI], (), 80 * GI) == 1
    rooms = (room(80 * GI, [30 * GI]),)
    assert fresh_units([30 * GI], rooms, 80 * GI) == 0
    rooms = (room(80 * GI, [30 * GI, 30 * GI]),)
    assert rooms == (20 * GI,)
    assert fresh_units([30 * GI], rooms, 80 * GI) == 1
    assert fresh_units([30 * GI], rooms, 0) is None  # no free GPU left to open
    assert fresh_units([20 * GI], rooms, 0) == 0  # but 20Gi still fit


def test_shares_go_largest_first_into_the_tightest_room() -> None:
    # 50 into the 60 room (not the 70), then 60 into the 70: nothing opened
    assert fresh_units([10 * GI, 50 * GI, 60 * GI], (70 * GI, 60 * GI), 80 * GI) == 0
    # one pod's own shares pack into as few GPUs as hold them
    assert fresh_units([30 * GI] * 4, (), 80 * GI) == 2
    assert fresh_units([90 * GI], (), 80 * GI) is None
    assert fresh_units([GI] * 1000, (), 80 * GI) is None  # past any claim's requests


@pytest.mark.parametrize("ask, consumed", [
    (30 * GI, 30 * GI), (30 * GI + 1, 31 * GI), (GI // 2, GI), (0, GI)])
def test_asks_round_up_as_the_policy_rounds_them(ask: int, consumed: int) -> None:
    assert round_up(ask, GI, GI) == consumed
    assert round_up(ask, 0, 0) == ask


def _node_state(rooms: tuple[int, ...], share_unit: int, capacity: int, used: int) -> NodeState:
    return NodeState("n", DomainPath(host="n"), capacity=capacity, used=used, rooms=rooms,
                     share_unit=share_unit)


def test_what_a_share_takes_depends_on_the_node() -> None:
    one_gpu = _node_state((), 80 * GI, 1, 0)
    assert one_gpu.needs(0, [30 * GI]) == 1 and one_gpu.needs(2, ()) == 2
    held = _node_state((50 * GI,), 0, 1, 1)
    assert held.needs(0, [30 * GI]) == 0
    full = _node_state((20 * GI,), 0, 1, 1)
    assert full.needs(0, [30 * GI]) is None


# --- the cache, from slices and claims as the cluster writes them ----------------------

def _shareable_slice(n: PlannedNode) -> dict[str, Any]:
    topo = NodeTopology(name=n.name, path=n.path, profile=n.profile,
                        hardware=load_profile(n.profile).hardware())
    pool = gpu_pool(topo, memory_shares=True)
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{n.name}-{DRIVER}"},
            "spec": {"driver": DRIVER, "nodeName": n.name,
                     "pool": {"name": pool.name, "generation": 1, "resourceSliceCount": 1},
                     "devices": [dict(d) for d in pool.devices]}}


def _state() -> tuple[ClusterState, str]:
    nodes = k.planned(("hgx-h100", 1))
    st = ClusterState(ExtenderConfig())
    st.relist("nodes", [k.node(nodes[0])])
    st.relist("slices", [_shareable_slice(nodes[0])])
    st.relist("classes", [SHARE, k.device_class(k.GPU_CLASS, f"device.driver == '{DRIVER}'")])
    st.snapshot()
    return st, nodes[0].name


def _request(memory: str | None, cls: str = "gpu-share", count: int = 1) -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if memory is not None:
        exactly["capacity"] = {"requests": {"memory": memory}}
    return {"name": "gpu", "exactly": exactly}


def _share_claim(name: str, node: str, memory: str, uid: str) -> dict[str, Any]:
    """A 30Gi-share claim as the scheduler leaves it: on gpu-0, with its share."""
    return {"metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": [_request(memory)]}},
            "status": {"allocation": {"devices": {"results": [
                {"request": "gpu", "driver": DRIVER, "pool": node, "device": "gpu-0",
                 "shareID": f"00000000-0000-4000-8000-00000000000{uid[-1]}",
                 "consumedCapacity": {"memory": memory}}]}},
                "reservedFor": [{"resource": "pods", "name": name, "uid": uid}]}}


def test_a_memory_request_of_shareable_gpus_is_a_share() -> None:
    st, _ = _state()
    ev = st.demands.evaluate(dm.parse_requests([_request("30Gi")]))
    assert (ev.count, ev.shares) == (0, (30 * GI,))
    # rounded as the GPUs' policy rounds it (1Gi steps), twice for count 2
    ev = st.demands.evaluate(dm.parse_requests([_request("30500Mi", count=2)]))
    assert ev.shares == (30 * GI, 30 * GI)  # 30500Mi is under 30Gi (30720Mi)
    ev = st.demands.evaluate(dm.parse_requests([_request("31000Mi")]))
    assert ev.shares == (31 * GI,)
    # no memory asked: the default share is all of it, a whole GPU
    assert st.demands.evaluate(dm.parse_requests([_request(None)])).count == 1
    assert st.demands.share_unit() == 80 * GI


def test_a_share_of_devices_not_all_shareable_counts_as_a_unit() -> None:
    nodes = k.planned(("hgx-h100", 1))
    st = k.cluster_state(nodes, classes=[SHARE])  # partitioned, none shareable
    st.snapshot()
    # the share class picks nothing here: no node has shareable GPUs
    assert st.demands.evaluate(dm.parse_requests([_request("30Gi")])).shares == ()
    ev = st.demands.evaluate(dm.parse_requests([_request("30Gi", cls=k.GPU_CLASS)]))
    assert (ev.count, ev.shares) == (1, ())


def test_shares_on_a_gpu_leave_it_used_with_its_room() -> None:
    st, name = _state()
    for i in (1, 2):
        st.resource_claim("ADDED", _share_claim(f"c{i}", name, "30Gi", f"u{i}"))
    ns = st.snapshot().nodes[name]
    # gpu-0 is used once (not twice) and has 20Gi left; the other 7 are free
    assert (ns.capacity, ns.used, ns.rooms, ns.share_unit) == (8, 1, (20 * GI,), 80 * GI)
    assert ns.needs(0, [30 * GI]) == 1  # a third 30Gi opens another GPU
    assert ns.needs(0, [20 * GI]) == 0


def _pod(st: ClusterState, name: str, memory: str) -> dict[str, Any]:
    """A pending pod of no group with one share claim (made, not allocated)."""
    st.resource_claim("ADDED", {"metadata": {"name": f"{name}-gpu", "namespace": "default"},
                                "spec": {"devices": {"requests": [_request(memory)]}}})
    return ctl.pod(name, uid=f"uid-{name}", profile=None, spec={"resourceClaims": [
        {"name": "gpu", "resourceClaimName": f"{name}-gpu"}]})


def test_a_share_beside_shares_passes_where_free_gpus_are_promised() -> None:
    path = DomainPath(zone="z", block="b", rack="r", nvlink="n", host="h")
    # gpu-0 holds two 20Gi shares (40Gi left); the 7 free GPUs are promised
    # to a group of 7 one-GPU pods not placed yet
    node = NodeState("h", path, capacity=8, used=1, rooms=(40 * GI,), share_unit=80 * GI)
    group = Group("g", Source.TOPOSERVE, 7, tuple(Member(f"m{i}", f"default/m{i}", 1)
                                                 for i in range(7)))
    view = View({"h": node}, groups={"g": group}, decisions={"g": Decision(
        "g", Tier.SAME_NODE, domain_of(path, Tier.SAME_NODE) or (), 0.0, 1e9, required=True)})
    assert filter_ungrouped(view, 1, ["h"], 1.0).passed == []  # a whole GPU: kept off
    # a 30Gi share fits beside the others and passes; 50Gi would open a promised GPU
    assert filter_ungrouped(view, 0, ["h"], 1.0, [30 * GI]).passed == ["h"]
    out = filter_ungrouped(view, 0, ["h"], 1.0, [50 * GI])
    assert out.passed == [] and "promised" in out.failed["h"]


def test_a_pending_share_pod_asks_its_share() -> None:
    st, _ = _state()
    with st.observing(_pod(st, "small", "30Gi")) as small:
        assert st.asks(small) == (0, (30 * GI,))
        assert st.demand(small) == 1  # wherever it goes: at most one GPU
    two = _pod(st, "two", "30Gi")
    st.resource_claim("MODIFIED", {"metadata": {"name": "two-gpu", "namespace": "default"},
                                   "spec": {"devices": {"requests": [
                                       _request("30Gi", count=2)]}}})
    with st.observing(two) as facts:
        assert st.asks(facts) == (0, (30 * GI, 30 * GI)) and st.demand(facts) == 1


def test_a_share_packs_beside_shares_before_opening_a_gpu() -> None:
    path = DomainPath(zone="z", block="b", rack="r", nvlink="n", host="a")
    shared = NodeState("a", path, capacity=8, used=1, rooms=(50 * GI,), share_unit=80 * GI)
    # the same room left, but the share would open a GPU there
    fresh = NodeState("b", path.model_copy(update={"host": "b"}), capacity=8, used=0,
                      share_unit=80 * GI)
    view = View({"a": shared, "b": fresh})
    assert prioritize_ungrouped(view, 0, ["b", "a"], Policy(), 0.0, [30 * GI]) == {"a": 10}
