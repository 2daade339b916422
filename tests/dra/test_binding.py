"""Binding conditions as pure decisions (``kubeletplugin.binding``, the NIC
and GPU readiness): which claims wait on us, what each device's readiness
makes us write, when a failure counts, and what the slices carry."""

from __future__ import annotations

import datetime as dt
from typing import Any

from toposerve.dra_driver.gpu.binding import CONDITIONS as GPU
from toposerve.dra_driver.gpu.binding import fabric_readiness
from toposerve.dra_driver.gpu.nvml import Fabric
from toposerve.dra_driver.kubeletplugin.binding import (
    Readiness,
    State,
    desired,
    outcomes,
    settle,
    tracked,
    with_binding_conditions,
)
from toposerve.dra_driver.net.binding import CONDITIONS as NET
from toposerve.dra_driver.net.binding import link_readiness
from toposerve.dra_driver.net.discovery import LinkInfo, Nic, PciNic
from toposerve.dra_driver.resourceslice import Pool

DRIVER = "net.toposerve.io"
NODE = "node-a"
NOW = dt.datetime(2026, 12, 7, 3, 0, 0, tzinfo=dt.UTC)
READY = Readiness(State.READY, "LinkUp", "eth1 is up")
PENDING = Readiness(State.PENDING, "LinkNotUp", "eth1 is not brought up")
FAILED = Readiness(State.FAILED, "LinkDown", "eth1 is up but has no carrier")


def _result(device: str, driver: str = DRIVER, conditions: bool = True) -> dict[str, Any]:
    r: dict[str, Any] = {"request": "nic", "driver": driver, "pool": NODE, "device": device}
    if conditions:
        r.update(bindingConditions=[NET.ready], bindingFailureConditions=[NET.failed])
    return r


def _claim(*results: dict[str, Any], node: str = NODE,
           devices: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "c", "uid": "u-1"},
            "status": {"allocation": {
                "devices": {"results": list(results)},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
                "devices": devices or []}}


def _shown(device: str, **status: str) -> dict[str, Any]:
    return {"driver": DRIVER, "pool": NODE, "device": device, "conditions": [
        {"type": t, "status": s, "reason": "R", "message": "",
         "lastTransitionTime": "2026-12-07T02:00:00Z"} for t, s in status.items()]}


def _conds(entries: list[dict[str, Any]], device: str) -> dict[str, tuple[str, str]]:
    [e] = [e for e in entries if e["device"] == device]
    return {c["type"]: (c["status"], c["reason"]) for c in e["conditions"]}


def test_only_undecided_results_of_ours_on_this_node_are_tracked() -> None:
    t = tracked(_claim(_result("pci-a"), _result("gpu-0", driver="gpu.toposerve.io"),
                       _result("pci-b", conditions=False)), DRIVER, NODE)
    assert t is not None and [w.device for w in t.devices] == ["pci-a"]
    assert t.devices[0].ready == (NET.ready,) and t.devices[0].failed == (NET.failed,)
    assert str(t.ref) == "ns/c (u-1)"
    assert tracked(_claim(_result("pci-a"), node="node-b"), DRIVER, NODE) is None
    assert tracked(_claim(_result("pci-a", conditions=False)), DRIVER, NODE) is None
    unallocated = _claim(_result("pci-a"))
    unallocated["status"] = {}
    assert tracked(unallocated, DRIVER, NODE) is None
    # decided either way: nothing left to do
    ready = _claim(_result("pci-a"), devices=[_shown("pci-a", **{NET.ready: "True"})])
    failed = _claim(_result("pci-a"), devices=[_shown("pci-a", **{NET.failed: "True",
                                                                  NET.ready: "False"})])
    assert tracked(ready, DRIVER, NODE) is None and tracked(failed, DRIVER, NODE) is None


def test_each_readiness_writes_its_conditions() -> None:
    t = tracked(_claim(_result("pci-a"), _result("pci-b"), _result("pci-c")), DRIVER, NODE)
    assert t is not None
    entries = desired(t, DRIVER, {"pci-a": READY, "pci-b": PENDING, "pci-c": FAILED}, NOW)
    assert entries is not None
    assert _conds(entries, "pci-a") == {NET.ready: ("True", "LinkUp"),
                                        NET.failed: ("False", "LinkUp")}
    assert _conds(entries, "pci-b") == {NET.ready: ("False", "LinkNotUp"),
                                        NET.failed: ("False", "LinkNotUp")}
    assert _conds(entries, "pci-c") == {NET.ready: ("False", "LinkDown"),
                                        NET.failed: ("True", "LinkDown")}
    assert all(c["lastTransitionTime"] == "2026-12-07T03:00:00Z"
               for e in entries for c in e["conditions"])
    assert sorted(outcomes(t, entries)) == ["failed", "ready"]


def test_a_device_the_kind_does_not_know_has_failed() -> None:
    t = tracked(_claim(_result("pci-a")), DRIVER, NODE)
    assert t is not None
    entries = desired(t, DRIVER, {}, NOW)
    assert entries is not None and _conds(entries, "pci-a")[NET.failed] == ("True", "DeviceGone")


