"""A claim's accelerators read as the DRA allocator reads its requests: any
DeviceClass whose selectors (CEL, on the devices of our slices) pick
accelerator devices counts; firstAvailable, count and All; what cannot be
decided counts conservatively and says so."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from harness import extender_objects as k
from toposerve.localcluster.scale import controllers as ctl
from toposerve.scheduler_ext.config import ExtenderConfig
from toposerve.scheduler_ext.protocol import ExtenderArgs, decode
from toposerve.scheduler_ext.server import Extender
from toposerve.scheduler_ext.state import demand as dm
from toposerve.scheduler_ext.state.cache import ClusterState

pytestmark = pytest.mark.unit

GPU = "gpu.toposerve.io"
MIB = 2**20


def device_class(name: str, *exprs: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": e}} for e in exprs]}}


def exactly(cls: str, count: int = 1, *exprs: str, all_: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"deviceClassName": cls, "count": count}
    if all_:
        spec = {"deviceClassName": cls, "allocationMode": "All"}
    if exprs:
        spec["selectors"] = [{"cel": {"expression": e}} for e in exprs]
    return spec


def state(*groups: tuple[str, int], classes: list[dict[str, Any]] = ()  # type: ignore[assignment]
          ) -> ClusterState:
    st = k.cluster_state(k.planned(*groups), classes=classes)
    st.snapshot()  # the nodes' profiles
    return st


def asked(st: ClusterState, *requests: dict[str, Any]) -> dm.Evaluated:
    return st.demands.evaluate(dm.parse_requests(list(requests)))


def one(spec: dict[str, Any]) -> dict[str, Any]:
    return {"name": "r", "exactly": spec}


SITE = device_class("site-gpu", f"device.driver == '{GPU}'")
BIG = device_class("big-gpu", f"device.driver == '{GPU}'",
                   f'device.capacity["{GPU}"].memory.compareTo(quantity("100Gi")) > 0')
H100 = device_class("h100", f"device.driver == '{GPU}' && "
                            f'device.attributes["{GPU}"].productName.startsWith("NVIDIA H100")')
NIC = device_class("nic", "device.driver == 'nic.toposerve.io'")


def test_a_site_class_for_our_driver_counts_like_ours() -> None:
    st = state(("gb200-nvl72", 2), classes=[SITE, NIC])
    assert asked(st, one(exactly("site-gpu", 4))) == dm.Evaluated(4)
    assert asked(st, one(exactly(GPU, 4))) == dm.Evaluated(4)  # configured, no object
    assert asked(st, one(exactly("nic", 1))) == dm.Evaluated(0)  # another driver's devices


def test_attribute_and_capacity_selectors_pick_the_products_they_name() -> None:
    gb = state(("gb200-nvl72", 1), classes=[BIG, H100])
    hgx = state(("hgx-h100", 1), classes=[BIG, H100])
    assert asked(gb, one(exactly("big-gpu", 4))).count == 4  # 186Gi
    assert asked(gb, one(exactly("h100", 4))).count == 0
    assert asked(hgx, one(exactly("big-gpu", 4))).count == 0  # 80Gi and partitions
    assert asked(hgx, one(exactly("h100", 2))).count == 2
    # the request's own selectors narrow the class's: version and quantity functions
    newer = f'device.attributes["{GPU}"].driverVersion.isGreaterThan(semver("570.0.0"))'
    older = f'device.attributes["{GPU}"].cudaComputeCapability.isLessThan(semver("9.0.0"))'
    unseen = asked(hgx, one(exactly("site-gpu", 2, newer)))  # the class is not seen here
    assert unseen.count == 2 and "not seen: counted as 2" in unseen.notes[0]  # driver named
    hgx.device_class("ADDED", SITE)
    assert asked(hgx, one(exactly("site-gpu", 2, newer))) == dm.Evaluated(2)
    assert asked(hgx, one(exactly("site-gpu", 2, older))).count == 0
    assert asked(hgx, one(exactly(GPU, 1, f'device.capacity["{GPU}"].memory.isLessThan('
                                          'quantity("20Gi")) && '
                                          'device.allowMultipleAllocations == false'))).count == 1


def test_all_counts_the_matching_units_of_the_largest_node() -> None:
    st = state(("gb200-nvl72", 1), ("hgx-h100", 1), classes=[SITE, H100])
    # a GPU and its partitions are one unit: 8 on HGX, not 80 devices
    assert asked(st, one(exactly("site-gpu", all_=True))).count == 8
    assert asked(st, one(exactly("h100", all_=True))).count == 8
    mig = f'device.attributes["{GPU}"].type == "mig"'
    assert asked(st, one(exactly("site-gpu", 1, mig, all_=True))).count == 8
    gb = state(("gb200-nvl72", 1), classes=[SITE])
    assert asked(gb, one(exactly("site-gpu", all_=True))).count == 4


def test_first_available_counts_the_first_some_node_can_satisfy() -> None:
    st = state(("gb200-nvl72", 2), classes=[SITE, H100, NIC])

    def first(*subs: dict[str, Any]) -> int:
        return asked(st, {"name": "r", "firstAvailable": [
            {"name": f"s{i}", **s} for i, s in enumerate(subs)]}).count
    assert first(exactly("site-gpu", 8), exactly("site-gpu", 4)) == 4  # 4 GPUs a node
    assert first(exactly("h100", 2), exactly("site-gpu", 2)) == 2  # no H100 here: the next
    assert first(exactly("site-gpu", 2), exactly("site-gpu", 1)) == 2
    assert first(exactly("site-gpu", 16), exactly("site-gpu", 8)) == 8  # none can: smallest
    # a first choice of other devices may be the one allocated: the smallest
    assert first(exactly("nic", 1), exactly("site-gpu", 4)) == 0


def test_counts_add_up_over_requests_and_a_claim_of_the_v1beta1_shape() -> None:
    st = state(("gb200-nvl72", 1), classes=[SITE])
    got = asked(st, one(exactly("site-gpu", 2)), {"name": "b", **exactly(GPU, 1)},
                one(exactly("site-gpu")))
    assert got == dm.Evaluated(4)


@pytest.mark.parametrize(("expr", "counted", "why"), [
    (f"device.driver == '{GPU}' &&", 4, "does not compile"),
    (f"device.driver == '{GPU}' && device.vendorMagic('x')", 4, "uses vendorMagic"),
    ("device.driver.startsWith('gpu') && lookup(device) > 1", 0, "uses lookup"),
    (f'device.attributes["{GPU}"].uuid == "GPU-1"', 4, "identity or place"),
    (f'device.attributes["{GPU}"].noSuchAttribute == "x"', 4, "failed"),
])
def test_what_cannot_be_decided_counts_by_the_driver_it_names(expr: str, counted: int,
                                                              why: str) -> None:
    st = state(("gb200-nvl72", 1), classes=[device_class("odd", expr)])
    got = asked(st, one(exactly("odd", 4)))
    assert got.count == counted
    (note,) = got.notes
    assert why in note
    assert ("not counted" in note) == (counted == 0)


def test_an_unseen_class_counts_only_when_its_name_names_an_accelerator_driver() -> None:
    st = state(("gb200-nvl72", 1))
    unseen = asked(st, one(exactly("someone-elses", 2)))
    assert unseen.count == 0 and "DeviceClass 'someone-elses' not seen" in unseen.notes[0]
    named = asked(st, one(exactly(f"{GPU}-large", 2)))
    assert named.count == 2 and "counted as 2 of gpu.toposerve.io" in named.notes[0]


def test_a_pods_demand_follows_its_class_and_the_view_is_rebuilt() -> None:
    st = state(("gb200-nvl72", 18))
    members = k.toposerve_pods("g", 3, claim_template="site4", level="rack")
    tmpl = k.template("site4", 4)
    tmpl["spec"]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "site-gpu"
    st.relist("templates", [tmpl])
    for i, p in enumerate(members):
        p["metadata"]["uid"] = f"u{i}"
        st.pod("ADDED", p)
    view = st.snapshot()
    assert [m.demand for m in view.groups["toposerve/default/g"].members] == [0, 0, 0]
    facts = next(iter(st._pods.values()))
    assert "DeviceClass 'site-gpu' not seen" in st.demand_notes(facts)[0]
    st.device_class("ADDED", SITE)
    view = st.snapshot()
    assert [m.demand for m in view.groups["toposerve/default/g"].members] == [4, 4, 4]
    assert st.demand_notes(facts) == ()
    st.device_class("DELETED", SITE)
    assert [m.demand for m in st.snapshot().groups["toposerve/default/g"].members] == [0, 0, 0]


def test_expressions_compile_once_and_shapes_are_few() -> None:
    st = state(("gb200-nvl72", 18), ("hgx-h100", 4), classes=[SITE, BIG])
    d = st.demands
    asked(st, one(exactly("site-gpu", 1)))
    program = d._programs[f"device.driver == '{GPU}'"]
    asked(st, one(exactly("big-gpu", 1)))  # shares the driver selector
    assert d._programs[f"device.driver == '{GPU}'"] is program
    shapes = {s for p in d.profiles for group, _ in p for s in group}
    assert len(shapes) <= 8  # a GB200 GPU, an H100 and its partition kinds
    assert len(d.profiles) == 2  # one per kind of node
    # a claim beyond the API's limits is cut there, not evaluated
    many = [one(exactly("site-gpu", 1))] * (dm.MAX_REQUESTS + 5)
    assert asked(st, *many).count == dm.MAX_REQUESTS


def test_quantities_and_versions_as_kubernetes_writes_them() -> None:
    q = dm.parse_quantity
    assert q("80Gi").value == 80 * 1024 * MIB
    assert q("1.5k") == q("1500") and q("100m").value * 10 == 1 and q("1e3") == q("1k")
    with pytest.raises(dm.CelError):
        q("eighty")
    v = dm.parse_semver
    assert dm.FUNCTIONS["isGreaterThan"](v("1.10.0"), v("1.9.3"))
    assert dm.FUNCTIONS["isLessThan"](v("1.0.0-rc.1"), v("1.0.0"))
    assert dm.FUNCTIONS["compareTo"](q("1Gi"), q("1024Mi")) == 0


def test_an_undecided_demand_is_said_in_the_filter_reason() -> None:
    # a group of 19 pods of 4 devices of a class nobody created, named after our
    # driver: counted as 4 GPUs each, too many for a rack, and the reason says why
    st = state(("gb200-nvl72", 18))
    st.relist("templates", [k.template("odd4", 4, device_class=f"{GPU}-odd")])
    huge = k.toposerve_pods("huge", 19, claim_template="odd4", level="rack")
    for i, p in enumerate(huge):
        p["metadata"]["uid"] = f"h{i}"
        st.pod("ADDED", p)
    ext = Extender(ExtenderConfig(), st, clock=lambda: 1000.0)
    names = sorted(st.snapshot().nodes)
    got = ext.filter(decode(ExtenderArgs, orjson.dumps({"Pod": huge[0], "NodeNames": names})))
    reasons = set((got.result.FailedAndUnresolvableNodes or {}).values())
    (reason,) = reasons  # one wording: the scheduler's event aggregates it
    assert "needs 76 accelerators" in reason
    assert f"(demand: DeviceClass '{GPU}-odd' not seen: counted as 4 of {GPU}" in reason


# --- extended resources a DeviceClass serves (DRAExtendedResource) --------------------

def named_class(name: str, resource: str | None, created: str, *exprs: str) -> dict[str, Any]:
    obj = device_class(name, *(exprs or (f"device.driver == '{GPU}'",)))
    obj["metadata"]["creationTimestamp"] = created
    if resource:
        obj["spec"]["extendedResourceName"] = resource
    return obj


def test_extended_resource_names_resolve_to_classes_as_the_scheduler_does() -> None:
    got = dm.resource_classes({
        "old": ("example.com/gpu", "2026-01-01T00:00:00Z"),
        "new": ("example.com/gpu", "2026-02-01T00:00:00Z"),  # newer: it wins
        "b": ("example.com/tie", "2026-01-01T00:00:00Z"),
        "a": ("example.com/tie", "2026-01-01T00:00:00Z"),  # same age: the lower name
        "plain": (None, "2026-01-01T00:00:00Z")})
    assert got["example.com/gpu"] == "new" and got["example.com/tie"] == "a"
    # every class also by its implicit name, named or not
    assert {n: c for n, c in got.items() if n.startswith(dm.IMPLICIT_RESOURCE_PREFIX)} == {
        f"{dm.IMPLICIT_RESOURCE_PREFIX}{c}": c for c in ("old", "new", "a", "b", "plain")}


def test_extended_demand_counts_a_mapped_name_as_a_claim_until_its_claim_or_a_plugin_serves_it(
        ) -> None:
    classes = {"nvidia.com/gpu": "gpus", f"{dm.IMPLICIT_RESOURCE_PREFIX}gpus": "gpus"}
    asked = (("example.com/fpga", 1), ("nvidia.com/gpu", 2))
    as_claim = (0, ((dm.Alternative("gpus", (), False, 2),),))
    plugin = ["nvidia.com/gpu"]

    def split(classes: dict[str, str], plugin: list[str], bound: bool,
              by_claim: frozenset[str] = frozenset(), seen: bool = False) -> object:
        return dm.extended_demand(asked, classes, plugin, bound=bound, by_claim=by_claim,
                                  claim_seen=seen)

    # not yet bound: the class, for the limit's count (whether a plugin or DRA serves
    # it depends on the node; the accelerators asked are the same)
    assert split(classes, plugin, False) == as_claim
    # the scheduler made its claim: as the class until the claim is seen, then as itself
    served = frozenset({"nvidia.com/gpu"})
    assert split(classes, plugin, True, served) == as_claim
    assert split(classes, plugin, True, served, seen=True) == (0, ())
    # bound without a claim for it: its node's device plugin serves it
    assert split(classes, plugin, True) == (2, ())
    # no class, a configured device-plugin name: as before
    assert split({}, plugin, False) == (2, ())
    # neither: not an accelerator
    assert split({}, [], False) == (0, ())


def test_a_pod_asking_a_class_by_extended_resource_name_counts_once_on_its_node() -> None:
    nodes = k.planned(("gb200-nvl72", 1))
    st = k.cluster_state(nodes, classes=[
        named_class("ext-gpu", "example.com/gpu", "2026-01-01T00:00:00Z"),
        named_class("ext-nic", "example.com/nic", "2026-01-01T00:00:00Z",
                    "device.driver == 'nic.toposerve.io'")])
    node = nodes[0].name
    st.snapshot()

    def pod(uid: str, limits: dict[str, str]) -> dict[str, Any]:
        return ctl.pod(uid, uid=uid, spec={"containers": [
            {"name": "c", "resources": {"limits": limits}}]})

    p = pod("u1", {"example.com/gpu": "2"})
    st.pod("ADDED", p)
    facts = st._pods["u1"]
    assert st.demand(facts) == 2 and st.demand_notes(facts) == ()
    # the implicit name asks the same class; another driver's class asks no accelerator
    st.pod("ADDED", pod("u2", {f"{dm.IMPLICIT_RESOURCE_PREFIX}ext-gpu": "1",
                               "example.com/nic": "1"}))
    assert st.demand(st._pods["u2"]) == 1
    st.pod("DELETED", pod("u2", {}))
    # bound, the claim made by the scheduler allocated and named in its status
    p["spec"]["nodeName"] = node
    p["status"] = {"phase": "Running", "extendedResourceClaimStatus": {
        "resourceClaimName": "u1-extended-resources-x",
        "requestMappings": [{"containerName": "c", "resourceName": "example.com/gpu",
                             "requestName": "container-0-request-0"}]}}
    st.pod("MODIFIED", p)
    assert st.snapshot().nodes[node].used == 2  # its claim not seen yet: the class's
    st.resource_claim("ADDED", {
        "metadata": {"name": "u1-extended-resources-x", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "container-0-request-0", "exactly": {
            "deviceClassName": "ext-gpu", "count": 2}}]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "container-0-request-0", "driver": GPU, "pool": node,
             "device": f"gpu-{i}"} for i in range(2)]}},
            "reservedFor": [{"resource": "pods", "name": "u1", "uid": "u1"}]}})
    view = st.snapshot()
    assert view.nodes[node].used == 2 and st.demand(st._pods["u1"]) == 2  # once, not 4
    # the class goes: an unbound pod asking its name asks no accelerator it can know of
    st.device_class("DELETED", {"metadata": {"name": "ext-gpu"}})
    st.pod("ADDED", pod("u3", {"example.com/gpu": "2"}))
    assert st.demand(st._pods["u3"]) == 0


def test_admin_access_takes_no_accelerator() -> None:
    """A monitor's claim with adminAccess (DRAAdminAccess) is allocated devices
    in use and never counts as using them: neither its ask nor its allocation."""
    nodes = k.planned(("gb200-nvl72", 1))
    st = k.cluster_state(nodes)
    node = nodes[0].name
    st.snapshot()
    admin = {"name": "r", "exactly": {"deviceClassName": GPU, "allocationMode": "All",
                                      "adminAccess": True}}
    assert asked(st, admin) == dm.Evaluated(0)
    assert asked(st, admin, one(exactly(GPU, 2))) == dm.Evaluated(2)
    st.resource_claim("ADDED", {
        "metadata": {"name": "monitor", "namespace": "ops"},
        "spec": {"devices": {"requests": [admin]}},
        "status": {"allocation": {"devices": {"results": [
            {"request": "r", "driver": GPU, "pool": node, "device": f"gpu-{i}",
             "adminAccess": True} for i in range(4)]}}}})
    view = st.snapshot()
    assert view.nodes[node].used == 0 and view.nodes[node].free == 4
