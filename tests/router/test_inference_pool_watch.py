"""The InferencePool watch's own loop, over an apiserver on loopback that
answers what the script says (as tests/router/test_loop_survival.py does for
the pod watch): a readable pool retargets the pod watch (each target port
an endpoint); a pool the v1 CRD would refuse is one error line, counted,
and routes nothing; a pool that is not there is said once and routes
nothing. The real apiserver's turn is test_inference_pool_cluster.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import structlog

from tests.router.test_loop_survival import (
    PODS,
    _list,
    _pod,
    apiserver,
    logged,
    loop_errors,
    model_servers,
    run,
    until,
)
from toposerve.router.config import InferencePoolDiscovery
from toposerve.router.pool.endpoints import Pool
from toposerve.router.pool.inference_pool import InferencePoolWatcher

pytestmark = pytest.mark.unit
POOLS = "/apis/inference.networking.k8s.io/v1/namespaces/default/inferencepools"


def _pool(ports: list[Any]) -> dict[str, Any]:
    return {"metadata": {"name": "llama", "resourceVersion": "5"},
            "spec": {"selector": {"matchLabels": {"app": "m"}},
                     "targetPorts": [{"number": p} for p in ports]}}


@pytest.mark.parametrize("case", ["readable", "unreadable", "absent"])
def test_the_pool_watch(tmp_path: Path, case: str) -> None:
    async def go() -> None:
        before = loop_errors("discovery")
        async with model_servers(2) as servers:
            ports = [s.port for s in servers]
            pools = {"readable": [_list(_pool(ports))], "absent": [_list()],
                     "unreadable": [_list(_pool([str(p) for p in ports]))]}[case]
            async with apiserver({POOLS: pools, PODS: [_list(_pod("p"))]}) as api:
                cfg = InferencePoolDiscovery.model_validate({
                    "name": "llama", "kubeconfig": api.kubeconfig(tmp_path)})
                pool = Pool()
                watcher = InferencePoolWatcher(cfg, pool, 1.0)
                with structlog.testing.capture_logs() as logs:
                    watcher.start()
                    try:
                        await until("discovery done", watcher.synced.is_set)
                        if case == "unreadable":
                            await until("the pool's error counted",
                                        lambda: loop_errors("discovery") > before)
                    finally:
                        watcher.stop()
                routed = sorted(ep.url for ep in pool)
                errors = logged(logs, "discovery", inferencePool="default/llama")
                if case == "readable":
                    assert routed == sorted(s.url for s in servers)
                    assert not errors
                else:
                    assert routed == []
                    assert api.listed[PODS] == 0  # no pool read: no pods asked for
                if case == "unreadable":
                    assert len(errors) == 1
                    assert "spec.targetPorts[0].number" in errors[0]["error"]
                if case == "absent":
                    assert [e["event"] for e in logs if e.get("inferencePool")] == [
                        "InferencePool not found; no endpoints until it is created"]

    run(go)
