"""The router's endpoints from an InferencePool (inference.networking.k8s.io/v1)
on the real local cluster: the CRD from the extension's Go module at its
pinned version, kwok pods with loopback IPs, and the endpoint set following
the pods' readiness, the pool's target ports (several ports, several
endpoints), the active-ports annotation, a selector change, the pool
deleted and made again, and a pool the CRD's schema would refuse (from a
loosened CRD): one line, the router goes on. Then the endpoint picker,
behind a real Envoy, serving the pool's pods."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client

from harness.envoy import start_envoy, start_picker
from harness.procs import MODEL, Proc, Procs
from harness.waiting import wait_for
from tests.conftest import Cluster
from tests.router.test_discovery_cluster import delete_app, endpoints
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster import crds
from toposerve.localcluster.clusters import kubeconfig_path
from toposerve.localcluster.pods import model_pod, wait_running
from toposerve.router.pool.kubernetes import ACTIVE_PORTS
from toposerve.topology.workloads import LLMD_ROLE

pytestmark = pytest.mark.cluster
POOLS = "/apis/inference.networking.k8s.io/v1/namespaces/default/inferencepools"
CRD = f"{crds.PATH}/inferencepools.inference.networking.k8s.io"


@pytest.fixture(scope="module")
def rest(cluster: Cluster) -> JsonApi:
    api = JsonApi(cluster.api)
    crds.install_named(api, ["inference-pool"])
    return api


def inference_pool(name: str, labels: dict[str, str], ports: list[int]) -> dict[str, Any]:
    return {"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
            "metadata": {"name": name},
            "spec": {"selector": {"matchLabels": labels},
                     "targetPorts": [{"number": p} for p in ports],
                     "endpointPickerRef": {"name": f"{name}-epp", "port": {"number": 9002}}}}


def set_spec(rest: JsonApi, name: str, spec: dict[str, Any]) -> None:
    rest.request("PATCH", f"{POOLS}/{name}", body={"spec": spec},
                 content_type="application/merge-patch+json")


def pods(core: Any, app: str, roles: dict[str, str]) -> dict[str, str]:
    """name -> IP of running kwok pods labelled app and role."""
    for name, role in roles.items():
        core.create_namespaced_pod("default", model_pod(name, app, role))
    return {n: ip for n, (ip, _) in wait_running(core, list(roles)).items()}


def set_ready(core: Any, name: str, ready: bool) -> None:
    core.patch_namespaced_pod_status(name, "default", {"status": {"conditions": [
        {"type": "Ready", "status": str(ready)}]}})


def router_over(procs: Procs, cluster: Cluster, pool: str) -> Proc:
    return procs.router({"discovery": {"inferencePool": {
        "name": pool, "kubeconfig": str(kubeconfig_path(cluster.name))}},
        "server": {"drainTimeoutSeconds": 2}}, wait_ready=False)


def follows(router: Proc, want: set[str], what: str) -> None:
    wait_for(what, lambda: set(endpoints(router)) == want, timeout=20)


def lines(router: Proc, *texts: str) -> list[str]:
    """The router's log lines that hold each of ``texts``."""
    return [ln for ln in router.log.read_text().splitlines() if all(t in ln for t in texts)]


@pytest.fixture
def app(cluster: Cluster, rest: JsonApi) -> Iterator[str]:
    """A name for this test's pods and pool, all deleted after it."""
    name = f"ip-{uuid.uuid4().hex[:6]}"
    yield name
    with contextlib.suppress(ApiError):
        rest.request("DELETE", f"{POOLS}/{name}")
    delete_app(client.CoreV1Api(cluster.api), name)


def test_endpoints_follow_the_pool_and_its_pods(cluster: Cluster, rest: JsonApi, app: str,
                                                procs: Procs) -> None:
    core: Any = client.CoreV1Api(cluster.api)
    ip = pods(core, app, {f"{app}-a": "decode", f"{app}-b": "decode", f"{app}-c": "prefill"})
    a, b, c = (ip[f"{app}-{x}"] for x in "abc")
    router = router_over(procs, cluster, app)
    wait_for("the absent pool said", lambda: lines(router, "InferencePool not found"))
    assert endpoints(router) == {}

    rest.request("POST", POOLS, body=inference_pool(app, {"app": app, LLMD_ROLE: "decode"},
                                                    [8000, 8001]))
    # each ready pod the selector matches, on each target port
    follows(router, {f"{a}:8000", f"{a}:8001", f"{b}:8000", f"{b}:8001"}, "two pods x two ports")
    set_ready(core, f"{app}-b", False)
    follows(router, {f"{a}:8000", f"{a}:8001"}, "the unready pod's endpoints gone")
    set_ready(core, f"{app}-b", True)
    follows(router, {f"{a}:8000", f"{a}:8001", f"{b}:8000", f"{b}:8001"}, "ready again")
    core.patch_namespaced_pod(f"{app}-a", "default",
                              {"metadata": {"annotations": {ACTIVE_PORTS: "8001"}}})
    follows(router, {f"{a}:8001", f"{b}:8000", f"{b}:8001"}, "only the active port")

    set_spec(rest, app, {"targetPorts": [{"number": 8002}]})
    follows(router, {f"{b}:8002"}, "the new target port (a's annotation names none of it)")
    set_spec(rest, app, {"selector": {"matchLabels": {"app": app, LLMD_ROLE: "prefill"}}})
    follows(router, {f"{c}:8002"}, "the new selector's pod alone")
    core.delete_namespaced_pod(f"{app}-c", "default", grace_period_seconds=0)
    follows(router, set(), "the deleted pod's endpoint gone")
    set_spec(rest, app, {"selector": {"matchLabels": {"app": app, LLMD_ROLE: None}}})
    follows(router, {f"{b}:8002"}, "a selector of app alone (a's annotation still names 8001)")

    rest.request("DELETE", f"{POOLS}/{app}")
    follows(router, set(), "the pool's endpoints gone with it")
    wait_for("the deletion said", lambda: lines(router, "InferencePool deleted"))
    rest.request("POST", POOLS, body=inference_pool(app, {"app": app}, [8000]))
    follows(router, {f"{b}:8000"}, "the pool made again")
    assert len(lines(router, "InferencePool deleted")) == 1
    assert router.popen.poll() is None


