"""``status.devices[]`` of a claim, written by server-side apply with the
driver name as field manager: each apply states the whole of what this
driver says about the claim, so applying an empty list takes back exactly
our entries and leaves other drivers' alone.

RBAC (1.37, DRAResourceClaimGranularStatusAuthorization on): ``patch`` on
``resourceclaims/status`` plus ``associated-node:patch`` on the synthetic
``resourceclaims/driver`` with ``resourceNames: [<driver>]`` for a driver
pod on the claim's node (``arbitrary-node:patch`` for any other caller).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from toposerve.dra_driver.kubeletplugin.claims import read_claim
from toposerve.dra_driver.kubeletplugin.device_kind import ClaimRef
from toposerve.kubeapi.typed import ApiClient, ApiException, ResourceV1Api

APPLY = "application/apply-patch+yaml"  # JSON is YAML, so the body is JSON
# What the apiserver (1.37) answers to any status write of a claim whose
# opaque parameters were sent in another spelling than its own compact,
# sorted-key JSON (Python's json.dumps, say): the scheduler copied those
# bytes into status.allocation, and the re-encoded allocation reads as a
# change. An apply and a JSON Patch are refused alike.
ALLOCATION_REENCODED = "field cannot be modified once set"


class UnwritableClaim(Exception):
    """A claim whose status the apiserver refuses to change at all."""


@dataclass(frozen=True)
class DeviceStatus:
    pool: str
    device: str
    ready: bool = True
    reason: str = "Prepared"
    message: str = ""
    data: Mapping[str, Any] = field(default_factory=dict)
    share_id: str | None = None
    network_data: Mapping[str, Any] = field(default_factory=dict)


def stamp(now: dt.datetime) -> str:
    """A condition's ``lastTransitionTime`` (RFC 3339, seconds, UTC)."""
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def apply_body(driver: str, claim: ClaimRef, devices: Sequence[DeviceStatus],
               now: dt.datetime) -> dict[str, Any]:
    entries = []
    for d in devices:
        entry: dict[str, Any] = {
            "driver": driver, "pool": d.pool, "device": d.device,
            "conditions": [{"type": "Ready", "status": "True" if d.ready else "False",
                            "reason": d.reason, "message": d.message,
                            "lastTransitionTime": stamp(now)}],
        }
        if d.data:
            entry["data"] = dict(d.data)
        if d.network_data:
            entry["networkData"] = dict(d.network_data)
        if d.share_id is not None:
            entry["shareID"] = d.share_id
        entries.append(entry)
    return status_body(claim, entries)


def status_body(claim: ClaimRef, entries: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The apply of ``status.devices`` = ``entries``. metadata.uid makes it
    a precondition: a recreated claim of the same name is refused (409)
    instead of getting this claim's status."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": claim.name, "namespace": claim.namespace, "uid": claim.uid},
            "status": {"devices": [dict(e) for e in entries]}}


def apply_device_status(api: ApiClient, driver: str, claim: ClaimRef,
                        devices: Sequence[DeviceStatus], now: dt.datetime | None = None) -> bool:
    """Apply this driver's entries; False when the claim is gone (deleted,
    or replaced by one with another UID). Other API errors raise."""
    return apply_status(api, driver, apply_body(driver, claim, devices,
                                                now or dt.datetime.now(dt.UTC)))


def apply_status(api: ApiClient, manager: str, body: dict[str, Any]) -> bool:
    """Server-side apply of a ``status_body`` under field manager
    ``manager``; False when the claim is gone. Other API errors raise."""
    meta = body["metadata"]
    try:
        ResourceV1Api(api).patch_namespaced_resource_claim_status(
            meta["name"], meta["namespace"], body, field_manager=manager, force=True,
            _content_type=APPLY, _preload_content=False, _request_timeout=20)
    except ApiException as err:
        if err.status in (404, 409):
            return False
        if err.status == 422 and ALLOCATION_REENCODED in (err.body or ""):
            raise UnwritableClaim(
                f"the apiserver refuses every status update of claim {meta['namespace']}/"
                f"{meta['name']} ({meta['uid']}): its opaque "
                "config parameters were sent in another JSON spelling than the apiserver's "
                "(spaces, or keys not sorted) and were copied so into status.allocation; "
                "create the claim with kubectl or with compact, key-sorted JSON") from err
        raise
    return True


def clear_device_status(api: ApiClient, driver: str, claim: ClaimRef) -> bool:
    """Take back this driver's entries, if the claim still has any; False
    when there was nothing to do. A deallocated claim has no node a driver
    pod is associated with, so only an apply that changes something is sent."""
    doc = read_claim(api, claim)
    if doc is None:
        return False
    if (doc.get("metadata") or {}).get("uid") != claim.uid:
        return False
    if not any(d.get("driver") == driver for d in (doc.get("status") or {}).get("devices") or []):
        return False
    return apply_device_status(api, driver, claim, [])
