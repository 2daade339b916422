"""The install against the real apiserver: every rendered object passes a
server-side dry run with strict field validation; the driver's RBAC is
exactly what docs/install.md lists and is enough for its writes; and the
admission policy lets a node's driver write only its own node's slices,
checked by impersonating the driver's service account with the node name
a pod's token carries."""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
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
from toposerve.localcluster import crds
from toposerve.localcluster.clusters import kubeconfig_path
from toposerve.localcluster.processes import end_process
from toposerve.localcluster.tools import find_tools
from toposerve.manifests.chart import chart_dir
from toposerve.manifests.render import GPU_DRIVER, NET_DRIVER, Names, render_objects
from toposerve.manifests.values import InstallValues, load_values

pytestmark = pytest.mark.cluster
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
FIELD_MANAGER = "toposerve-manifests-test"
# applied for real (the rest only dry-run): what the policy and RBAC tests need
APPLIED = {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
           "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
COMPONENT = "app.kubernetes.io/component"


@dataclass
class Install:
    values: InstallValues
    namespace: str  # the drivers', the router's too
    objects: list[dict[str, Any]]
    names: Names
    driver_user: str
    nodes: list[str]


def _apply(dyn: Any, obj: dict[str, Any], dry_run: bool) -> Any:
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    return dyn.server_side_apply(
        resource, body=obj, field_manager=FIELD_MANAGER, force_conflicts=True,
        dry_run="All" if dry_run else None,
        # an unknown or misspelt field is an error, not a silently dropped warning
        query_params=[("fieldValidation", "Strict")])


@pytest.fixture(scope="module")
def install(cluster: Cluster) -> Iterator[Install]:
    # a namespace and name prefix of its own: nothing clashes with other tests' objects
    tag = f"tsm-{uuid.uuid4().hex[:6]}"
    url = urlparse(cluster.api.configuration.host)
    values = load_values(None, [f"apiServer.host={url.hostname}", f"apiServer.port={url.port}",
                                f"namespace={tag}", f"router.namespace={tag}",
                                f"namePrefix={tag}",
                                "admissionPolicy.includeNetDriver=true",
                                "netDriver.enabled=true",
                                # the pair that labels its pods, which the
                                # pod-writes policy is for (active-active,
                                # the default, may write no pod at all)
                                "router.config.ha.mode=hot-standby"])
    objects = render_objects(values)
    dyn: Any = DynamicClient(cluster.api)  # type: ignore[no-untyped-call]
    applied = [o for o in objects if o["kind"] in APPLIED
               and o["metadata"].get("labels", {}).get(COMPONENT) in
               (None, "gpu-driver", "admission-policy")]
    names = Names.of(tag)
    core: Any = client.CoreV1Api(cluster.api)
    try:
        for obj in applied:
            _apply(dyn, obj, dry_run=False)
        nodes = sorted(n.metadata.name for n in core.list_node().items)
        user = f"system:serviceaccount:{tag}:{names.gpu_driver}"
        # the policy takes a moment to reach the apiserver's admission chain,
        # and every test that writes as the driver relies on it
        wait_for("policy enforced", lambda: _rejection(
            client.ResourceV1Api(_as(cluster, user, nodes[0])), client.ResourceV1Api(cluster.api),
            _slice(f"{tag}-probe", nodes[1])), timeout=30)
        yield Install(values, tag, objects, names, user, nodes[:2])
    finally:
        for obj in reversed(applied):
            if obj["kind"] == "Namespace":
                continue  # last, without waiting for it
            resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            try:
                dyn.delete(resource, name=obj["metadata"]["name"],
                           namespace=obj["metadata"].get("namespace"))
            except ApiException as err:
                if err.status != 404:
                    raise
        core.delete_namespace(tag)


def test_every_object_accepted_by_server_side_dry_run(cluster: Cluster,
                                                      install: Install) -> None:
    dyn: Any = DynamicClient(cluster.api)  # type: ignore[no-untyped-call]
    kinds = set()
    for obj in install.objects:
        got = _apply(dyn, obj, dry_run=True)
        assert got.metadata.name == obj["metadata"]["name"]
        kinds.add(obj["kind"])
    assert {"DaemonSet", "Deployment", "Service", "ConfigMap", "DeviceClass", "Role",
            "RoleBinding", "ValidatingAdmissionPolicy", "PodDisruptionBudget", "Secret"} <= kinds
    # both drivers' DaemonSets (the NIC driver's with its capabilities and mounts)
    assert {o["metadata"]["name"] for o in install.objects if o["kind"] == "DaemonSet"} == {
        install.names.gpu_driver, install.names.net_driver}
    # nothing was created by the dry run
    apps: Any = client.AppsV1Api(cluster.api)
    with pytest.raises(ApiException) as err:
        apps.read_namespaced_daemon_set(
            install.names.gpu_driver, install.namespace)
    assert err.value.status == 404


@pytest.mark.parametrize("overlay", [None, *sorted((chart_dir() / "ci").glob("*-values.yaml"))],
                         ids=lambda p: p.name if p else "defaults")
def test_defaults_and_each_overlay_pass_a_strict_dry_run(cluster: Cluster,
                                                         overlay: Path | None) -> None:
    """What helm would create for a real cluster's defaults and for each
    overlay the chart ships (ci/): every object accepted by a server-side
    dry run with strict field validation, in namespaces of the test's."""
    tag = f"tso-{uuid.uuid4().hex[:6]}"
    values = load_values(overlay, [f"namespace={tag}", f"router.namespace={tag}-r",
                                   f"namePrefix={tag}"])
    objects = render_objects(values)
    rest = JsonApi(cluster.api)
    if any(o["apiVersion"].startswith("monitoring.coreos.com/") for o in objects):
        crds.install_named(rest, ["service-monitor", "pod-monitor"])
    if any(o["apiVersion"].startswith("inference.networking.k8s.io/") for o in objects):
        crds.install_named(rest, ["inference-pool"])
    dyn: Any = DynamicClient(cluster.api)  # type: ignore[no-untyped-call]
    core: Any = client.CoreV1Api(cluster.api)
    namespaces = sorted({str(o["metadata"]["namespace"]) for o in objects
                         if o["metadata"].get("namespace")} - {"default", "kube-system"})
    try:
        for ns in namespaces:  # a dry run needs its namespace to exist
            core.create_namespace({"metadata": {"name": ns}})
        for obj in objects:
            if obj["kind"] != "Namespace":
                got = _apply(dyn, obj, dry_run=True)
                assert got.metadata.name == obj["metadata"]["name"]
    finally:
        for ns in namespaces:
            with contextlib.suppress(ApiException):
                core.delete_namespace(ns)
    assert {o["kind"] for o in objects} >= {"DaemonSet", "Deployment", "Service"}


def test_admission_policy_expressions_type_check(cluster: Cluster, install: Install) -> None:
    """The apiserver type-checks a policy's CEL against the ResourceSlice
    schema after creating it; a mistyped expression shows up here."""
    api: Any = client.AdmissionregistrationV1Api(cluster.api)
    policy: Any = wait_for("policy type-checked", lambda: (
        p if (p := api.read_validating_admission_policy(install.names.slice_policy))
        .status and p.status.type_checking else None), timeout=30)
    assert not policy.status.type_checking.expression_warnings


def _as(cluster: Cluster, user: str, node: str | None) -> Any:
    """A client that acts as ``user``, with a pod token's node name when given.
    An extra's key goes in the header name with '/' percent-encoded; the
    apiserver lower-cases and unescapes it."""
    api: Any = client.ApiClient(cluster.api.configuration)
    api.set_default_header("Impersonate-User", user)
    if node is not None:
        api.set_default_header(
            "Impersonate-Extra-" + NODE_NAME_EXTRA.replace("/", "%2F"), node)
    return api


def _slice(name: str, node: str | None, driver: str = GPU_DRIVER) -> dict[str, Any]:
    spec: dict[str, Any] = {"driver": driver,
                            "pool": {"name": node or "cluster", "generation": 1,
                                     "resourceSliceCount": 1},
                            "devices": [{"name": "gpu-0"}]}
    spec.update({"nodeName": node} if node else {"allNodes": True})
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name}, "spec": spec}


