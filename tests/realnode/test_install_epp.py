"""The router as a Gateway's endpoint picker, installed by the chart on the
real node (docs/gateway.md): ``router.mode: endpoint-picker`` with the
InferencePool the chart makes (its CRD from the extension's module, as
``cluster up --crd inference-pool`` installs it) over two simulator pods of
the installed image, and a real Envoy on the host in front (the static
config of docs/gateway.md; the router pair's two gRPC ports behind Envoy's
health checks, so only the leader is asked). A request from the host
through Envoy is answered by a pool pod the picker chose, with the picker's
decisions (prefix affinity, new conversations spread); a pod leaving the pool is picked no
more; the leader's pod deleted, the standby picks."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from harness.envoy import pickers_healthy, start_envoy
from harness.images import make_images
from harness.procs import Proc, Procs
from harness.waiting import wait_for
from tests.conftest import Cluster
from tests.realnode.conftest import (
    delete_kept,
    drop_failed_release,
    ensure_started,
    host_url,
    router_pair,
    sim_pod,
)
from toposerve.kubeapi import JsonApi
from toposerve.localcluster import crds
from toposerve.localcluster import install as inst
from toposerve.localcluster.ports import free_port
from toposerve.router.pool.kubernetes import ACTIVE_PORTS

pytestmark = [pytest.mark.cluster, pytest.mark.realnode]

PREFIX = "rn-epp"  # namespace and name prefix: nothing shared with other tests
ROUTER_NS = f"{PREFIX}-router"
POOL = f"{PREFIX}-pool"
SIM = f"{PREFIX}-sim"
MODEL = f"{PREFIX}/sim"
# On the host network both model servers have the node's IP (127.0.0.1):
# each listens on a port of its own, both ports are the pool's target ports,
# and each pod's active-ports annotation names its own, as a data-parallel
# server's pods say which of the pool's ports they serve.
PORTS = {f"{SIM}-{i}": free_port() for i in range(2)}
ENDPOINTS = {f"127.0.0.1:{p}" for p in PORTS.values()}


@dataclass
class Gateway:
    core: Any
    image: str
    envoy: Proc


def _start_sims(g: Gateway) -> None:
    """Both model servers, unless they run (one being deleted: once gone)."""
    def settled() -> tuple[set[str]] | None:  # a tuple: true with no pod too
        pods = g.core.list_namespaced_pod(ROUTER_NS, label_selector=f"app={SIM}").items
        if any(p.metadata.deletion_timestamp is not None for p in pods):
            return None
        return ({p.metadata.name for p in pods},)

    got = wait_for("deleted model servers gone", settled, timeout=60)
    assert got is not None
    have, = got
    for name, port in PORTS.items():
        if name not in have:
            g.core.create_namespaced_pod(ROUTER_NS, sim_pod(
                g.image, name, port, SIM, MODEL, {ACTIVE_PORTS: str(port)}))


def _healthy(core: Any) -> set[str]:
    """The endpoints the leading picker routes to (its /metrics)."""
    leader = router_pair(core, ROUTER_NS)["leader"]
    try:
        text = httpx.get(host_url(leader) + "/metrics", timeout=5).text
    except httpx.HTTPError:
        return set()  # a pod just labelled leader may still be starting: asked again
    return {line.split('"')[1] for line in text.splitlines()
            if line.startswith("toposerve_router_endpoint_healthy{") and line.endswith(" 1.0")}


def _ready(g: Gateway) -> None:
    """Both pool pods in the leading picker's view, and that picker healthy
    in Envoy's (until then Envoy answers 500: no picker to ask)."""
    wait_for("both pool pods in the picker's view", lambda: _healthy(g.core) == ENDPOINTS,
             timeout=90, interval=0.5)
    wait_for("Envoy to hold a picker healthy", lambda: pickers_healthy(g.envoy) == 1,
             timeout=30, interval=0.2)


@pytest.fixture(scope="module")
def gateway(real_node_cluster: Cluster, tmp_path_factory: pytest.TempPathFactory
            ) -> Iterator[Gateway]:
    """The chart's router alone (no driver, extender or scheduler) in
    endpoint-picker mode with its InferencePool, the model servers in the
    pool's namespace, Envoy on the host in front."""
    ensure_started(real_node_cluster)
    core: Any = client.CoreV1Api(real_node_cluster.api)
    crds.install_named(JsonApi(real_node_cluster.api), ["inference-pool"])
    images = make_images()
    image = next(ref for ref in images if inst._image_name(ref) == "toposerve")
    lines: list[str] = []
    try:
        installed = inst.install(real_node_cluster.name, sets=[
            f"namespace={PREFIX}", f"router.namespace={ROUTER_NS}", f"namePrefix={PREFIX}",
            "gpuDriver.enabled=false", "extender.enabled=false", "scheduler.enabled=false",
            "admissionPolicy.enabled=false", "deviceClasses.enabled=false",
            "router.mode=endpoint-picker", "router.apiKeys.enabled=false",
            "router.inferencePool.create=true", f"router.inferencePool.name={POOL}",
            f"router.inferencePool.selector={{app: {SIM}}}",
            f"router.inferencePool.targetPorts={sorted(PORTS.values())}"],
            progress=lines.append)
    except BaseException:
        drop_failed_release(real_node_cluster.name, PREFIX)
        raise
    finally:
        print("\n".join(lines))
    procs = Procs(Path(tmp_path_factory.mktemp("envoy")))
    try:
        picker = installed.values.router.picker_port
        g = Gateway(core=core, image=image, envoy=start_envoy(procs, [picker, picker + 1]))
        _start_sims(g)
        yield g
    finally:
        procs.close()
        for name in PORTS:
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(name, ROUTER_NS, grace_period_seconds=1)
        inst.uninstall(real_node_cluster.name, installed.values)
        delete_kept(core, installed.values, PREFIX)


