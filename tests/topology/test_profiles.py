from pathlib import Path
from typing import Any

import pytest
import yaml

from toposerve.topology.config_file import ConfigError, load_file
from toposerve.topology.distance import device_affinity
from toposerve.topology.model import Affinity, DeviceKind
from toposerve.topology.profiles import HardwareProfile, bundled_names, load_profile

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


def test_bundled_profiles_present() -> None:
    assert {"hgx-h100", "gb200-nvl72", "mi300x"} <= set(bundled_names())


def test_hgx_shape() -> None:
    hw = load_profile("hgx-h100").hardware()
    assert len(hw.numa_nodes) == 2
    switches = [sw for n in hw.numa_nodes for r in n.roots for sw in r.switches]
    assert len(switches) == 4
    for sw in switches:
        kinds = sorted(d.kind for d in sw.devices)
        assert kinds == [DeviceKind.GPU, DeviceKind.GPU, DeviceKind.NIC, DeviceKind.NIC]
    assert len(hw.devices(DeviceKind.GPU)) == 8 and len(hw.devices(DeviceKind.NIC)) == 8
    assert all(d.memory_bytes == 80 * 2**30 for d in hw.devices(DeviceKind.GPU))
    assert all(d.rdma_device and d.speed_mbps == 400_000 for d in hw.devices(DeviceKind.NIC))
    # gpu-0 and nic-0 share a switch; gpu-0 and gpu-7 sit on different sockets
    assert device_affinity(hw, "gpu-0", "nic-0") == Affinity.SAME_SWITCH
    assert device_affinity(hw, "gpu-0", "gpu-2") == Affinity.SAME_NUMA
    assert device_affinity(hw, "gpu-0", "gpu-7") == Affinity.SAME_NODE


def test_nvl72_grouping_is_a_rack_of_18() -> None:
    p = load_profile("gb200-nvl72")
    assert p.spec.grouping.nodes_per_nvlink_domain == 18
    assert len(p.hardware().devices(DeviceKind.GPU)) == 4


def test_mi300x_shape() -> None:
    hw = load_profile("mi300x").hardware()
    assert len(hw.devices(DeviceKind.GPU)) == 8 and len(hw.devices(DeviceKind.NIC)) == 8
    assert all(len(sw.devices) == 2 for n in hw.numa_nodes for r in n.roots for sw in r.switches)


def test_device_names_and_buses_unique() -> None:
    for name in bundled_names():
        places = load_profile(name).hardware().places()
        assert len({p.device.name for p in places}) == len(places)
        assert len({p.device.pci_bus_id for p in places}) == len(places)
        ifaces = [p.device.interface for p in places if p.device.interface]
        assert len(set(ifaces)) == len(ifaces)


def _profile_doc(name: str = "hgx-h100") -> dict[str, Any]:
    text = (Path(__file__).parents[2] / "topology/profiles" / f"{name}.yaml").read_text()
    doc: dict[str, Any] = yaml.safe_load(text)
    return doc


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(doc))
    return f


def test_unknown_field_is_named(tmp_path: Path) -> None:
    doc = _profile_doc()
    doc["spec"]["grouping"]["nodesPerRak"] = 3
    with pytest.raises(ConfigError) as err:
        load_file(_write(tmp_path, doc), HardwareProfile, "HardwareProfile")
    msg = str(err.value)
    assert "spec.grouping.nodesPerRak" in msg and "did you mean nodesPerRack?" in msg
    doc["spec"]["grouping"]["zzz"] = doc["spec"]["grouping"].pop("nodesPerRak")
    with pytest.raises(ConfigError) as err:
        load_file(_write(tmp_path, doc), HardwareProfile, "HardwareProfile")
    msg = str(err.value)
    assert "spec.grouping.zzz" in msg and "remove it or check its spelling" in msg


def test_non_monotonic_tiers_rejected(tmp_path: Path) -> None:
    doc = _profile_doc()
    doc["spec"]["tiers"]["zone"]["bandwidthGBps"] = 500
    with pytest.raises(ConfigError, match="zone must not be cheaper than block"):
        load_file(_write(tmp_path, doc), HardwareProfile, "HardwareProfile")


def test_unknown_model_key_rejected(tmp_path: Path) -> None:
    doc = _profile_doc()
    doc["spec"]["numaNodes"][0]["roots"][0]["switches"][0].append("tpu")
    with pytest.raises(ConfigError, match=r"'tpu'.*not a key of spec\.models"):
        load_file(_write(tmp_path, doc), HardwareProfile, "HardwareProfile")


def test_wrong_kind_and_version(tmp_path: Path) -> None:
    doc = _profile_doc()
    doc["kind"] = "Profile"
    with pytest.raises(ConfigError, match="kind: expected 'HardwareProfile'"):
        load_file(_write(tmp_path, doc), HardwareProfile, "HardwareProfile")
    doc["kind"], doc["apiVersion"] = "HardwareProfile", "v1"
    with pytest.raises(ConfigError, match=r"apiVersion: expected 'toposerve\.io/v1'"):
        load_file(_write(tmp_path, doc), HardwareProfile, "HardwareProfile")


def test_unsorted_roots_rejected(tmp_path: Path) -> None:
    doc = _profile_doc()
    roots = doc["spec"]["numaNodes"][0]["roots"]
    roots.reverse()
    with pytest.raises(ConfigError, match="ascending bus"):
        load_file(_write(tmp_path, doc), HardwareProfile, "HardwareProfile")


def test_profile_file_by_path(tmp_path: Path) -> None:
    doc = _profile_doc("mi300x")
    doc["metadata"]["name"] = "my-node"
    p = load_profile(str(_write(tmp_path, doc)))
    assert p.name == "my-node"


def test_unknown_profile_lists_choices() -> None:
    with pytest.raises(ConfigError, match="choose one of gb200-nvl72, hgx-h100, mi300x"):
        load_profile("h100")


def test_not_yaml(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("a: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_file(f, HardwareProfile, "HardwareProfile")
