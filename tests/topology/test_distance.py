"""Invariants of the distance and cost functions, checked by hypothesis."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toposerve.topology.distance import device_affinity, kv_transfer_seconds, node_tier
from toposerve.topology.model import Affinity, DomainPath, Tier
from toposerve.topology.profiles import bundled_names, load_profile

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`

labels = st.sampled_from(["a", "b", None])
paths = st.builds(DomainPath, zone=labels, block=labels, rack=labels, nvlink=labels,
                  host=st.sampled_from(["n1", "n2", "n3"]))
profiles = st.sampled_from(bundled_names())
sizes = st.integers(min_value=0, max_value=10**12)


@given(paths, paths)
def test_tier_symmetric(a: DomainPath, b: DomainPath) -> None:
    assert node_tier(a, b) == node_tier(b, a)


@given(paths)
def test_self_is_same_node(a: DomainPath) -> None:
    assert node_tier(a, a) == Tier.SAME_NODE


@given(paths, paths, paths)
def test_tier_ultrametric(a: DomainPath, b: DomainPath, c: DomainPath) -> None:
    # In a tree each host has one path: name hosts after their path and a draw.
    a, b, c = (p.model_copy(update={"host": f"{p.host}{p.zone}{p.block}{p.rack}{p.nvlink}"})
               for p in (a, b, c))
    assert node_tier(a, c) <= max(node_tier(a, b), node_tier(b, c))


def test_tier_compares_whole_prefix() -> None:
    a = DomainPath(zone="z", block="b1", rack="r1", nvlink="n", host="x")
    b = DomainPath(zone="z", block="b2", rack="r1", nvlink="n", host="y")
    assert node_tier(a, b) == Tier.ZONE  # same rack name, different blocks
    c = DomainPath(zone="z", block="b1", rack="r1", nvlink=None, host="y")
    assert node_tier(a, c) == Tier.RACK  # unknown NVLink domain is never shared
    d = DomainPath(host="q")
    assert node_tier(a, d) == Tier.BEYOND


@given(profiles, sizes, paths, paths)
def test_kv_cost_symmetric_and_zero_on_self(name: str, n: int, a: DomainPath,
                                            b: DomainPath) -> None:
    links = load_profile(name).links()
    assert kv_transfer_seconds(n, a, b, links) == kv_transfer_seconds(n, b, a, links)
    assert kv_transfer_seconds(n, a, a, links) == 0.0


def pair_at(t: Tier) -> tuple[DomainPath, DomainPath]:
    """Two nodes exactly ``t`` apart."""
    near = DomainPath(zone="z", block="b", rack="r", nvlink="n", host="h1")
    if t == Tier.SAME_NODE:
        return near, near
    differ = {Tier.NVLINK: {}, Tier.RACK: {"nvlink": "x"}, Tier.BLOCK: {"rack": "x"},
              Tier.ZONE: {"block": "x"}, Tier.BEYOND: {"zone": "x"}}[t]
    return near, near.model_copy(update={"host": "h2", **differ})


@given(profiles, sizes, st.sampled_from(list(Tier)), st.sampled_from(list(Tier)))
def test_kv_cost_monotonic_in_tier(name: str, n: int, t1: Tier, t2: Tier) -> None:
    links = load_profile(name).links()
    (a1, b1), (a2, b2) = pair_at(t1), pair_at(t2)
    assert node_tier(a1, b1) == t1 and node_tier(a2, b2) == t2
    if t1 <= t2:
        assert kv_transfer_seconds(n, a1, b1, links) <= kv_transfer_seconds(n, a2, b2, links)


@given(profiles, st.integers(0, 10**11), st.integers(0, 10**11))
def test_kv_cost_grows_with_bytes(name: str, x: int, y: int) -> None:
    links = load_profile(name).links()
    a, b = DomainPath(zone="z", host="h1"), DomainPath(zone="z", host="h2")
    lo, hi = sorted((x, y))
    assert kv_transfer_seconds(lo, a, b, links) <= kv_transfer_seconds(hi, a, b, links)


@given(profiles, st.data())
def test_device_affinity_symmetric_and_self(name: str, data: st.DataObject) -> None:
    hw = load_profile(name).hardware()
    names = [d.name for d in hw.devices()]
    a = data.draw(st.sampled_from(names))
    b = data.draw(st.sampled_from(names))
    assert device_affinity(hw, a, b) == device_affinity(hw, b, a)
    assert device_affinity(hw, a, a) == Affinity.SAME_DEVICE
    if a != b:
        assert device_affinity(hw, a, b) > Affinity.SAME_DEVICE


def test_gaps_are_unknown_levels_outside_known_ones() -> None:
    assert DomainPath(host="h").gaps() == []
    assert DomainPath(zone="z", host="h").gaps() == []
    assert DomainPath(rack="r", host="h").gaps() == [Tier.ZONE, Tier.BLOCK]
    assert DomainPath(zone="z", nvlink="n", host="h").gaps() == [Tier.BLOCK, Tier.RACK]


@given(paths)
def test_a_path_without_gaps_shares_every_known_level_with_itself(p: DomainPath) -> None:
    # the reason for the check: past a gap, node_tier sees nothing
    twin = p.model_copy(update={"host": p.host + "-twin"})
    known = [t for t in (Tier.ZONE, Tier.BLOCK, Tier.RACK, Tier.NVLINK) if p.value(t)]
    assert (node_tier(p, twin) == min(known, default=Tier.BEYOND)) == (not p.gaps())
