"""Pods for the real node: our local busybox image (never pulled), no
service-account token and no service links, so nothing in the pod knows,
let alone dials, the service range."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from toposerve.localcluster.realnode.paths import (
    BUSYBOX_IMAGE,
    REAL_NODE_LABEL,
    REAL_NODE_TOLERATION,
)


def busybox_pod(name: str, script: str, env: Mapping[str, str] | None = None,
                claims: Sequence[Mapping[str, str]] = ()) -> dict[str, Any]:
    """A pod for the real node running ``sh -c script``. ``claims`` are pod
    resourceClaims entries (``name`` + ``resourceClaimName`` or
    ``resourceClaimTemplateName``); the container uses them all."""
    container: dict[str, Any] = {
        "name": "main", "image": BUSYBOX_IMAGE, "imagePullPolicy": "Never",
        "command": ["sh", "-c", script],
        "env": [{"name": k, "value": v} for k, v in (env or {}).items()],
    }
    spec: dict[str, Any] = {
        "nodeSelector": {REAL_NODE_LABEL: "real"},
        "tolerations": [REAL_NODE_TOLERATION],
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": 1,
        "restartPolicy": "Never",
        "containers": [container],
    }
    if claims:
        spec["resourceClaims"] = [dict(c) for c in claims]
        container["resources"] = {"claims": [{"name": c["name"]} for c in claims]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}
