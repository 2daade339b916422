"""A watched pod as the router routes to it: its URL from the pod IP and the
configured port, or from its container port of the configured name; an
InferencePool's pod on each of the pool's target ports."""

from __future__ import annotations

from typing import Any

import pytest

from toposerve.router.config import KubernetesDiscovery
from toposerve.router.pool.kubernetes import ACTIVE_PORTS, Served, Target, label_target, pod_view

pytestmark = pytest.mark.unit


def pod(ports: list[dict[str, Any]] | None = None, ready: bool = True, ip: str = "127.0.0.9",
        annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "p", "labels": {}, "annotations": annotations or {}},
            "spec": {"containers": [{"name": "side"},
                                    {"name": "vllm", "ports": ports or []}]},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": str(ready)}]}}


def cfg(**kw: Any) -> KubernetesDiscovery:
    return KubernetesDiscovery.model_validate({"labelSelector": "app=x", **kw})


def served(p: dict[str, Any], c: KubernetesDiscovery, target: Target | None = None
           ) -> tuple[Served, ...]:
    return pod_view(p, c, target or label_target(c)).served


NAMED = [{"name": "metrics", "containerPort": 9090}, {"name": "http", "containerPort": 8123},
         {"name": "kv", "containerPort": 5557}]


def test_fixed_port_and_kv_port() -> None:
    assert served(pod(NAMED), cfg(port=8000, kvEventsPort=5556)) == (
        Served("http://127.0.0.9:8000", "tcp://127.0.0.9:5556"),)


def test_named_ports() -> None:
    assert served(pod(NAMED), cfg(portName="http", kvEventsPortName="kv")) == (
        Served("http://127.0.0.9:8123", "tcp://127.0.0.9:5557"),)


def test_no_port_of_that_name_or_unready_is_not_routed() -> None:
    assert served(pod([{"name": "grpc", "containerPort": 1}]), cfg(portName="http")) == ()
    assert served(pod(NAMED, ready=False), cfg(portName="http", kvEventsPortName="kv")) == ()


def test_an_ipv6_pod_is_named_in_brackets() -> None:
    assert served(pod(ip="fd00::9"), cfg(port=8000)) == (Served("http://[fd00::9]:8000", None),)


POOL = Target("app=x", (8000, 8001, 8002), active_ports=True)


def test_each_target_port_is_an_endpoint_with_its_ranks_kv_port() -> None:
    # vLLM's data-parallel rank N publishes KV events on the configured port + N
    assert served(pod(), cfg(kvEventsPort=5557), POOL) == tuple(
        Served(f"http://127.0.0.9:{8000 + r}", f"tcp://127.0.0.9:{5557 + r}") for r in range(3))


def test_the_active_ports_annotation_narrows_a_pools_ports() -> None:
    def urls(note: str, target: Target = POOL) -> list[str]:
        return [s.url for s in served(pod(annotations={ACTIVE_PORTS: note}), cfg(), target)]

    assert urls("8002, 8000") == ["http://127.0.0.9:8000", "http://127.0.0.9:8002"]
    # a number not among the target ports, or not a number, is no port
    assert urls("9000,http,-1") == []
    # the annotation is the pool's: a label selector's port is not narrowed by it
    assert urls("9000", label_target(cfg())) == ["http://127.0.0.9:8000"]
    # the kv port stays the rank's when earlier ports are inactive
    kv = served(pod(annotations={ACTIVE_PORTS: "8001"}), cfg(kvEventsPort=5557), POOL)
    assert kv == (Served("http://127.0.0.9:8001", "tcp://127.0.0.9:5558"),)


def test_a_terminating_pod_is_not_routed() -> None:
    p = pod()
    p["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert served(p, cfg(), POOL) == ()


def test_a_port_name_is_validated_as_kubernetes_does() -> None:
    with pytest.raises(ValueError, match="portName"):
        cfg(portName="HTTP_port")