def loop_errors(router: Proc) -> float:
    return sum(s.value for s in router.samples()
               if s.name == "toposerve_router_loop_errors_total"
               and s.labels.get("loop") == "discovery")


def test_a_pool_the_crd_would_refuse_is_one_line_and_the_last_good_one_stays(
        cluster: Cluster, rest: JsonApi, app: str, procs: Procs) -> None:
    """v1's schema keeps such pools out; a loosened or hand-made CRD lets them
    in. Each streak of unreadable pools is one line, counted; the router
    serves on with what it read last, and picks up the next readable pool."""
    core: Any = client.CoreV1Api(cluster.api)
    a = pods(core, app, {f"{app}-a": "decode"})[f"{app}-a"]
    strict = rest.request("GET", CRD)
    loose = {**strict, "spec": {**strict["spec"], "versions": [
        {**v, "schema": {"openAPIV3Schema": {"type": "object",
                                             "x-kubernetes-preserve-unknown-fields": True}}}
        for v in strict["spec"]["versions"]]}}
    rest.request("PUT", CRD, body=loose)
    try:
        router = router_over(procs, cluster, app)
        bad = inference_pool(app, {"app": app}, [8000])
        bad["spec"]["targetPorts"] = [{"number": "8000"}]

        def created() -> bool:  # the loosened schema is served a moment after the PUT
            try:
                rest.request("POST", POOLS, body=bad)
            except ApiError as err:
                if err.status != 422:
                    raise
                return False
            return True

        wait_for("the loosened CRD to take the pool", created, timeout=20)
        wait_for("the unreadable pool said", lambda: lines(router, "targetPorts[0].number"))
        assert loop_errors(router) >= 1
        assert endpoints(router) == {}
        set_spec(rest, app, {"targetPorts": [{"number": 8000}]})
        follows(router, {f"{a}:8000"}, "the readable pool's endpoint")
        wait_for("the recovery said",
                 lambda: lines(router, "background loop recovered", "InferencePool"))
        set_spec(rest, app, {"selector": {"matchLabels": {"app": [app]}}})
        wait_for("the second streak said",
                 lambda: len(lines(router, "background loop error", "InferencePool")) == 2)
        assert set(endpoints(router)) == {f"{a}:8000"}  # the last readable pool stays
        assert lines(router, "spec.selector.matchLabels")
        assert httpx.get(router.url + "/health").status_code == 200
        assert not lines(router, "Traceback")
    finally:
        now = rest.request("GET", CRD)
        rest.request("PUT", CRD, body={**now, "spec": {**now["spec"],
                                                        "versions": strict["spec"]["versions"]}})


def test_the_picker_serves_the_pools_pods_through_envoy(cluster: Cluster, rest: JsonApi,
                                                        app: str, procs: Procs) -> None:
    """``--mode endpoint-picker`` with its endpoints from an InferencePool,
    behind a real Envoy: requests answered by the pool's pods, and a pod
    that turns unready is picked no more."""
    core: Any = client.CoreV1Api(cluster.api)
    ip = pods(core, app, {f"{app}-0": "decode", f"{app}-1": "decode"})
    for i in ip.values():
        procs.sim(host=i, port=8000)
    rest.request("POST", POOLS, body=inference_pool(app, {"app": app}, [8000]))
    picker = start_picker(procs, None, {"discovery": {"inferencePool": {
        "name": app, "kubeconfig": str(kubeconfig_path(cluster.name))}}})
    envoy = start_envoy(procs, picker.extra["grpc"])
    names = {f"{i}:8000" for i in ip.values()}
    wait_for("both pods healthy", lambda: endpoints(picker) == dict.fromkeys(names, 1.0),
             timeout=20)

    def served(n: int) -> set[str]:
        out = set()
        for k in range(n):
            r = httpx.post(envoy.url + "/v1/chat/completions", timeout=60, json={
                "model": MODEL, "max_tokens": 2,
                "messages": [{"role": "user", "content": f"question {k} " * (k + 1)}]})
            assert r.status_code == 200, r.text
            out.add(r.headers["x-toposerve-endpoint"])
        return out

    assert served(6) <= names
    set_ready(core, f"{app}-0", False)
    follows(picker, {f"{ip[f'{app}-1']}:8000"}, "the unready pod out of the picker's pool")
    assert served(6) == {f"{ip[f'{app}-1']}:8000"}
