"""CDI spec files: one per claim, 1.1.0, ids vendor/class=name, atomic,
only our own files touched."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toposerve.dra_driver.kubeletplugin.cdi import CdiSpecs, ContainerEdits, DeviceNode


def test_spec_per_claim(tmp_path: Path) -> None:
    cdi = CdiSpecs(tmp_path, "k8s.gpu.toposerve.io", "gpu")
    ids = cdi.write("uid-1", {"gpu-0": ContainerEdits(device_nodes=(DeviceNode("/dev/nvidia0"),)),
                              "gpu-1": ContainerEdits()},
                    ContainerEdits(env={"NVIDIA_VISIBLE_DEVICES": "a,b"}))
    assert ids == {"gpu-0": "k8s.gpu.toposerve.io/gpu=uid-1-gpu-0",
                   "gpu-1": "k8s.gpu.toposerve.io/gpu=uid-1-gpu-1"}
    spec = json.loads(cdi.path("uid-1").read_text())
    assert spec["cdiVersion"] == "1.1.0" and spec["kind"] == "k8s.gpu.toposerve.io/gpu"
    assert spec["containerEdits"] == {"env": ["NVIDIA_VISIBLE_DEVICES=a,b"]}
    assert spec["devices"][0] == {"name": "uid-1-gpu-0", "containerEdits": {
        "deviceNodes": [{"path": "/dev/nvidia0", "permissions": "rw"}]}}
    assert spec["devices"][1]["containerEdits"]  # CDI wants at least one edit
    assert cdi.claims() == {"uid-1"}
    assert cdi.remove("uid-1") and not cdi.remove("uid-1")
    assert cdi.claims() == set()


def test_leftovers_removed_others_kept(tmp_path: Path) -> None:
    cdi = CdiSpecs(tmp_path, "k8s.gpu.toposerve.io", "gpu")
    for uid in ("keep", "stale"):
        cdi.write(uid, {"gpu-0": ContainerEdits(env={"A": "1"})}, ContainerEdits())
    (tmp_path / ".k8s.gpu.toposerve.io_gpu-x.tmp").write_text("{")
    (tmp_path / "nvidia.com_gpu.json").write_text("{}")  # another driver's
    assert cdi.remove_all_but({"keep"}) == ["stale"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "k8s.gpu.toposerve.io_gpu-keep.json", "nvidia.com_gpu.json"]


def test_bad_env_name() -> None:
    with pytest.raises(ValueError, match="not an environment variable name: 1X"):
        ContainerEdits(env={"1X": "y"})