def _denied(call: Any, *args: Any, status: int = 403) -> str:
    with pytest.raises(ApiException) as err:
        call(*args)
    assert err.value.status == status, err.value.body
    return str(err.value.body)


def test_driver_writes_only_its_own_nodes_slices(cluster: Cluster, install: Install) -> None:
    own, other = install.nodes
    tag = install.namespace
    admin: Any = client.ResourceV1Api(cluster.api)
    driver: Any = client.ResourceV1Api(_as(cluster, install.driver_user, own))
    others_slice = f"{tag}-{other}"
    admin.create_resource_slice(_slice(others_slice, other))  # the policy binds drivers only
    created = [others_slice]
    try:
        msg: Any = wait_for("policy enforced", lambda: _rejection(
            driver, admin, _slice(f"{tag}-probe", other)), timeout=30)
        assert (f"the driver on node {own} may write only ResourceSlices with spec.nodeName "
                f"{own}, not {other}") in msg
        mine = f"{tag}-{own}"
        driver.create_resource_slice(_slice(mine, own))
        created.append(mine)
        s = driver.list_resource_slice(field_selector=f"spec.nodeName={own}").items
        assert [x.metadata.name for x in s if x.metadata.name == mine] == [mine]
        # update own: allowed; another node's: denied, before and after alike
        body = admin.read_resource_slice(mine)
        body.spec.pool.generation = 2
        driver.replace_resource_slice(mine, body)
        theirs = admin.read_resource_slice(others_slice)
        theirs.spec.pool.generation = 2
        assert "not " + other in _denied(driver.replace_resource_slice, others_slice, theirs)
        assert "not " + other in _denied(driver.delete_resource_slice, others_slice)
        # a slice for no node (allNodes) is no node's own
        assert "not (no node)" in _denied(driver.create_resource_slice,
                                          _slice(f"{tag}-all", None))
        # a token that names no node (not a pod's) may write nothing
        tokenless: Any = client.ResourceV1Api(_as(cluster, install.driver_user, None))
        assert "its token names no node" in _denied(
            tokenless.create_resource_slice, _slice(f"{tag}-x", own))
        # the NIC driver's account is held to the same rule (admissionPolicy.includeNetDriver);
        # its RBAC comes with its own component later, so here it borrows the GPU driver's
        rbac: Any = client.RbacAuthorizationV1Api(cluster.api)
        rbac.create_cluster_role_binding({
            "metadata": {"name": install.names.net_driver},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": install.names.gpu_driver},
            "subjects": [{"kind": "ServiceAccount", "name": install.names.net_driver,
                          "namespace": tag}]})
        try:
            net_user = f"system:serviceaccount:{tag}:{install.names.net_driver}"
            net: Any = client.ResourceV1Api(_as(cluster, net_user, own))
            assert "not " + other in _denied(net.create_resource_slice,
                                             _slice(f"{tag}-n", other, NET_DRIVER))
        finally:
            rbac.delete_cluster_role_binding(install.names.net_driver)
        driver.delete_resource_slice(mine)
        created.remove(mine)
    finally:
        for name in created:
            admin.delete_resource_slice(name)


