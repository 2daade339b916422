"""Fetching the ResourceClaims the kubelet names and checking that each is
really ours to prepare. Every failure is a ``ClaimError`` for that claim
alone: the other claims of the same call proceed.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

from toposerve.dra_driver.kubeletplugin import validation
from toposerve.dra_driver.kubeletplugin.device_kind import AllocatedDevice, ClaimRef
from toposerve.kubeapi.typed import ApiClient, ApiException, ResourceV1Api


class ClaimError(Exception):
    """Preparing or unpreparing one claim failed; the message goes to the kubelet."""


def read_claim(api: ApiClient, ref: ClaimRef) -> dict[str, Any] | None:
    """The claim as the apiserver returned it (camelCase JSON); None when
    there is none of that name. Other API errors raise ``ApiException``."""
    try:
        resp: Any = ResourceV1Api(api).read_namespaced_resource_claim(
            ref.name, ref.namespace, _preload_content=False, _request_timeout=20)
    except ApiException as err:
        if err.status == 404:
            return None
        raise
    doc: dict[str, Any] = json.loads(resp.data)
    return doc


def fetch_claim(api: ApiClient, ref: ClaimRef) -> dict[str, Any]:
    try:
        doc = read_claim(api, ref)
    except ApiException as err:
        raise ClaimError(f"get claim {ref.namespace}/{ref.name}: {err.status} {err.reason}") \
            from None
    if doc is None:
        raise ClaimError(f"claim {ref.namespace}/{ref.name} not found")
    return doc


def reserved_pods(claim: Mapping[str, Any]) -> tuple[str, ...]:
    """UIDs of the pods in the claim's ``status.reservedFor``."""
    return tuple(r["uid"] for r in (claim.get("status") or {}).get("reservedFor") or []
                 if r.get("resource") == "pods" and not r.get("apiGroup") and r.get("uid"))


def selects_node(node_selector: Mapping[str, Any] | None, node_name: str) -> bool:
    """False only when the allocation pins nodes by name and ours is not one."""
    if not node_selector:
        return True
    names: set[str] = set()
    for term in node_selector.get("nodeSelectorTerms") or []:
        for req in term.get("matchFields") or []:
            if req.get("key") == "metadata.name" and req.get("operator") == "In":
                names.update(req.get("values") or [])
    return not names or node_name in names


def _applies(config_requests: list[str], request: str) -> bool:
    """A config without requests applies to all; one naming ``r`` applies to
    ``r`` and its subrequests ``r/s``."""
    if not config_requests:
        return True
    base = request.split("/", 1)[0]
    return request in config_requests or base in config_requests


def allocated_devices(claim: Mapping[str, Any], ref: ClaimRef, driver: str, node_name: str,
                      pools: Collection[str],
                      validate: Callable[[Mapping[str, Any]], Any]) -> list[AllocatedDevice]:
    """The claim's devices for this driver on this node, each with its
    validated opaque configs. Raises ``ClaimError`` naming what is wrong."""
    meta = claim.get("metadata") or {}
    where = f"claim {ref.namespace}/{ref.name}"
    if meta.get("uid") != ref.uid:
        raise ClaimError(f"{where}: UID is {meta.get('uid')}, the kubelet asked for {ref.uid} "
                         "(the claim was deleted and recreated)")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"{where} is not allocated")
    if not selects_node(allocation.get("nodeSelector"), node_name):
        raise ClaimError(f"{where} is allocated for another node, not {node_name}")
    results = [r for r in (allocation.get("devices") or {}).get("results") or []
               if r.get("driver") == driver and r.get("pool") in pools]
    if not results:
        raise ClaimError(f"{where} has no allocation result for driver {driver} on node "
                         f"{node_name}")
    for r in results:  # they name CDI devices and travel to the kind and the checkpoint
        try:
            validation.label(r["device"], "device")
            validation.request(r["request"])
            if r.get("shareID") is not None:
                validation.uid(r["shareID"], "shareID")
        except validation.InvalidName as err:
            raise ClaimError(f"{where}: allocation result: {err}") from None
    configs: list[tuple[bool, list[str], Any]] = []  # (from the claim?, requests, parsed)
    for i, c in enumerate((allocation.get("devices") or {}).get("config") or []):
        opaque = c.get("opaque") or {}
        if opaque.get("driver") != driver:
            continue
        from_claim = c.get("source") != "FromClass"
        try:
            parsed = validate(opaque.get("parameters") or {})
        except ValueError as err:
            source = "claim" if from_claim else "class"
            raise ClaimError(f"{where}: opaque config #{i} (from the {source}) is invalid: {err}") \
                from None
        configs.append((from_claim, list(c.get("requests") or []), parsed))
    # Class configs first, claim configs after (stable sort): the later one wins.
    configs.sort(key=lambda c: c[0])
    return [AllocatedDevice(request=r["request"], pool=r["pool"], device=r["device"],
                            share_id=r.get("shareID"), admin_access=bool(r.get("adminAccess")),
                            consumed={str(k): str(v) for k, v in
                                      (r.get("consumedCapacity") or {}).items()},
                            configs=tuple(p for _, reqs, p in configs
                                          if _applies(reqs, r["request"])))
            for r in results]
