"""Which allocation results of a claim are ours, and which opaque configs
apply to each (pure: claim JSON in)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pytest

from toposerve.dra_driver.kubeletplugin.claims import ClaimError, allocated_devices
from toposerve.dra_driver.kubeletplugin.device_kind import ClaimRef

REF = ClaimRef(namespace="ns", name="c", uid="u1")
DRIVER = "gpu.toposerve.io"


def _claim(results: list[dict[str, Any]], configs: list[dict[str, Any]] | None = None,
           node: str = "n1") -> dict[str, Any]:
    selector = {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
    return {"metadata": {"uid": "u1"}, "status": {"allocation": {
        "nodeSelector": selector, "devices": {"results": results, "config": configs or []}}}}


def _result(request: str, device: str, driver: str = DRIVER, pool: str = "n1") -> dict[str, Any]:
    return {"request": request, "driver": driver, "pool": pool, "device": device}


def _cfg(source: str, requests: list[str], tag: str, driver: str = DRIVER) -> dict[str, Any]:
    return {"source": source, "requests": requests,
            "opaque": {"driver": driver, "parameters": {"tag": tag}}}


def _devices(claim: dict[str, Any]) -> list[tuple[str, tuple[str, ...]]]:
    got = allocated_devices(claim, REF, DRIVER, "n1", {"n1"}, lambda p: p["tag"])
    return [(d.device, d.configs) for d in got]


def test_ours_only_with_configs_class_first() -> None:
    claim = _claim([_result("a", "gpu-0"), _result("b/small", "gpu-1"),
                    _result("nic", "eth0", driver="net.toposerve.io")],
                   [_cfg("FromClaim", [], "claim-all"), _cfg("FromClass", ["a"], "class-a"),
                    _cfg("FromClaim", ["b"], "claim-b"),
                    _cfg("FromClaim", [], "other", driver="net.toposerve.io")])
    assert _devices(claim) == [("gpu-0", ("class-a", "claim-all")),
                               ("gpu-1", ("claim-all", "claim-b"))]


@pytest.mark.parametrize("claim, message", [
    ({"metadata": {"uid": "other"}}, "UID is other, the kubelet asked for u1"),
    ({"metadata": {"uid": "u1"}, "status": {}}, "is not allocated"),
    (_claim([_result("a", "gpu-0")], node="n2"), "allocated for another node, not n1"),
    (_claim([_result("a", "gpu-0", pool="n2")]), "no allocation result for driver"),
    (_claim([_result("a", "eth0", driver="net.toposerve.io")]), "no allocation result"),
])
def test_not_ours(claim: dict[str, Any], message: str) -> None:
    with pytest.raises(ClaimError, match=message):
        _devices(claim)


def test_bad_config_names_its_source() -> None:
    def validate(p: Mapping[str, Any]) -> str:
        raise ValueError("nicAlignment: bad")
    claim = _claim([_result("a", "gpu-0")], [_cfg("FromClass", [], "x")])
    with pytest.raises(ClaimError, match=r"opaque config #0 \(from the class\) is invalid: "
                                         "nicAlignment: bad"):
        allocated_devices(claim, REF, DRIVER, "n1", {"n1"}, validate)
