"""A rollout on the real cluster: revision 1 (a prefill pod and two
decode pods, simulators on their 127.x IPs) replaced by revision 2 pod by
pod while sessions send split requests. Not one request fails, no
prefill/decode pair crosses revisions, and each session changes revision
at most once, from 1 to 2."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections import Counter, defaultdict
from typing import Any

import httpx
import pytest
from kubernetes import client

from harness.procs import MODEL, Proc, Procs
from harness.waiting import wait_for
from tests.conftest import Cluster
from toposerve.localcluster.clusters import kubeconfig_path
from toposerve.localcluster.pods import model_pod, wait_running

pytestmark = pytest.mark.cluster
PORT = 8000
REVISION = "disaggregatedset.x-k8s.io/revision"
SESSIONS = 8


def endpoints(router: Proc) -> set[str]:
    return {s.labels["endpoint"] for s in router.samples()
            if s.name == "toposerve_router_endpoint_healthy" and s.value == 1}


def test_rollout_pod_by_pod(cluster: Cluster, procs: Procs) -> None:
    core: Any = client.CoreV1Api(cluster.api)
    app = f"roll-{uuid.uuid4().hex[:6]}"
    revision_of: dict[str, str] = {}  # endpoint -> revision
    sims: dict[str, Proc] = {}
    endpoint_of: dict[str, str] = {}  # pod -> endpoint

    def add(pod: str, role: str, rev: str) -> None:
        body = model_pod(f"{app}-{pod}", app, role)
        body["metadata"]["labels"][REVISION] = rev
        core.create_namespaced_pod("default", body)
        ip = wait_running(core, [f"{app}-{pod}"])[f"{app}-{pod}"][0]
        sims[pod] = procs.sim(host=ip, port=PORT, time_scale=0.01)
        endpoint_of[pod] = f"{ip}:{PORT}"
        revision_of[endpoint_of[pod]] = rev

    try:
        for pod, role in (("p1a", "prefill"), ("d1a", "decode"), ("d1b", "decode")):
            add(pod, role, "1")
        router = procs.router({"discovery": {"kubernetes": {
            "namespace": "default", "labelSelector": f"app={app}", "port": PORT,
            "kubeconfig": str(kubeconfig_path(cluster.name))}},
            "disaggregation": {"enabled": True}, "server": {"drainTimeoutSeconds": 10}})
        wait_for("3 endpoints", lambda: len(endpoints(router)) == 3, timeout=20)

        statuses: list[int] = []
        seen: dict[str, list[str]] = defaultdict(list)  # session -> revisions in order
        crossed: list[tuple[str, str]] = []
        stop = threading.Event()

        def traffic(w: int) -> None:
            with httpx.Client(base_url=router.url, timeout=30) as c:
                i = 0
                while not stop.is_set():
                    session = f"s{(w + i * 2) % SESSIONS}"
                    r = c.post("/v1/completions", headers={"x-session-id": session}, json={
                        "model": MODEL, "max_tokens": 2,
                        "prompt": f"{session} says " + "words " * 300 + str(i)})
                    statuses.append(r.status_code)
                    decode = revision_of.get(r.headers.get("x-toposerve-endpoint", ""), "?")
                    prefill = r.headers.get("x-toposerve-prefill-endpoint")
                    if prefill is not None and revision_of.get(prefill) != decode:
                        crossed.append((prefill, r.headers["x-toposerve-endpoint"]))
                    if not seen[session] or seen[session][-1] != decode:
                        seen[session].append(decode)
                    i += 1

        threads = [threading.Thread(target=traffic, args=(w,)) for w in range(2)]
        for t in threads:
            t.start()
        try:
            def remove(pod: str) -> None:
                core.delete_namespaced_pod(f"{app}-{pod}", "default")
                wait_for(f"{pod} drained", lambda: endpoint_of[pod] not in endpoints(router),
                         timeout=20)
                sims[pod].stop()  # only once the router has let go of it

            def traffic_goes_on() -> None:
                n = len(statuses)
                wait_for("traffic", lambda: len(statuses) >= n + 10, timeout=20)

            traffic_goes_on()
            for new, role, old in (("p2a", "prefill", "p1a"), ("d2a", "decode", "d1a"),
                                   ("d2b", "decode", "d1b")):
                add(new, role, "2")
                url = endpoint_of[new]
                wait_for(f"{new} ready", lambda: url in endpoints(router), timeout=20)  # noqa: B023
                traffic_goes_on()
                remove(old)
                traffic_goes_on()
        finally:
            stop.set()
            for t in threads:
                t.join(30)
    finally:
        for pod in core.list_namespaced_pod("default", label_selector=f"app={app}").items:
            with contextlib.suppress(client.exceptions.ApiException):
                core.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=0)
    assert set(statuses) == {200}, Counter(statuses)
    assert crossed == []
    for session, revs in seen.items():
        assert revs in (["1"], ["2"], ["1", "2"]), (session, revs)
    assert any(revs == ["1", "2"] for revs in seen.values())