def _rejection(driver: Any, admin: Any, body: dict[str, Any]) -> str | None:
    try:
        driver.create_resource_slice(body)
    except ApiException as err:
        if err.status == 403 and "ValidatingAdmissionPolicy" in str(err.body):
            return str(err.body)
        raise
    # not enforced yet: the slice got through, so take it back and try again
    admin.delete_resource_slice(body["metadata"]["name"])
    return None


def _rules(cluster: Cluster, user: str, namespace: str) -> set[tuple[str, str, str, str]]:
    """(verb, group, resource, name) the user may do in the namespace, as the
    apiserver itself lists them."""
    api: Any = client.AuthorizationV1Api(_as(cluster, user, None))
    review = api.create_self_subject_rules_review(
        {"spec": {"namespace": namespace}})
    return {(verb, group, res, name)
            for rule in review.status.resource_rules
            for verb in rule.verbs for group in rule.api_groups for res in rule.resources
            for name in (rule.resource_names or [""])}


def test_driver_rbac_is_exactly_the_listed_rules(cluster: Cluster, install: Install) -> None:
    ns = install.namespace
    granted = _rules(cluster, install.driver_user, ns)
    # what any service account of the namespace may do anyway
    baseline = _rules(cluster, f"system:serviceaccount:{ns}:nobody", ns)
    g = "resource.k8s.io"
    assert granted - baseline == {
        *((v, g, "resourceslices", "") for v in ("get", "list", "watch", "create", "update",
                                                 "delete")),
        ("get", g, "resourceclaims", ""),
        ("update", g, "resourceclaims/status", ""), ("patch", g, "resourceclaims/status", ""),
        ("associated-node:update", g, "resourceclaims/driver", GPU_DRIVER),
        ("associated-node:patch", g, "resourceclaims/driver", GPU_DRIVER),
        ("get", "", "nodes", ""),
        # a Warning on a claim it gives up on; on the Node when it withholds NVIDIA's GPUs
        ("create", "", "events", ""),
    }


