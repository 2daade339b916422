"""An InferencePool (inference.networking.k8s.io/v1) read as the router's
source of endpoints: what its spec becomes (a label selector and ports), a
pool being deleted, and the pools the v1 CRD's schema would refuse, each
refused with where it is wrong; the config's inferencePool beside the other
discoveries."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from toposerve.router.config import RouterConfig
from toposerve.router.pool.inference_pool import PoolUnreadable, picker_ref, pool_target
from toposerve.router.pool.kubernetes import Target

pytestmark = pytest.mark.unit


def pool(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": "p", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "vllm", "tier": "a"}},
                     "targetPorts": [{"number": 8000}],
                     "endpointPickerRef": {"name": "epp", "port": {"number": 9002}},
                     **spec}}


def test_a_pool_is_its_selector_and_ports() -> None:
    assert pool_target(pool(targetPorts=[{"number": 8001}, {"number": 8000}])) == Target(
        "app=vllm,tier=a", (8001, 8000), active_ports=True)
    assert pool_target(pool(selector={"matchLabels": {"example.com/role": ""}})) == Target(
        "example.com/role=", (8000,), active_ports=True)
    assert picker_ref(pool()) == "Service/epp:9002"


def test_a_pool_being_deleted_names_no_pods() -> None:
    p = pool()
    p["metadata"]["deletionTimestamp"] = "2026-12-06T00:00:00Z"
    assert pool_target(p) is None


@pytest.mark.parametrize(("spec", "where"), [
    ({"selector": {}}, "spec.selector.matchLabels: expected a non-empty mapping"),
    ({"selector": {"matchLabels": {}}}, "spec.selector.matchLabels: expected a non-empty"),
    ({"selector": {"matchLabels": ["app"]}}, "spec.selector.matchLabels: expected"),
    ({"selector": {"matchLabels": {"app": "a,b=c"}}}, "'app': 'a,b=c' is not a Kubernetes"),
    ({"selector": {"matchLabels": {"bad key": "x"}}}, "'bad key': 'x' is not a Kubernetes"),
    ({"selector": {"matchLabels": {"app": 5}}}, "'app': 5 is not a Kubernetes"),
    ({"targetPorts": []}, "spec.targetPorts: expected 1 to 8 ports"),
    ({"targetPorts": [{"number": p} for p in range(8000, 8009)]}, "expected 1 to 8 ports"),
    ({"targetPorts": 8000}, "spec.targetPorts: expected 1 to 8 ports, got 8000"),
    ({"targetPorts": [{"number": "8000"}]}, "spec.targetPorts[0].number: expected a port"),
    ({"targetPorts": [{"number": 0}]}, "spec.targetPorts[0].number: expected a port"),
    ({"targetPorts": [{"number": True}]}, "spec.targetPorts[0].number: expected a port"),
    ({"targetPorts": [8000]}, "spec.targetPorts[0].number: expected a port"),
    ({"targetPorts": [{"number": 80}, {"number": 80}]}, "[1].number: 80 is given twice"),
])
def test_what_the_crd_would_refuse_is_refused_with_where(spec: dict[str, Any],
                                                        where: str) -> None:
    with pytest.raises(PoolUnreadable) as err:
        pool_target(pool(**spec))
    assert where in str(err.value)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("obj", [[1], {"spec": None}, {"metadata": 3, "spec": "x"}])
def test_what_is_no_pool_at_all_is_refused(obj: Any) -> None:
    with pytest.raises(PoolUnreadable):
        pool_target(obj)


BASE = {"apiVersion": "toposerve.io/v1", "kind": "RouterConfig"}


def test_the_config_takes_an_inference_pool_alone() -> None:
    cfg = RouterConfig.model_validate({**BASE, "discovery": {"inferencePool": {
        "name": "llama", "namespace": "serving", "kvEventsPort": 5557}}})
    assert cfg.discovery.inference_pool is not None
    assert (cfg.discovery.inference_pool.name, cfg.discovery.inference_pool.namespace) == (
        "llama", "serving")
    for beside in ({"static": [{"url": "http://127.0.0.1:8000"}]},
                   {"kubernetes": {"labelSelector": "app=x"}}):
        with pytest.raises(ValidationError, match="inferencePool names the model servers alone"):
            RouterConfig.model_validate({**BASE, "discovery": {
                "inferencePool": {"name": "llama"}, **beside}})
    for bad in ({"name": "Llama_1"}, {}, {"name": "x", "selector": "app=x"}):
        with pytest.raises(ValidationError, match="inferencePool"):
            RouterConfig.model_validate({**BASE, "discovery": {"inferencePool": bad}})
