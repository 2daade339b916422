"""Binding conditions under the NIC driver's own identity: ``toposerve
driver net --binding-conditions`` on a kwok node, its service-account token
bound to a pod there, with exactly the chart's rules for it (the claims
read, listed and watched; status for its own driver name on its own node).
The real scheduler allocates a NIC and waits in PreBind; the driver's
binding controller writes ``LinkReady`` under its own field manager and
the pod binds. (What the scheduler does with each condition is on the
real node: tests/realnode/test_binding.py.)"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from harness.dra_net import (
    DRIVER,
    NAMESPACE,
    NODE,
    RULES,
    SITE,
    NetDriverProc,
    NetEnv,
    create_claim,
    published,
)
from harness.net_standins import StandIns, stand_ins
from harness.waiting import wait_for
from tests.conftest import Cluster
from toposerve.dra_driver.net.binding import CONDITIONS
from toposerve.topology.profiles import load_profile

pytestmark = pytest.mark.cluster
HW = load_profile("hgx-h100").hardware()
# the chart's rules with netDriver.bindingConditions: claims listed and watched too
BINDING_RULES = [{**r, "verbs": ["get", "list", "watch"]}
                 if r["resources"] == ["resourceclaims"] else r for r in RULES]
BINDING_SITE = dataclasses.replace(SITE, role="dra-test-net-binding", rules=BINDING_RULES)


@pytest.fixture(scope="module")
def net_env(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetEnv]:
    kubeconfig = BINDING_SITE.setup(cluster.name, cluster.api,
                                    tmp_path_factory.mktemp("net-bind-env"))
    try:
        yield NetEnv(api=cluster.api, kubeconfig=kubeconfig)
    finally:
        BINDING_SITE.teardown(cluster.api)


@pytest.fixture(scope="module")
def nics(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandIns]:
    with stand_ins(tmp_path_factory.mktemp("nics"), HW) as s:  # links up, carrying
        yield s


@pytest.fixture(scope="module")
def driver(net_env: NetEnv, nics: StandIns,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetDriverProc]:
    d = NetDriverProc(net_env, tmp_path_factory.mktemp("net-bind-driver"), nics,
                      extra_args=("--binding-conditions", "--binding-failure-after", "1"))
    d.start()
    try:
        wait_for("8 NICs published", lambda: len(published(net_env.api)) == 8, timeout=30)
        yield d
    finally:
        d.kill()


def test_the_driver_answers_with_its_own_identity(net_env: NetEnv,
                                                  driver: NetDriverProc) -> None:
    assert all(d["bindingConditions"] == [CONDITIONS.ready] and d["bindsToNode"]
               for d in published(net_env.api))
    claim, _ = create_claim(net_env.api, "bind-nic")
    core: Any = client.CoreV1Api(net_env.api)
    wait_for("the pod bound to the kwok node", lambda: core.read_namespaced_pod(
        "bind-nic-pod", NAMESPACE).spec.node_name == NODE, timeout=30)
    resp: Any = client.ResourceV1Api(net_env.api).read_namespaced_resource_claim(
        claim.name, NAMESPACE, _preload_content=False)
    doc = json.loads(resp.data)
    [entry] = doc["status"]["devices"]
    got = {c["type"]: (c["status"], c["reason"]) for c in entry["conditions"]}
    assert got == {CONDITIONS.ready: ("True", "LinkUp"), CONDITIONS.failed: ("False", "LinkUp")}
    managers = {m["manager"] for m in doc["metadata"]["managedFields"]
                if m.get("subresource") == "status" and m["operation"] == "Apply"}
    assert managers == {f"{DRIVER}/binding"}
    log = driver.log.read_text()
    assert "Forbidden" not in log and "failed" not in log, log[-2000:]
