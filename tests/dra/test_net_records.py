"""Hand-off records: one atomic file a claim, found by pod, removed idempotently,
and a bad one reported with its path."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toposerve.dra_driver.net.config import NetConfig
from toposerve.dra_driver.net.records import (
    ClaimRecord,
    CorruptRecord,
    NicHandoff,
    all_records,
    read_record,
    record_path,
    records_for_pod,
    remove_record,
    remove_stale,
    write_record,
)

UID_A = "0b7c5a56-0d0e-4f43-9a57-4f1d0a6f2a01"
UID_B = "0b7c5a56-0d0e-4f43-9a57-4f1d0a6f2a02"


def _rec(uid: str, pods: list[str]) -> ClaimRecord:
    cfg = NetConfig.model_validate({"interfaceName": "net1", "addresses": ["198.18.0.2/24"]})
    return ClaimRecord(claimUid=uid, claim="ns/c", podUids=pods, nics=[
        NicHandoff(device="nic-0000-17-00-0", hostIfName="ens1f0", pciAddress="0000:17:00.0",
                   config=cfg, rdmaDevice="mlx5_0")])


def test_round_trip_by_claim_and_by_pod(tmp_path: Path) -> None:
    write_record(tmp_path, _rec(UID_A, ["pod-1"]))
    write_record(tmp_path, _rec(UID_B, ["pod-1", "pod-2"]))
    assert read_record(tmp_path, UID_A) == _rec(UID_A, ["pod-1"])
    assert [r.claimUid for r in records_for_pod(tmp_path, "pod-1")] == [UID_A, UID_B]
    assert [r.claimUid for r in records_for_pod(tmp_path, "pod-2")] == [UID_B]
    assert records_for_pod(tmp_path, "pod-3") == []
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{UID_A}.json", f"{UID_B}.json"]


def test_rewrite_replaces_and_remove_is_idempotent(tmp_path: Path) -> None:
    write_record(tmp_path, _rec(UID_A, []))
    write_record(tmp_path, _rec(UID_A, ["pod-1"]))
    assert records_for_pod(tmp_path, "pod-1") == [_rec(UID_A, ["pod-1"])]
    remove_record(tmp_path, UID_A)
    remove_record(tmp_path, UID_A)
    remove_record(tmp_path / "never-made", UID_A)
    assert read_record(tmp_path, UID_A) is None and all_records(tmp_path / "never-made") == []


def test_uid_cannot_name_another_path(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a Kubernetes UID"):
        record_path(tmp_path, "../etc/passwd")


def test_remove_stale_keeps_prepared_claims_and_drops_temp_files(tmp_path: Path) -> None:
    write_record(tmp_path, _rec(UID_A, ["pod-1"]))
    write_record(tmp_path, _rec(UID_B, ["pod-2"]))
    (tmp_path / f".{UID_B}-x.tmp").write_text("{half")
    assert remove_stale(tmp_path, {UID_A}) == [UID_B]
    assert [p.name for p in tmp_path.iterdir()] == [f"{UID_A}.json"]


@pytest.mark.parametrize("mangle, why", [
    (lambda s: s[: len(s) // 2], "not JSON"),
    (lambda s: s.replace('"version": 1', '"version": 9'), "version 9"),
    (lambda s: s.replace('"hostIfName"', '"hostIfNam"'), "nics.0.hostIfName"),
    (lambda s: s.replace(UID_A, UID_B), f"it holds claim {UID_B}"),
])
def test_corrupt_record_names_its_file(tmp_path: Path, mangle: object, why: str) -> None:
    write_record(tmp_path, _rec(UID_A, ["pod-1"]))
    path = tmp_path / f"{UID_A}.json"
    bad = mangle(path.read_text())  # type: ignore[operator]
    path.write_text(bad)
    with pytest.raises(CorruptRecord) as err:
        records_for_pod(tmp_path, "pod-1")
    assert why in str(err.value) and str(path) in str(err.value)
    assert path.read_text() == bad


def test_file_is_versioned_json(tmp_path: Path) -> None:
    write_record(tmp_path, _rec(UID_A, ["pod-1"]))
    doc = json.loads((tmp_path / f"{UID_A}.json").read_text())
    assert doc["version"] == 1
    assert doc["record"]["nics"][0]["config"]["addresses"] == ["198.18.0.2/24"]