@pytest.fixture
def sdk(gateway: Gateway) -> openai.OpenAI:
    """The OpenAI SDK at Envoy's listener, as an app on the host would call it."""
    return openai.OpenAI(base_url=gateway.envoy.url + "/v1", api_key="unused", max_retries=0,
                         timeout=30)


def _served_by(sdk: openai.OpenAI, text: str) -> str:
    """The endpoint that answered a chat request of ``text`` (the picker's
    response header), after checking the answer is whole."""
    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL, max_tokens=4, messages=[{"role": "user", "content": text}])
    answer = raw.parse()
    assert answer.choices[0].message.content and answer.usage and answer.usage.prompt_tokens
    return raw.headers["x-toposerve-endpoint"]


def test_a_request_from_the_host_is_answered_by_a_pool_pod_the_picker_chose(
        gateway: Gateway, sdk: openai.OpenAI) -> None:
    _ready(gateway)
    # the same long conversation again and again: one server (prefix affinity)
    prefix = "the long system prompt every turn of this agent shares " * 20
    assert len({_served_by(sdk, prefix + f" turn {i}") for i in range(4)}) == 1
    # new conversations (a first KiB of their own): placed where fewest
    # live, so over both servers
    assert {_served_by(sdk, f"conversation {i} " + "words " * 200) for i in range(6)
            } == ENDPOINTS
    # streamed, with usage, as the SDK reads it
    chunks = list(sdk.chat.completions.create(
        model=MODEL, max_tokens=4, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "user", "content": "stream please"}]))
    assert chunks[-1].usage and chunks[-1].usage.completion_tokens == 4


def test_a_pod_leaving_the_pool_is_picked_no_more(gateway: Gateway,
                                                  sdk: openai.OpenAI) -> None:
    _start_sims(gateway)
    _ready(gateway)
    gone, kept = sorted(PORTS)
    gateway.core.delete_namespaced_pod(gone, ROUTER_NS, grace_period_seconds=1)
    wait_for("the deleted pod out of the picker's view", lambda: _healthy(
        gateway.core) == {f"127.0.0.1:{PORTS[kept]}"}, timeout=30, interval=0.5)
    assert {_served_by(sdk, f"after {i} " * (i + 1)) for i in range(8)} == {
        f"127.0.0.1:{PORTS[kept]}"}
    _start_sims(gateway)
    wait_for("the pod back in the picker's view", lambda: _healthy(gateway.core) == ENDPOINTS,
             timeout=90, interval=0.5)


def test_the_standby_picks_when_the_leaders_pod_is_deleted(gateway: Gateway,
                                                           sdk: openai.OpenAI) -> None:
    """Envoy asks whichever replica's gRPC health says SERVING: the leader's
    pod deleted, requests through Envoy are answered again within seconds,
    by the standby that took the Lease."""
    _start_sims(gateway)
    _ready(gateway)
    pair = router_pair(gateway.core, ROUTER_NS)
    # no replica restarted in the tests before (a crash would hide behind
    # the pair's failover)
    assert [c.restart_count for p in pair.values() for c in p.status.container_statuses
            ] == [0, 0]
    assert _served_by(sdk, "before the leader goes") in ENDPOINTS
    gateway.core.delete_namespaced_pod(pair["leader"].metadata.name, ROUTER_NS,
                                       grace_period_seconds=1)
    deleted = time.monotonic()

    def answered() -> bool:
        try:
            return _served_by(sdk, "while the leader goes") in ENDPOINTS
        except openai.APIError:
            return False  # Envoy's 5xx while no replica says SERVING (failure_mode_allow off)

    wait_for("a request answered through the standby", answered, timeout=30, interval=0.2)
    took = time.monotonic() - deleted
    print(f"endpoint picker failover through Envoy: answered again {took:.1f}s after the "
          "leader's pod was deleted")
    now = router_pair(gateway.core, ROUTER_NS, timeout=120)
    assert now["leader"].metadata.name == pair["standby"].metadata.name
