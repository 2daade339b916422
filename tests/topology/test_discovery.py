"""Discovery of a fake sysfs tree must reproduce the profile exactly, and
must cope with what real trees contain besides our devices."""

import os
from pathlib import Path

import pytest

from toposerve.topology.discovery import discover
from toposerve.topology.model import DeviceKind
from toposerve.topology.profiles import bundled_names, load_profile
from toposerve.topology.sysfs import write_profile_sysfs

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


@pytest.mark.parametrize("name", bundled_names())
def test_fake_tree_roundtrip(name: str, tmp_path: Path) -> None:
    profile = load_profile(name)
    root = write_profile_sysfs(profile, tmp_path / "sys")
    assert discover(root) == profile.hardware()


def test_placement_read_from_real_paths(tmp_path: Path) -> None:
    root = write_profile_sysfs(load_profile("hgx-h100"), tmp_path / "sys")
    link = root / "bus/pci/devices/0000:18:00.0"
    assert link.is_symlink()
    real = Path(os.path.realpath(link))
    assert real.parts[-5:] == ("pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:00.0",
                               "0000:18:00.0")
    assert (root / "class/net/enp25s0/device").resolve().name == "0000:19:00.0"


def test_ignores_virtual_and_foreign_devices(tmp_path: Path) -> None:
    root = write_profile_sysfs(load_profile("mi300x"), tmp_path / "sys")
    # a bridge interface with no device link, and an onboard VGA from another vendor
    (root / "devices/virtual/net/br0").mkdir(parents=True)
    (root / "class/net/br0").symlink_to("../../devices/virtual/net/br0")
    vga = root / "devices/pci0000:00/0000:00:02.0"
    vga.mkdir(parents=True)
    for f, v in (("class", "0x030000"), ("vendor", "0x1a03"), ("device", "0x2000"),
                 ("numa_node", "-1")):
        (vga / f).write_text(v + "\n")
    (root / "bus/pci/devices/0000:00:02.0").symlink_to("../../../devices/pci0000:00/0000:00:02.0")
    assert discover(root) == load_profile("mi300x").hardware()


def test_unknown_accelerator_and_missing_numa(tmp_path: Path) -> None:
    root = tmp_path / "sys"
    dev = root / "devices/pci0000:40/0000:40:01.0/0000:41:00.0"
    dev.mkdir(parents=True)
    for f, v in (("class", "0x030200"), ("vendor", "0x10de"), ("device", "0x9999"),
                 ("numa_node", "-1")):
        (dev / f).write_text(v + "\n")
    (root / "bus/pci/devices").mkdir(parents=True)
    (root / "bus/pci/devices/0000:41:00.0").symlink_to(
        "../../../devices/pci0000:40/0000:40:01.0/0000:41:00.0")
    hw = discover(root)
    [gpu] = hw.devices(DeviceKind.GPU)
    assert gpu.model == "unknown-0x10de-0x9999" and gpu.memory_bytes is None
    place = hw.place("gpu-0")
    assert (place.numa, place.root, place.switch) == (0, "pci0000:40", None)


def test_not_a_sysfs_tree(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not look like a sysfs tree"):
        discover(tmp_path)


def test_generator_refuses_non_empty_dir(tmp_path: Path) -> None:
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(FileExistsError):
        write_profile_sysfs(load_profile("hgx-h100"), tmp_path)
    assert (tmp_path / "x").read_text() == "keep me"
