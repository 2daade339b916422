"""The committed stubs are what ``make protos`` makes from the protos, and
the protos say what the kubelet 1.37 speaks (docs/design.md §4)."""

from __future__ import annotations

from pathlib import Path

import pytest

from toposerve.dra_driver._generated import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    health_v1_pb2,
    health_v1alpha1_pb2,
    pluginregistration_pb2,
)
from toposerve.dra_driver.protos.generate import OUT_DIR, generate


def test_committed_stubs_are_current(tmp_path: Path) -> None:
    fresh = {p.name: p.read_text() for p in generate(tmp_path)}
    committed = {p.name: p.read_text() for p in OUT_DIR.iterdir() if p.is_file()}
    stale = sorted(n for n in fresh if committed.get(n) != fresh[n])
    extra = sorted(set(committed) - set(fresh))
    assert not stale and not extra, (
        f"dra_driver/_generated is stale (differs: {stale}, not generated: {extra}): "
        "run `make protos` and commit the result")


@pytest.mark.parametrize("module, service", [
    (pluginregistration_pb2, "pluginregistration.Registration"),
    (dra_v1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin"),
    (dra_v1beta1_pb2, "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin"),
    (health_v1_pb2, "v1.DRAResourceHealth"),
    (health_v1alpha1_pb2, "v1alpha1.DRAResourceHealth"),
])
def test_service_names(module: object, service: str) -> None:
    services = module.DESCRIPTOR.services_by_name  # type: ignore[attr-defined]
    assert [s.full_name for s in services.values()] == [service]


def _fields(module: object, message: str) -> dict[str, int]:
    desc = module.DESCRIPTOR.message_types_by_name[message]  # type: ignore[attr-defined]
    return {f.name: f.number for f in desc.fields}


def test_field_numbers() -> None:
    assert _fields(pluginregistration_pb2, "PluginInfo") == {
        "type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
    assert _fields(pluginregistration_pb2, "RegistrationStatus") == {
        "plugin_registered": 1, "error": 2}
    for mod in (dra_v1_pb2, dra_v1beta1_pb2):
        assert _fields(mod, "Claim") == {"namespace": 1, "uid": 2, "name": 3}
        assert _fields(mod, "NodePrepareResourceResponse") == {"devices": 1, "error": 2}
        assert _fields(mod, "NodeUnprepareResourceResponse") == {"error": 1}
    base = {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4}
    assert _fields(dra_v1_pb2, "Device") == {**base, "share_id": 5}
    assert _fields(dra_v1beta1_pb2, "Device") == base
    for mod in (health_v1_pb2, health_v1alpha1_pb2):
        assert _fields(mod, "DeviceHealth") == {
            "device": 1, "health": 2, "last_updated_time": 3,
            "health_check_timeout_seconds": 4, "message": 5}
        assert _fields(mod, "DeviceIdentifier") == {"pool_name": 1, "device_name": 2}
        enum = mod.DESCRIPTOR.enum_types_by_name["HealthStatus"]
        assert {v.name: v.number for v in enum.values} == {
            "UNKNOWN": 0, "HEALTHY": 1, "UNHEALTHY": 2}