def _claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.toposerve.io"}}]}}}


def test_driver_writes_claim_status_only_on_its_node(cluster: Cluster,
                                                     install: Install) -> None:
    """status.devices under DRAResourceClaimGranularStatusAuthorization: the
    `associated-node` verbs pass only for a claim allocated on the node the
    driver's token names, and only for its own driver name."""
    own, other = install.nodes
    ns = install.namespace
    admin: Any = client.ResourceV1Api(cluster.api)
    name = f"claim-{uuid.uuid4().hex[:6]}"
    admin.create_namespaced_resource_claim(ns, _claim(name))
    claim = admin.read_namespaced_resource_claim(name, ns)
    claim.status = client.V1ResourceClaimStatus(allocation={
        "devices": {"results": [{"request": "gpu", "driver": GPU_DRIVER, "pool": own,
                                 "device": "gpu-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [own]}]}]}})
    admin.replace_namespaced_resource_claim_status(name, ns, claim)

    def write(node: str, driver_name: str) -> None:
        api: Any = client.ResourceV1Api(_as(cluster, install.driver_user, node))
        c = api.read_namespaced_resource_claim(name, ns)
        c.status.devices = [{"driver": driver_name, "pool": own, "device": "gpu-0",
                             "conditions": [{"type": "Ready", "status": "True",
                                             "reason": "Prepared", "message": f"by {node}",
                                             "lastTransitionTime": "2026-01-01T00:00:00Z"}]}]
        api.replace_namespaced_resource_claim_status(name, ns, c)

    write(own, GPU_DRIVER)
    got = admin.read_namespaced_resource_claim(name, ns).status.devices
    assert [(d.driver, d.device) for d in got] == [(GPU_DRIVER, "gpu-0")]
    # the status strategy reports a refused driver check as a field error (422)
    # from another node's driver pod: the claim is not allocated there
    assert "arbitrary-node:update" in _denied(write, other, GPU_DRIVER, status=422)
    # another driver's entry: not this account's driver name
    assert 'requires resource=\\"resourceclaims/driver\\"' in _denied(
        write, own, NET_DRIVER, status=422)


def test_scheduler_config_loads_in_kube_scheduler(cluster: Cluster, install: Install,
                                                  tmp_path: Path) -> None:
    """The real kube-scheduler reads the rendered configuration strictly and
    builds its profile and extender from it (--write-config-to exits there)."""
    cm = next(o for o in install.objects if o["kind"] == "ConfigMap"
              and o["metadata"]["name"] == install.names.scheduler)
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    cfg["clientConnection"]["kubeconfig"] = str(kubeconfig_path(cluster.name))
    cfg["leaderElection"]["leaderElect"] = False
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [str(find_tools().kube_scheduler), f"--config={tmp_path / 'config.yaml'}",
         f"--write-config-to={tmp_path / 'out.yaml'}", "--secure-port=0",
         f"--authentication-kubeconfig={kubeconfig_path(cluster.name)}",
         f"--authorization-kubeconfig={kubeconfig_path(cluster.name)}"],
        capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = yaml.safe_load((tmp_path / "out.yaml").read_text())
    assert out["percentageOfNodesToScore"] == 100
    assert [p["schedulerName"] for p in out["profiles"]] == ["toposerve-scheduler",
                                                             "toposerve-ungrouped"]
    assert out["profiles"][1]["percentageOfNodesToScore"] == 0  # adaptive, as the stock one
    (ext,) = out["extenders"]
    assert ext["nodeCacheCapable"] is True and ext["ignorable"] is True
    assert ext["urlPrefix"] == f"http://{install.names.extender}.{install.namespace}.svc:8888"


def test_rbac_is_enough_for_the_real_publisher(cluster: Cluster, install: Install) -> None:
    """The driver's own publisher, acting as its service account from a pod on
    one node: it publishes, updates and uninstalls that node's pool; a pool
    for another node is refused by the policy and reported."""
    from toposerve.dra_driver.resourceslice import SlicePublisher
    from toposerve.dra_driver.resourceslice.slice_plan import Pool

    own, other = install.nodes
    admin: Any = client.ResourceV1Api(cluster.api)
    pub = SlicePublisher(_as(cluster, install.driver_user, own), GPU_DRIVER, node_name=own)

    def mine() -> list[Any]:
        return [s for s in admin.list_resource_slice(
            field_selector=f"spec.nodeName={own},spec.driver={GPU_DRIVER}").items]

    devices = tuple({"name": f"gpu-{i}"} for i in range(4))
    try:
        pub.set_pools([Pool(name=own, node_name=own, devices=devices)])
        assert pub.reconcile_once().creates == 1
        (s,) = mine()
        assert s.metadata.owner_references[0].name == own  # read the Node's UID: nodes get
        pub.set_pools([Pool(name=own, node_name=own, devices=devices[:2])])
        assert pub.reconcile_once().updates == 1
        assert pub.reconcile_once().writes == 0
        pub.set_pools([Pool(name=own, node_name=own, devices=devices),
                       Pool(name=other, node_name=other, devices=devices)])
        pub.reconcile_once()
        assert f"may write only ResourceSlices with spec.nodeName {own}" in pub.last_error
        assert not admin.list_resource_slice(field_selector=f"spec.nodeName={other},"
                                                            f"spec.driver={GPU_DRIVER}").items
        assert pub.uninstall() == 1
        assert mine() == []
    finally:
        for s in mine():
            admin.delete_resource_slice(s.metadata.name)


def _expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's $(VAR) expansion of a container's command."""
    for k, v in env.items():
        arg = arg.replace(f"$({k})", v)
    return arg


def test_daemonset_command_runs_the_driver_and_its_probe(cluster: Cluster) -> None:
    """The DaemonSet's command and liveness probe, as the kubelet would run
    them, on the host against a fake sysfs: the real driver accepts every
    flag, publishes its node's slices, and the probe passes on its sockets."""
    from toposerve.topology.profiles import load_profile
    from toposerve.topology.sysfs import write_profile_sysfs

    node = "mi300x-0001"
    tmp = Path(tempfile.mkdtemp(prefix="tsm-", dir="/tmp"))  # short: unix socket paths
    write_profile_sysfs(load_profile("mi300x"), tmp / "sys")
    (tmp / "dev").mkdir()
    (tmp / "kubelet/plugins_registry").mkdir(parents=True)
    values = load_values(None, ["apiServer.host=127.0.0.1", f"gpuDriver.kubeletDir={tmp}/kubelet",
                                f"gpuDriver.cdiRoot={tmp}/cdi", f"gpuDriver.sysfsRoot={tmp}/sys",
                                f"gpuDriver.devRoot={tmp}/dev"])
    ds = next(o for o in render_objects(values, ["gpu-driver"]) if o["kind"] == "DaemonSet")
    container = ds["spec"]["template"]["spec"]["containers"][0]
    env = {"NODE_NAME": node, "POD_UID": str(uuid.uuid4())}
    # the host has no pod token: the cluster's own kubeconfig in place of the rendered one
    cmd = [_expand(a, env) for a in container["command"]]
    cmd = [f"--kubeconfig={kubeconfig_path(cluster.name)}" if a.startswith("--kubeconfig=")
           else a for a in cmd]
    cmd[:1] = [sys.executable, "-m", "toposerve.main"]  # the `toposerve` of this tree
    probe = [sys.executable, *container["livenessProbe"]["exec"]["command"][1:]]
    res: Any = client.ResourceV1Api(cluster.api)
    selector = f"spec.nodeName={node},spec.driver={GPU_DRIVER}"
    proc = subprocess.Popen(cmd, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        wait_for("driver's slices", lambda: proc.poll() is not None or res.list_resource_slice(
            field_selector=selector).items, timeout=30)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        ok = wait_for("probe passing", lambda: subprocess.run(
            probe, env={**os.environ, **env}, capture_output=True, timeout=30,
            check=False).returncode == 0, timeout=30, interval=0.5)
        assert ok
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, proc.stderr.read() if proc.stderr else ""
        assert not list((tmp / "kubelet/plugins_registry").iterdir())  # its socket is gone
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for s in res.list_resource_slice(field_selector=selector).items:
            res.delete_resource_slice(s.metadata.name)
        shutil.rmtree(tmp)


def test_extender_deployment_command_serves(cluster: Cluster, tmp_path: Path) -> None:
    """The extender's Deployment command with its rendered ExtenderConfig, on
    the host: it loads the config, syncs its watches and answers /ready on
    the port the scheduler is configured to call."""
    import socket
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    objs = render_objects(load_values(None, ["apiServer.host=127.0.0.1",
                                             f"extender.port={port}"]), ["extender"])
    cm = next(o for o in objs if o["kind"] == "ConfigMap"
              and o["metadata"]["name"].endswith("-extender"))
    # the decision key its Secret mounts: a file of the same kind here
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    (tmp_path / "key").write_text("k" * 32)
    cfg["decisionKeyFile"] = str(tmp_path / "key")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    dep = next(o for o in objs if o["kind"] == "Deployment")
    cmd = dep["spec"]["template"]["spec"]["containers"][0]["command"]
    cmd = [f"--config={tmp_path / 'config.yaml'}" if a.startswith("--config=")
           else f"--kubeconfig={kubeconfig_path(cluster.name)}" if a.startswith("--kubeconfig=")
           else a for a in cmd]
    cmd[:1] = [sys.executable, "-m", "toposerve.main"]

    def ready() -> bool:
        if proc.poll() is not None:
            return True
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        wait_for("extender ready", ready, timeout=30, interval=0.3)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
    finally:
        end_process(proc, 30)


def _patcher(cluster: Cluster, install: Install, component: str,
             request: pytest.FixtureRequest) -> Any:
    """A client acting as ``component``'s service account, with its rendered
    RBAC applied (the router's Role, the extender's ClusterRole; the
    namespaced ones go with the namespace, the cluster's when the test ends)."""
    dyn: Any = DynamicClient(cluster.api)  # type: ignore[no-untyped-call]
    for obj in install.objects:
        if (obj["kind"] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding",
                            "ServiceAccount")
                and obj["metadata"].get("labels", {}).get(COMPONENT) == component
                and obj["metadata"].get("namespace", install.namespace)
                == install.namespace):
            _apply(dyn, obj, dry_run=False)
            if obj["kind"].startswith("Cluster"):
                resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
                request.addfinalizer(functools.partial(dyn.delete, resource,
                                                       name=obj["metadata"]["name"]))
    name = getattr(install.names, component)
    return client.CoreV1Api(_as(cluster, f"system:serviceaccount:{install.namespace}:"
                                         f"{name}", None))


def test_router_and_extender_change_only_their_own_pod_metadata(
        cluster: Cluster, install: Install, request: pytest.FixtureRequest) -> None:
    """The pod-writes policy on the real apiserver, by impersonation: the
    router may set its role label on its own pods and nothing else; the
    extender its placement annotations; neither a pod's spec (its image)."""
    ns = install.namespace
    core: Any = client.CoreV1Api(cluster.api)
    router_labels = next(o for o in install.objects if o["kind"] == "Deployment"
                         and o["metadata"]["name"] == install.names.router
                         )["spec"]["selector"]["matchLabels"]

    def pod(name: str, labels: dict[str, str]) -> str:
        core.create_namespaced_pod(ns, {
            "metadata": {"name": name, "labels": labels},
            "spec": {"containers": [{"name": "c", "image": "localhost/driver:1"}],
                     "nodeName": install.nodes[0]}})
        return name

    router_pod = pod("router-0", router_labels)
    driver_pod = pod("gpu-driver-0", {COMPONENT: "gpu-driver"})
    router = _patcher(cluster, install, "router", request)
    extender = _patcher(cluster, install, "extender", request)
    role = {"metadata": {"labels": {"toposerve.io/router-role": "leader"}}}
    image = {"spec": {"containers": [{"name": "c", "image": "evil:1"}]}}

    def denied_by_policy() -> str | None:
        try:
            router.patch_namespaced_pod(driver_pod, ns, image)
        except ApiException as err:
            if err.status == 403 and "ValidatingAdmissionPolicy" in str(err.body):
                return str(err.body)
            if err.status == 403:
                return None  # RBAC not there yet
            raise
        raise AssertionError("the router changed a driver pod's image")

    msg: Any = wait_for("pod policy enforced", denied_by_policy, timeout=30)
    assert "may not change a pod's spec" in msg
    router.patch_namespaced_pod(router_pod, ns, role)
    assert core.read_namespaced_pod(router_pod, ns).metadata.labels[
        "toposerve.io/router-role"] == "leader"
    assert "may label only its own pods" in _denied(
        router.patch_namespaced_pod, driver_pod, ns, role)
    assert "the router may change only toposerve.io/router-role" in _denied(
        router.patch_namespaced_pod, router_pod, ns, {"metadata": {"labels": {"x": "y"}}})
    assert "may not change a pod's spec" in _denied(
        router.patch_namespaced_pod, router_pod, ns, image)
    assert "the router none" in _denied(router.patch_namespaced_pod, router_pod, ns, {
        "metadata": {"annotations": {"toposerve.io/placement": "{}"}}})

    extender.patch_namespaced_pod(driver_pod, ns, {"metadata": {"annotations": {
        "toposerve.io/placement": "{}", "toposerve.io/group-size-seen": "4"}}})
    assert "may not change a pod's spec" in _denied(
        extender.patch_namespaced_pod, driver_pod, ns, image)
    assert "the extender none" in _denied(extender.patch_namespaced_pod, driver_pod, ns, role)
    assert "the extender may change only" in _denied(
        extender.patch_namespaced_pod, driver_pod, ns,
        {"metadata": {"annotations": {"other": "x"}}})
    got = core.read_namespaced_pod(driver_pod, ns)
    assert got.spec.containers[0].image == "localhost/driver:1"
    assert "toposerve.io/router-role" not in (got.metadata.labels or {})
