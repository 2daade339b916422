"""The router discovers model servers from the real cluster: kwok pods with
127.x IPs, a simulator listening on each pod's IP, pods added and removed
while traffic flows, and not one request failing; prefill and decode pods
found by their role labels, each split request decoded on its prefill
pod's node."""

from __future__ import annotations

import contextlib
import threading
import uuid
from collections import Counter
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


def make_pod(core: Any, name: str, app: str, role: str = "decode",
             node: str | None = None, ports: dict[str, int] | None = None) -> str:
    core.create_namespaced_pod("default", model_pod(name, app, role, node, ports=ports))
    return wait_running(core, [name])[name][0]


def delete_app(core: Any, app: str) -> None:
    for pod in core.list_namespaced_pod("default", label_selector=f"app={app}").items:
        with contextlib.suppress(client.exceptions.ApiException):
            core.delete_namespaced_pod(pod.metadata.name, "default", grace_period_seconds=0)


def endpoints(router: Proc) -> dict[str, float]:
    out = {}
    for line in httpx.get(router.url + "/metrics").text.splitlines():
        if line.startswith("toposerve_router_endpoint_healthy{"):
            out[line.split('"')[1]] = float(line.split()[-1])
    return out


def test_pods_added_and_removed_under_traffic(cluster: Cluster, procs: Procs) -> None:
    core: Any = client.CoreV1Api(cluster.api)
    app = f"sim-{uuid.uuid4().hex[:6]}"
    names = [f"{app}-{i}" for i in range(3)]
    ips = {n: make_pod(core, n, app) for n in names}
    sims = {n: procs.sim(host=ip, port=PORT) for n, ip in ips.items()}
    router = procs.router({"discovery": {"kubernetes": {
        "namespace": "default", "labelSelector": f"app={app}", "port": PORT,
        "kubeconfig": str(kubeconfig_path(cluster.name))}},
        "server": {"drainTimeoutSeconds": 10}})
    wait_for("3 endpoints", lambda: sum(endpoints(router).values()) == 3, timeout=20)

    statuses: list[int] = []
    served: Counter[str] = Counter()
    stop = threading.Event()

    def traffic() -> None:
        with httpx.Client(base_url=router.url, timeout=30) as c:
            i = 0
            while not stop.is_set():
                r = c.post("/v1/chat/completions", json={
                    "model": MODEL, "max_tokens": 3,
                    "messages": [{"role": "user", "content": f"request {i}"}]})
                statuses.append(r.status_code)
                served[r.headers.get("x-toposerve-endpoint", "?")] += 1
                i += 1

    threads = [threading.Thread(target=traffic) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        wait_for("traffic", lambda: len(statuses) >= 20, timeout=20)
        # scale up: a fourth pod and its server
        new = f"{app}-3"
        ip = make_pod(core, new, app)
        sims[new] = procs.sim(host=ip, port=PORT)
        wait_for("4 endpoints", lambda: sum(endpoints(router).values()) == 4, timeout=20)
        wait_for("traffic on the new endpoint", lambda: served[f"{ip}:{PORT}"] > 0, timeout=20)
        # scale down: delete a pod; its server lives until the router lets go of it
        gone = names[0]
        gone_ep = f"{ips[gone]}:{PORT}"
        core.delete_namespaced_pod(gone, "default")
        wait_for("drained", lambda: gone_ep not in endpoints(router), timeout=20)
        before, sent = served[gone_ep], len(statuses)
        sims[gone].stop()
        wait_for("more traffic", lambda: len(statuses) >= sent + 40, timeout=20)
        assert served[gone_ep] == before
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        for n in list(sims):
            with contextlib.suppress(client.exceptions.ApiException):
                core.delete_namespaced_pod(n, "default", grace_period_seconds=0)
    assert len(statuses) > 50
    assert set(statuses) == {200}, Counter(statuses)


def test_split_requests_decode_next_to_their_prefill(cluster: Cluster, procs: Procs) -> None:
    core: Any = client.CoreV1Api(cluster.api)
    nodes = sorted(n.metadata.name for n in core.list_node(
        label_selector="topology.toposerve.io/profile=hgx-h100").items)[:2]
    assert len(nodes) == 2
    app = f"pd-{uuid.uuid4().hex[:6]}"
    node_of: dict[str, str] = {}
    try:
        for role in ("prefill", "decode"):
            for i, node in enumerate(nodes):
                ip = make_pod(core, f"{app}-{role}-{i}", app, role, node)
                procs.sim(host=ip, port=PORT, time_scale=0.01)
                node_of[f"{ip}:{PORT}"] = node
        router = procs.router({"discovery": {"kubernetes": {
            "namespace": "default", "labelSelector": f"app={app}", "port": PORT,
            "kubeconfig": str(kubeconfig_path(cluster.name))}},
            "disaggregation": {"enabled": True}})
        wait_for("4 endpoints", lambda: sum(endpoints(router).values()) == 4, timeout=20)
        used = set()
        for i in range(8):
            r = httpx.post(router.url + "/v1/completions", timeout=30, json={
                "model": MODEL, "prompt": f"document {i} " * 200, "max_tokens": 2})
            assert r.status_code == 200, r.text
            prefill = r.headers["x-toposerve-prefill-endpoint"]
            decode = r.headers["x-toposerve-endpoint"]
            assert node_of[prefill] == node_of[decode]
            used.add(node_of[prefill])
        assert used == set(nodes)
    finally:
        delete_app(core, app)


def test_decode_stays_in_the_prefill_nvlink_domain(cluster: Cluster, procs: Procs) -> None:
    # one prefill pod on a GB200 tray; decode pods on another tray of the
    # same NVL72 domain and on an HGX node: the router reads the nodes'
    # topology labels and keeps the KV on NVLink
    core: Any = client.CoreV1Api(cluster.api)

    def nodes(profile: str) -> list[str]:
        return sorted(n.metadata.name for n in core.list_node(
            label_selector=f"topology.toposerve.io/profile={profile}").items)

    gb200, hgx = nodes("gb200-nvl72"), nodes("hgx-h100")
    app = f"nvl-{uuid.uuid4().hex[:6]}"
    placement = {"prefill-0": ("prefill", gb200[0]), "decode-nvl": ("decode", gb200[5]),
                 "decode-hgx": ("decode", hgx[0])}
    endpoint_of: dict[str, str] = {}
    try:
        for pod, (role, node) in placement.items():
            ip = make_pod(core, f"{app}-{pod}", app, role, node)
            procs.sim(host=ip, port=PORT, time_scale=0.01)
            endpoint_of[pod] = f"{ip}:{PORT}"
        router = procs.router({"discovery": {"kubernetes": {
            "namespace": "default", "labelSelector": f"app={app}", "port": PORT,
            "kubeconfig": str(kubeconfig_path(cluster.name))}},
            "disaggregation": {"enabled": True}})
        wait_for("3 endpoints", lambda: sum(endpoints(router).values()) == 3, timeout=20)
        for i in range(6):
            r = httpx.post(router.url + "/v1/completions", timeout=30, json={
                "model": MODEL, "prompt": f"page {i} " * 100, "max_tokens": 2})
            assert r.status_code == 200, r.text
            assert r.headers["x-toposerve-prefill-endpoint"] == endpoint_of["prefill-0"]
            assert r.headers["x-toposerve-endpoint"] == endpoint_of["decode-nvl"]
    finally:
        delete_app(core, app)


def discovery_requests(router: Proc, verb: str) -> float:
    return sum(s.value for s in router.samples()
               if s.name == "toposerve_router_discovery_requests_total"
               and s.labels.get("verb") == verb)


def test_watch_resumes_without_relisting(cluster: Cluster, procs: Procs) -> None:
    """Each watch lasts a second here, so many end during the test: every
    one is resumed from the last resourceVersion, and the namespace is
    listed once, at start (a LIST per renewal is a load generator at scale)."""
    core: Any = client.CoreV1Api(cluster.api)
    app = f"rv-{uuid.uuid4().hex[:6]}"
    try:
        procs.sim(host=make_pod(core, f"{app}-0", app), port=PORT)
        router = procs.router({"discovery": {"kubernetes": {
            "namespace": "default", "labelSelector": f"app={app}", "port": PORT,
            "kubeconfig": str(kubeconfig_path(cluster.name)), "watchTimeoutSeconds": 1}}})
        wait_for("1 endpoint", lambda: sum(endpoints(router).values()) == 1, timeout=20)
        wait_for("five watches", lambda: discovery_requests(router, "watch") >= 5, timeout=30)
        # a pod that comes after several renewals is still seen, and one that goes
        ip = make_pod(core, f"{app}-1", app)
        procs.sim(host=ip, port=PORT)
        wait_for("2 endpoints", lambda: sum(endpoints(router).values()) == 2, timeout=20)
        core.delete_namespaced_pod(f"{app}-0", "default", grace_period_seconds=0)
        wait_for("1 endpoint left", lambda: list(endpoints(router)) == [f"{ip}:{PORT}"],
                 timeout=40)
        assert discovery_requests(router, "list") == 1
    finally:
        delete_app(core, app)


def test_each_pods_port_from_its_named_container_port(cluster: Cluster, procs: Procs) -> None:
    """portName: each pod's HTTP port is its container port of that name (pods
    on the host network share an IP, one port each); a pod without that port
    is not routed to."""
    core: Any = client.CoreV1Api(cluster.api)
    app = f"sim-{uuid.uuid4().hex[:6]}"
    ports = {f"{app}-a": 18_471, f"{app}-b": 18_472}
    try:
        ips = {n: make_pod(core, n, app, ports={"http": p}) for n, p in ports.items()}
        make_pod(core, f"{app}-c", app)  # no port named http
        for n, ip in ips.items():
            procs.sim(host=ip, port=ports[n])
        router = procs.router({"discovery": {"kubernetes": {
            "namespace": "default", "labelSelector": f"app={app}", "portName": "http",
            "kubeconfig": str(kubeconfig_path(cluster.name))}}})
        want = {f"{ips[n]}:{p}" for n, p in ports.items()}  # as the metrics name them
        wait_for("the two named ports", lambda: set(endpoints(router)) == want, timeout=20)
        for _ in range(4):
            r = httpx.post(router.url + "/v1/chat/completions", timeout=30, json={
                "model": MODEL, "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 200, r.text
        assert f"{app}-c" in router.log.read_text()  # said why it is not routed
    finally:
        delete_app(core, app)
