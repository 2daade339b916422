"""The checkpoint: atomic, checksummed, boot-scoped, and a corrupt one is
reported and left where it is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toposerve.dra_driver.kubeletplugin.checkpoint import (
    Checkpoint,
    CheckpointData,
    ClaimEntry,
    ClaimState,
    CorruptCheckpoint,
    PreparedDevice,
)


def _data() -> CheckpointData:
    return CheckpointData(boot_id="boot-a", claims={"uid-1": ClaimEntry(
        namespace="ns", name="c", state=ClaimState.PREPARE_COMPLETED,
        devices=[PreparedDevice(requests=["gpu"], pool="node", device="gpu-0",
                                cdi_device_ids=["k8s.gpu.toposerve.io/gpu=uid-1-gpu-0"])])})


def test_round_trip_and_no_temp_files(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "checkpoint.json", "boot-a")
    assert cp.load() == (CheckpointData(boot_id="boot-a"), False)
    cp.save(_data())
    assert cp.load() == (_data(), False)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]
    doc = json.loads((tmp_path / "checkpoint.json").read_text())
    assert doc["version"] == 1 and doc["checksum"].startswith("sha256:")
    assert doc["data"]["bootId"] == "boot-a"


def test_another_boot_is_flagged(tmp_path: Path) -> None:
    Checkpoint(tmp_path / "c.json", "boot-a").save(_data())
    data, other_boot = Checkpoint(tmp_path / "c.json", "boot-b").load()
    assert other_boot and "uid-1" in data.claims


@pytest.mark.parametrize("mangle, why", [
    (lambda s: s[: len(s) // 2], "not JSON"),
    (lambda s: s.replace('"gpu-0"', '"gpu-1"'), "checksum mismatch"),
    (lambda s: s.replace('"version": 1', '"version": 7'), "version 7"),
    (lambda s: s.replace('"PrepareCompleted"', '"Sideways"'), "data.claims.uid-1.state"),
])
def test_corrupt_is_reported_and_kept(tmp_path: Path, mangle: object, why: str) -> None:
    path = tmp_path / "c.json"
    cp = Checkpoint(path, "boot-a")
    cp.save(_data())
    bad = mangle(path.read_text())  # type: ignore[operator]
    path.write_text(bad)
    with pytest.raises(CorruptCheckpoint) as err:
        cp.load()
    assert why in str(err.value) and str(path) in str(err.value)
    assert path.read_text() == bad  # never silently replaced


def test_interrupted_write_leaves_old_file_and_temp_is_cleaned(tmp_path: Path) -> None:
    cp = Checkpoint(tmp_path / "c.json", "boot-a")
    cp.save(_data())
    (tmp_path / ".checkpoint-abc.tmp").write_text("{half")  # a crash mid-write
    assert cp.load()[0] == _data()
    assert cp.remove_temp_files() == 1
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]
