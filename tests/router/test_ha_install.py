"""The router's install on the real apiserver, active-active (the
default) and as a hot-standby pair: every object of the `router`
component passes a strict server-side dry run, and its RBAC is enough for
what the router does (discovery, the key Secret; a pair's election Lease
and its pod's role label) and no more, checked by impersonating its
service account."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from harness.waiting import wait_for
from tests.conftest import Cluster
from toposerve.kubeapi import JsonApi
from toposerve.localcluster.pods import model_pod
from toposerve.manifests.render import Names, render_objects, router_namespace
from toposerve.manifests.values import InstallValues, load_values
from toposerve.router.config import LeaseConfig
from toposerve.router.ha.elector import Elector
from toposerve.router.ha.lease import Step
from toposerve.router.ha.pod_label import ROLE_LABEL, PodLabel

pytestmark = pytest.mark.cluster
APPLIED = {"Namespace", "ServiceAccount", "Role", "RoleBinding", "ClusterRole",
           "ClusterRoleBinding", "Secret"}


def _apply(dyn: Any, obj: dict[str, Any], dry_run: bool) -> Any:
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    return dyn.server_side_apply(resource, body=obj, field_manager="toposerve-router-test",
                                 force_conflicts=True, dry_run="All" if dry_run else None,
                                 query_params=[("fieldValidation", "Strict")])


@pytest.fixture(params=["active-active", "hot-standby"])
def install(cluster: Cluster, request: pytest.FixtureRequest
            ) -> Iterator[tuple[InstallValues, list[dict[str, Any]]]]:
    tag = f"tsr-{uuid.uuid4().hex[:6]}"
    url = urlparse(cluster.api.configuration.host)
    # the model servers in the test's namespace too; the mode as asked
    models = ("{apiVersion: toposerve.io/v1, kind: RouterConfig, discovery: {kubernetes: "
              f"{{namespace: {tag}, labelSelector: app=vllm}}}}, "
              f"ha: {{mode: {request.param}}}}}")
    values = load_values(None, [f"apiServer.host={url.hostname}", f"apiServer.port={url.port}",
                                f"namespace={tag}", f"router.namespace={tag}",
                                f"namePrefix={tag}",
                                f"router.config={models}"])
    objects = render_objects(values, ["router"])
    dyn: Any = DynamicClient(cluster.api)  # type: ignore[no-untyped-call]
    applied = [o for o in objects if o["kind"] in APPLIED]
    try:
        for obj in applied:
            _apply(dyn, obj, dry_run=False)
        yield values, objects
    finally:
        rbac: Any = client.RbacAuthorizationV1Api(cluster.api)
        for obj in applied:
            try:
                if obj["kind"] == "ClusterRole":
                    rbac.delete_cluster_role(obj["metadata"]["name"])
                elif obj["kind"] == "ClusterRoleBinding":
                    rbac.delete_cluster_role_binding(obj["metadata"]["name"])
            except ApiException as err:
                if err.status != 404:
                    raise
        client.CoreV1Api(cluster.api).delete_namespace(tag)


def _as(cluster: Cluster, user: str) -> Any:
    api: Any = client.ApiClient(cluster.api.configuration)
    api.set_default_header("Impersonate-User", user)
    return api


def _status(call: Any, *args: Any, **kwargs: Any) -> int:
    try:
        call(*args, **kwargs)
    except ApiException as err:
        return int(err.status)
    return 200


def test_router_objects_pass_a_strict_dry_run(
        cluster: Cluster, install: tuple[InstallValues, list[dict[str, Any]]]) -> None:
    values, objects = install
    dyn: Any = DynamicClient(cluster.api)  # type: ignore[no-untyped-call]
    for obj in objects:
        assert _apply(dyn, obj, dry_run=True).metadata.name == obj["metadata"]["name"]
    kinds = {o["kind"] for o in objects}
    assert {"Deployment", "Service", "ConfigMap", "Role", "ClusterRole", "Secret",
            "PodDisruptionBudget"} <= kinds
    names = Names.of(values.name_prefix)
    dep = next(o for o in objects if o["kind"] == "Deployment"
               and o["metadata"]["name"] == names.router)
    assert dep["spec"]["replicas"] == 2
    assert dep["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert dep["spec"]["template"]["metadata"]["annotations"]["prometheus.io/scrape"] == "true"
    svc = next(o for o in objects if o["kind"] == "Service"
               and o["metadata"]["name"] == names.router)
    cfg = yaml.safe_load(next(o for o in objects if o["kind"] == "ConfigMap"
                              and o["metadata"]["name"] == names.router)["data"]["config.yaml"])
    assert cfg["ha"]["enabled"] is True
    # a pair's Service reaches the leader; active-active's every replica
    assert svc["spec"]["selector"].get(ROLE_LABEL) == (
        "leader" if cfg["ha"]["mode"] == "hot-standby" else None)
    assert cfg["responses"]["redisUrl"].startswith(f"redis://{names.router_redis}.")


def test_router_rbac_is_enough_and_no_more(
        cluster: Cluster, install: tuple[InstallValues, list[dict[str, Any]]]) -> None:
    values, _ = install
    ns, names = router_namespace(values), Names.of(values.name_prefix)
    me = _as(cluster, f"system:serviceaccount:{ns}:{names.router}")
    coordination: Any = client.CoordinationV1Api(me)
    core: Any = client.CoreV1Api(cluster.api)
    core.create_namespaced_pod(ns, model_pod("router-0", "router", "router"))
    if values.router.config.ha.mode == "hot-standby":
        # the election: create, then renew, the Lease the config names
        lease = LeaseConfig(name=names.router, namespace=ns, identity="replica-0")
        elector = Elector(lease, api=JsonApi(me))
        assert elector.round() is Step.CREATE
        assert elector.round() is Step.RENEW
        assert _status(coordination.read_namespaced_lease, "someone-elses", ns) == 403
        # its own pod's role label
        PodLabel(JsonApi(me), ns, "router-0").set(True)
        wait_for("the role label", lambda: (core.read_namespaced_pod("router-0", ns).metadata
                                            .labels or {}).get(ROLE_LABEL) == "leader")
    else:  # active-active needs neither: no Lease, no pod written
        assert _status(coordination.read_namespaced_lease, names.router, ns) == 403
        assert _status(client.CoreV1Api(me).patch_namespaced_pod, "router-0", ns,
                       {"metadata": {"labels": {ROLE_LABEL: "leader"}}}) == 403
    # discovery: model pods in their namespace, nodes' labels
    mine: Any = client.CoreV1Api(me)
    assert _status(mine.list_namespaced_pod, ns, label_selector="app=vllm") == 200
    node = core.list_node().items[0].metadata.name
    assert _status(mine.read_node, node) == 200
    assert _status(mine.list_pod_for_all_namespaces) == 403
    # the key Secret, by name only
    keys = names.router_keys
    assert _status(mine.list_namespaced_secret, ns,
                   field_selector=f"metadata.name={keys}") == 200
    assert _status(mine.list_namespaced_secret, ns) == 403
