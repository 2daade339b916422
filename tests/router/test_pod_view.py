"""A watched pod as the router routes to it: its URL from the pod IP and the
configured port, or from its container port of the configured name."""

from __future__ import annotations

from typing import Any

import pytest

from toposerve.router.config import KubernetesDiscovery
from toposerve.router.pool.kubernetes import pod_view

pytestmark = pytest.mark.unit


def pod(ports: list[dict[str, Any]] | None = None, ready: bool = True) -> dict[str, Any]:
    return {"metadata": {"name": "p", "labels": {}},
            "spec": {"containers": [{"name": "side"},
                                    {"name": "vllm", "ports": ports or []}]},
            "status": {"phase": "Running", "podIP": "127.0.0.9",
                       "conditions": [{"type": "Ready", "status": str(ready)}]}}


def cfg(**kw: Any) -> KubernetesDiscovery:
    return KubernetesDiscovery.model_validate({"labelSelector": "app=x", **kw})


NAMED = [{"name": "metrics", "containerPort": 9090}, {"name": "http", "containerPort": 8123},
         {"name": "kv", "containerPort": 5557}]


def test_fixed_port_and_kv_port() -> None:
    v = pod_view(pod(NAMED), cfg(port=8000, kvEventsPort=5556))
    assert (v.url, v.kv_events) == ("http://127.0.0.9:8000", "tcp://127.0.0.9:5556")


def test_named_ports() -> None:
    v = pod_view(pod(NAMED), cfg(portName="http", kvEventsPortName="kv"))
    assert (v.url, v.kv_events) == ("http://127.0.0.9:8123", "tcp://127.0.0.9:5557")


def test_no_port_of_that_name_or_unready_is_not_routed() -> None:
    assert pod_view(pod([{"name": "grpc", "containerPort": 1}]), cfg(portName="http")).url is None
    v = pod_view(pod(NAMED, ready=False), cfg(portName="http", kvEventsPortName="kv"))
    assert (v.url, v.kv_events) == (None, None)


def test_a_port_name_is_validated_as_kubernetes_does() -> None:
    with pytest.raises(ValueError, match="portName"):
        cfg(portName="HTTP_port")
