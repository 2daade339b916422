"""CDI spec files: one per claim, 1.1.0, ids vendor/class=name, atomic,
only our own files touched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toposerve.dra_driver.kubeletplugin.cdi import CdiSpecs, ContainerEdits, DeviceNode
from toposerve.dra_driver.kubeletplugin.validation import InvalidName

UID = "0b7c5a56-0d0e-4f43-9a57-4f1d0a6f2a01"
KEEP, STALE = "0b7c5a56-0d0e-4f43-9a57-4f1d0a6f2a02", "0b7c5a56-0d0e-4f43-9a57-4f1d0a6f2a03"


def test_spec_per_claim(tmp_path: Path) -> None:
    cdi = CdiSpecs(tmp_path, "k8s.gpu.toposerve.io", "gpu")
    ids = cdi.write(UID, {"gpu-0": ContainerEdits(device_nodes=(DeviceNode("/dev/nvidia0"),)),
                              "gpu-1": ContainerEdits()},
                    ContainerEdits(env={"NVIDIA_VISIBLE_DEVICES": "a,b"}))
    assert ids == {"gpu-0": f"k8s.gpu.toposerve.io/gpu={UID}-gpu-0",
                   "gpu-1": f"k8s.gpu.toposerve.io/gpu={UID}-gpu-1"}
    spec = json.loads(cdi.path(UID).read_text())
    assert spec["cdiVersion"] == "1.1.0" and spec["kind"] == "k8s.gpu.toposerve.io/gpu"
    assert spec["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=a,b"]}
    assert spec["devices"][0] == {"name": f"{UID}-gpu-0", "containerEdits": {
        "deviceNodes": [{"path": "/dev/nvidia0", "permissions": "rw"}]}}
    assert spec["devices"][1]["containerEdits"]  # CDI wants at least one edit
    assert cdi.claims() == {UID}
    assert cdi.remove(UID) and not cdi.remove(UID)
    assert cdi.claims() == set()


def test_leftovers_removed_others_kept(tmp_path: Path) -> None:
    cdi = CdiSpecs(tmp_path, "k8s.gpu.toposerve.io", "gpu")
    for uid in (KEEP, STALE):
        cdi.write(uid, {"gpu-0": ContainerEdits(env={"A": "1"})}, ContainerEdits())
    (tmp_path / ".k8s.gpu.toposerve.io_gpu-x.tmp").write_text("{")
    (tmp_path / "nvidia.com_gpu.json").write_text("{}")  # another driver's
    (tmp_path / "k8s.gpu.toposerve.io_gpu-uid-1.json").write_text("{}")  # an older driver's
    assert cdi.remove_all_but({KEEP}) == sorted([STALE, "uid-1"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"k8s.gpu.toposerve.io_gpu-{KEEP}.json", "nvidia.com_gpu.json"]


@pytest.mark.parametrize("uid, device", [
    ("x/../../escaped", "gpu-0"), ("../../escaped", "gpu-0"), ("a" * 300, "gpu-0"),
    (UID[:-1] + "\x00", "gpu-0"), (UID, "../../../escaped"), (UID, "gpu-0/../../x"),
])
def test_a_bad_uid_or_device_never_names_a_file(tmp_path: Path, uid: str, device: str) -> None:
    root = tmp_path / "cdi"
    cdi = CdiSpecs(root, "k8s.gpu.toposerve.io", "gpu")
    with pytest.raises(InvalidName):
        cdi.write(uid, {device: ContainerEdits(env={"A": "1"})}, ContainerEdits())
    if uid != UID:
        with pytest.raises(InvalidName):
            cdi.remove(uid)
    assert list(tmp_path.rglob("*")) == []  # nothing written, in the root or beside it


def test_bad_env_name() -> None:
    with pytest.raises(ValueError, match="not an environment variable name: 1X"):
        ContainerEdits(env={"1X": "y"})
