import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from toposerve.topology.labels import PRESETS, DialectName, from_labels, to_labels
from toposerve.topology.layout import plan_nodes
from toposerve.topology.model import DomainPath
from toposerve.topology.profiles import bundled_names, load_profile
from toposerve.topology.slice_attributes import MAX_ATTRIBUTES, device_entry

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`

values = st.one_of(st.none(), st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True))


@given(st.sampled_from(list(DialectName)), values, values, values, values,
       st.from_regex(r"[a-z][a-z0-9-]{0,10}", fullmatch=True))
def test_labels_roundtrip(dialect: DialectName, zone, block, rack, nvl, host) -> None:  # type: ignore[no-untyped-def]
    d = PRESETS[dialect]
    path = DomainPath(zone=zone, block=block, rack=rack, nvlink=nvl, host=host)
    back = from_labels(host, to_labels(path, d), d)
    # a dialect keeps exactly the levels it has labels for
    for level in ("zone", "block", "rack", "nvlink"):
        expected = getattr(path, level) if getattr(d, level) else None
        assert getattr(back, level) == expected
    assert back.host == host


def test_gke_dialect_uses_gke_keys() -> None:
    path = DomainPath(zone="us-c1", block="b1", rack="sb1", host="h1")
    labels = to_labels(path, PRESETS[DialectName.GKE])
    assert labels["cloud.google.com/gce-topology-block"] == "b1"
    assert labels["cloud.google.com/gce-topology-subblock"] == "sb1"
    assert labels["cloud.google.com/gce-topology-host"] == "h1"
    assert labels["topology.kubernetes.io/zone"] == "us-c1"


def test_layout_groups_nvl72_racks() -> None:
    nodes = plan_nodes([(load_profile("gb200-nvl72"), 40), (load_profile("hgx-h100"), 5)])
    assert len(nodes) == 45 and len({n.name for n in nodes}) == 45
    racks = {n.path.rack for n in nodes if n.profile == "gb200-nvl72"}
    assert len(racks) == 3  # 18 + 18 + 4
    nvl = {n.path.nvlink for n in nodes if n.profile == "gb200-nvl72"}
    assert len(nvl) == 3
    hgx = [n for n in nodes if n.profile == "hgx-h100"]
    assert len({n.path.nvlink for n in hgx}) == 5  # no cross-node NVLink
    assert len({n.path.rack for n in hgx}) == 2  # 4 per rack
    assert [n.index for n in nodes] == list(range(45))


ATTR_NAME = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z_][A-Za-z0-9_]{0,31}$")


def test_slice_entries_follow_api_rules() -> None:
    for name in bundled_names():
        hw = load_profile(name).hardware()
        path = DomainPath(zone="z", block="b", rack="r", nvlink="n", host="h")
        for place in hw.places():
            e = device_entry(place, path)
            attrs = e["attributes"]
            assert attrs["resource.kubernetes.io/pcieRoot"] == {"string": place.root}
            assert attrs["resource.kubernetes.io/pciBusID"] == {"string": place.device.pci_bus_id}
            assert attrs["resource.kubernetes.io/numaNode"] == {"int": place.numa}
            assert len(attrs) + len(e.get("capacity", {})) <= MAX_ATTRIBUTES
            for key, val in attrs.items():
                assert ATTR_NAME.match(key), key
                assert len(val) == 1 and next(iter(val)) in {"int", "bool", "string", "version"}
                if "string" in val:
                    assert len(val["string"]) <= 64
            if place.device.kind == "gpu":
                assert e["capacity"]["memory"]["value"].endswith("Gi")