def test_nothing_is_written_when_the_claim_shows_it_already() -> None:
    t = tracked(_claim(_result("pci-a")), DRIVER, NODE)
    assert t is not None
    first = desired(t, DRIVER, {"pci-a": PENDING}, NOW)
    assert first is not None
    again = tracked(_claim(_result("pci-a"), devices=[{**first[0]}]), DRIVER, NODE)
    assert again is not None
    assert desired(again, DRIVER, {"pci-a": PENDING}, NOW + dt.timedelta(seconds=5)) is None
    # ready now: written, the ready condition's time moves, the failure one's does not
    later = NOW + dt.timedelta(seconds=9)
    entries = desired(again, DRIVER, {"pci-a": READY}, later)
    assert entries is not None
    times = {c["type"]: c["lastTransitionTime"] for c in entries[0]["conditions"]}
    assert times == {NET.ready: "2026-12-07T03:00:09Z", NET.failed: "2026-12-07T03:00:00Z"}


def test_a_decided_device_keeps_what_it_shows_beside_an_undecided_one() -> None:
    shown = _shown("pci-a", **{NET.ready: "True", NET.failed: "False"})
    t = tracked(_claim(_result("pci-a"), _result("pci-b"), devices=[shown]), DRIVER, NODE)
    assert t is not None
    # pci-a went down since: the scheduler may be binding on it, it stays as it was
    entries = desired(t, DRIVER, {"pci-a": FAILED, "pci-b": READY}, NOW)
    assert entries is not None
    assert _conds(entries, "pci-a") == {NET.ready: ("True", "R"), NET.failed: ("False", "R")}
    assert outcomes(t, entries) == ["ready"]


def test_share_ids_key_the_entries() -> None:
    r = {**_result("pci-a"), "shareID": "0b5b6f2e-3c2f-4c7b-8f55-1b1b0b1f0a01"}
    t = tracked(_claim(r), DRIVER, NODE)
    assert t is not None
    entries = desired(t, DRIVER, {"pci-a": READY}, NOW)
    assert entries is not None and entries[0]["shareID"] == r["shareID"]


def test_a_failure_counts_once_it_has_lasted() -> None:
    assert settle(FAILED, 100.0, 105.0, 10.0).state == State.PENDING
    waiting = settle(FAILED, 100.0, 105.0, 10.0)
    assert waiting.reason == "LinkDown" and "fails if this lasts 10s" in waiting.message
    assert waiting == settle(FAILED, 100.0, 109.0, 10.0)  # same words: no rewrite
    assert settle(FAILED, 100.0, 110.0, 10.0) == FAILED
    assert settle(FAILED, 100.0, 100.0, 0.0) == FAILED
    assert settle(READY, None, 105.0, 10.0) == READY


def test_binding_fields_on_the_devices_they_apply_to() -> None:
    pool = Pool(name=NODE, node_name=NODE, devices=({"name": "a"}, {"name": "b"}))
    got = with_binding_conditions(pool, GPU, lambda d: d["name"] == "a")
    assert got.devices == (
        {"name": "a", "bindsToNode": True, "bindingConditions": ["gpu.toposerve.io/FabricReady"],
         "bindingFailureConditions": ["gpu.toposerve.io/FabricFailed"]},
        {"name": "b"})
    assert with_binding_conditions(pool, NET).devices[1]["bindingConditions"] == [
        "net.toposerve.io/LinkReady"]


def _nic(state: str | None, admin_up: bool = True) -> Nic:
    pci = PciNic(bdf="0000:17:00.0", vendor="0x15b3", device="0x1021", numa=0,
                 root="pci0000:15", switch=None, netdevs=("eth1",))
    link = None if state is None else LinkInfo(
        name="eth1", index=4, mac="02:00:00:00:00:01", mtu=1500, state=state,
        encapsulation="ether", kind=None, loopback=False, admin_up=admin_up)
    return Nic(name="pci-0000-17-00-0", pci=pci, link=link, if_name="eth1")


def test_link_readiness() -> None:
    assert link_readiness(_nic("up")).state == State.READY
    assert link_readiness(_nic("unknown")).state == State.READY
    assert link_readiness(_nic("down", admin_up=False)) == Readiness(
        State.PENDING, "LinkNotUp", "eth1 is not brought up (ip link set eth1 up)")
    assert link_readiness(_nic(None)).reason == "NicAway"
    for carrierless in ("down", "lowerlayerdown", "dormant"):
        r = link_readiness(_nic(carrierless))
        assert (r.state, r.reason) == (State.FAILED, "LinkDown"), carrierless
    assert link_readiness(None).reason == "NicGone"
    gone = link_readiness(_nic("up"), present=False)
    assert (gone.state, gone.message) == (State.FAILED, "0000:17:00.0 is no longer on this node")


def test_fabric_readiness() -> None:
    assert fabric_readiness("gpu-0", Fabric(3, 0)).state == State.READY
    assert fabric_readiness("gpu-0", Fabric(1, 0)) == Readiness(
        State.PENDING, "FabricRegistering", "gpu-0: NVLink fabric registration has not started")
    assert fabric_readiness("gpu-0", Fabric(2, 0)).state == State.PENDING
    failed = fabric_readiness("gpu-0", Fabric(3, 999, "Unknown Error"))
    assert (failed.state, failed.reason) == (State.FAILED, "FabricRegistrationFailed")
    assert "Unknown Error" in failed.message
    assert fabric_readiness("gpu-0", None).reason == "NoFabric"
    lost = fabric_readiness("gpu-0", Fabric(3, 0), "gpu.toposerve.io/gpu-lost")
    assert (lost.state, lost.reason) == (State.FAILED, "GpuUnavailable")
