"""The router installed as a Gateway's endpoint picker (docs/gateway.md):
the Deployment runs `toposerve router --mode endpoint-picker` with its
gRPC port, the Service exposes that port as gateways expect an EPP's, the
InferencePool the chart creates points at that Service and port and is
what the router reads (with the RBAC for it), a standalone install has
none of it, and on the real apiserver with the extension's CRD every
object passes a strict server-side dry run."""

from __future__ import annotations

import copy
import subprocess
import sys
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml
from grpc_health.v1 import health_pb2, health_pb2_grpc

from harness.waiting import wait_for
from tests.conftest import Cluster
from tests.manifests.helpers import CLAIMS_RULES, Obj, objects, one
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster import crds
from toposerve.localcluster.clusters import kubeconfig_path
from toposerve.localcluster.ports import free_port
from toposerve.localcluster.processes import end_process
from toposerve.manifests.chart import chart_dir, find_helm
from toposerve.manifests.render import render_objects
from toposerve.manifests.values import load_values
from toposerve.router.config import RouterConfig
from toposerve.router.epp.fit import unfit
from toposerve.topology.config_file import ConfigError

OVERLAY = chart_dir() / "ci" / "endpoint-picker-values.yaml"
POOL_CRD = "inference.networking.k8s.io/v1"


def _picker(*sets: str) -> list[Obj]:
    """The router component of the shipped overlay, with ``sets`` over it."""
    return render_objects(load_values(OVERLAY, list(sets)), ["router"])


def _router(objs: list[Obj]) -> list[Obj]:
    return [o for o in objs if o["kind"] == "Deployment"
            and o["metadata"]["labels"]["app.kubernetes.io/component"] == "router"]


def _container(deployment: Obj) -> Obj:
    (c,) = [c for c in deployment["spec"]["template"]["spec"]["containers"]
            if c["name"] == "router"]
    return dict(c)


def _config(objs: list[Obj], key: str = "config.yaml") -> RouterConfig:
    data = one(objs, "ConfigMap", "toposerve-router")["data"]
    return RouterConfig.model_validate(yaml.safe_load(data[key]))


@pytest.mark.unit
def test_the_deployment_runs_the_picker_on_its_grpc_port() -> None:
    objs = _picker()
    (dep,) = _router(objs)
    c = _container(dep)
    assert c["command"][2:4] == ["router", "--mode=endpoint-picker"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {"http": 8080, "grpc": 9002}
    # the probes stay HTTP on the http port: a standby is ready (role=any)
    assert c["readinessProbe"]["httpGet"] == {"port": "http", "path": "/ready?role=any"}
    cfg = _config(objs)
    assert (cfg.endpoint_picker.host, cfg.endpoint_picker.port) == ("0.0.0.0", 9002)
    assert (cfg.server.host, cfg.server.port) == ("0.0.0.0", 8080)
    # the pair keeps its Lease: a standby takes over with its indexes warm
    assert cfg.ha.enabled and cfg.ha.lease.name == "toposerve-router"
    # what the picker would refuse at start (exit 2) the install never renders
    assert unfit(cfg) is None


@pytest.mark.unit
def test_the_service_exposes_grpc_as_gateways_expect() -> None:
    objs = _picker()
    svc = one(objs, "Service", "toposerve-router")
    grpc, http = svc["spec"]["ports"]
    assert grpc == {"name": "grpc-ext-proc", "port": 9002, "targetPort": "grpc",
                    "protocol": "TCP", "appProtocol": "http2"}
    assert http["name"] == "http" and http["port"] == 8080
    # the leader only, as in standalone mode; it selects the Deployment's pods
    (dep,) = _router(objs)
    pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    selector = dict(svc["spec"]["selector"])
    assert selector.pop("toposerve.io/router-role") == "leader"
    assert selector.items() <= pod_labels.items()


@pytest.mark.unit
def test_the_pool_points_at_the_service_and_is_what_the_router_reads() -> None:
    objs = _picker()
    pool = one(objs, "InferencePool", "llama")
    svc = one(objs, "Service", "toposerve-router")
    assert pool["apiVersion"] == POOL_CRD
    ns = pool["metadata"]["namespace"]
    assert ns == svc["metadata"]["namespace"] == "serving"  # a ref names its own namespace
    ref = pool["spec"]["endpointPickerRef"]
    assert ref["name"] == svc["metadata"]["name"]
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == ref["port"]["number"]]
    (dep,) = _router(objs)
    container_ports = {p["name"]: p["containerPort"] for p in _container(dep)["ports"]}
    assert container_ports[port["targetPort"]] == _config(objs).endpoint_picker.port
    assert ref["failureMode"] == "FailClose"
    assert pool["spec"]["selector"] == {"matchLabels": {"app": "vllm-llama"}}
    assert pool["spec"]["targetPorts"] == [{"number": 8000}, {"number": 8001}]
    assert "appProtocol" not in pool["spec"]  # the CRD's default unless given
    # the router's discovery is that pool, the default pod labels replaced
    discovery = _config(objs).discovery
    assert discovery.kubernetes is None and not discovery.static
    assert discovery.inference_pool is not None
    assert (discovery.inference_pool.name, discovery.inference_pool.namespace) == ("llama", ns)


@pytest.mark.unit
def test_the_pool_gets_its_rbac_by_name() -> None:
    objs = _picker()
    role = one(objs, "Role", "toposerve-router-model-pods")
    assert role["metadata"]["namespace"] == "serving"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        *CLAIMS_RULES,
        {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
         "resourceNames": ["llama"], "verbs": ["get", "list", "watch"]}]
    binding = one(objs, "RoleBinding", "toposerve-router-model-pods")
    assert binding["roleRef"]["name"] == "toposerve-router-model-pods"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "toposerve-router",
                                    "namespace": "serving"}]


@pytest.mark.unit
def test_pool_options_reach_the_object() -> None:
    objs = _picker("router.inferencePool.name=", "router.inferencePool.failureMode=FailOpen",
                   "router.inferencePool.appProtocol=kubernetes.io/h2c", "router.pickerPort=9100")
    pool = one(objs, "InferencePool", "toposerve-pool")  # the default name
    assert pool["spec"]["endpointPickerRef"] == {
        "name": "toposerve-router", "port": {"number": 9100}, "failureMode": "FailOpen"}
    assert pool["spec"]["appProtocol"] == "kubernetes.io/h2c"
    assert _config(objs).endpoint_picker.port == 9100


@pytest.mark.unit
def test_picker_without_a_pool_keeps_the_configs_discovery() -> None:
    """A gateway configured by hand (a static Envoy) needs no InferencePool:
    the router reads the config's discovery, and no pool is rendered."""
    objs = render_objects(load_values(None, ["router.mode=endpoint-picker"]), ["router"])
    assert not [o for o in objs if o["kind"] == "InferencePool"]
    cfg = _config(objs)
    assert cfg.discovery.kubernetes is not None and cfg.discovery.inference_pool is None
    assert cfg.endpoint_picker.port == 9002


@pytest.mark.unit
def test_on_the_node_network_each_replica_has_its_grpc_port() -> None:
    objs = _picker("router.hostNetwork=true", "router.replicas=3", "apiServer.host=127.0.0.1")
    deps = sorted(_router(objs), key=lambda d: str(d["metadata"]["name"]))
    assert len(deps) == 3
    for i, dep in enumerate(deps):
        ports = {p["name"]: p["containerPort"] for p in _container(dep)["ports"]}
        assert ports == {"http": 8080 + i, "grpc": 9002 + i}
        cfg = _config(objs, f"config-{i}.yaml")
        assert (cfg.endpoint_picker.host, cfg.endpoint_picker.port) == ("127.0.0.1", 9002 + i)


@pytest.mark.unit
def test_standalone_renders_none_of_it() -> None:
    objs = objects(only=["router"])
    assert not [o for o in objs if o["kind"] == "InferencePool"]
    svc = one(objs, "Service", "toposerve-router")
    assert [p["name"] for p in svc["spec"]["ports"]] == ["http"]
    for dep in _router(objs):
        c = _container(dep)
        assert "--mode=endpoint-picker" not in c["command"]
        assert [p["name"] for p in c["ports"]] == ["http"]
    assert "endpointPicker" not in one(objs, "ConfigMap", "toposerve-router")["data"][
        "config.yaml"]


@pytest.mark.unit
@pytest.mark.parametrize("sets, says", [
    (["router.inferencePool.create=true", "router.inferencePool.selector.app=x"],
     "router.mode: endpoint-picker"),
    (["router.mode=endpoint-picker", "router.inferencePool.create=true"],
     "selector: give the labels"),
    (["router.mode=endpoint-picker", "router.inferencePool.create=true",
      "router.inferencePool.selector.app=x", "router.inferencePool.targetPorts=[8000, 8000]"],
     "a port appears twice"),
    (["router.mode=endpoint-picker", "router.inferencePool.create=true",
      "router.inferencePool.selector.app=x",
      "router.config.discovery.inferencePool={name: other}", "router.config.discovery.kubernetes="],
     "leave config.discovery.static and config.discovery.inferencePool out"),
    (["router.mode=endpoint-picker", "router.pickerPort=8080"], "give ports further apart"),
    (["router.mode=endpoint-picker", "router.hostNetwork=true", "router.pickerPort=8081",
      "apiServer.host=127.0.0.1"], "each replica on the next"),
    # what the picker would refuse at start, refused before a pod runs
    (["router.mode=endpoint-picker", "router.config.disaggregation.enabled=true"],
     "config.disaggregation.enabled: the endpoint picker does not split requests"),
    (["router.mode=endpoint-picker",
      "router.config.discovery={kubernetes: null, static: [{url: 'http://vllm-0:8000'}]}"],
     "config.discovery.static[0].url: http://vllm-0:8000 names a host"),
])
def test_values_that_cannot_work_are_one_line(sets: list[str], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_values(None, sets)
    assert says in str(err.value) and "\n" not in str(err.value)


@pytest.mark.unit
def test_helm_alone_refuses_an_unknown_mode() -> None:
    """helm install --set without toposerve's CLI: the schema names the field."""
    done = subprocess.run([str(find_helm()), "template", "t", str(chart_dir()),
                           "--set", "router.mode=picker"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0 and "mode" in done.stderr, done.stderr


# --- on the real API server ---

STRICT = [("dryRun", "All"), ("fieldValidation", "Strict")]
POOLS = "/apis/inference.networking.k8s.io/v1/namespaces/{}/inferencepools"


@pytest.mark.cluster
def test_picker_objects_pass_a_strict_dry_run(cluster: Cluster) -> None:
    """With the extension's InferencePool CRD (v1.6.0) served, everything the
    picker install renders is accepted by a server-side dry run with strict
    field validation; the pool comes back as written (plus the CRD's
    defaults), and a pool whose reference misspells a field is refused."""
    rest = JsonApi(cluster.api)
    crds.install_named(rest, ["inference-pool"])
    tag = f"tse-{uuid.uuid4().hex[:6]}"
    objs = render_objects(load_values(OVERLAY, [f"router.namespace={tag}", f"namePrefix={tag}"]),
                          ["router"])
    kinds = sorted({o["kind"] for o in objs})
    assert {"Deployment", "Service", "InferencePool", "Role", "RoleBinding"} <= set(kinds)
    rest.request("POST", "/api/v1/namespaces", body={"metadata": {"name": tag}})
    try:
        for obj in objs:
            ns = obj["metadata"].get("namespace")
            path = _path(rest, obj)
            got = rest.request("POST", path.format(ns) if ns else path, STRICT, body=obj)
            assert got["metadata"]["name"] == obj["metadata"]["name"]
            if obj["kind"] == "InferencePool":
                want = copy.deepcopy(obj["spec"])
                want["appProtocol"] = "http"
                want["endpointPickerRef"].update(group="", kind="Service")
                assert got["spec"] == want
        bad = copy.deepcopy(one(objs, "InferencePool", "llama"))
        bad["spec"]["endpointPickerRef"]["portt"] = {"number": 9002}
        with pytest.raises(ApiError) as err:
            rest.request("POST", POOLS.format(tag), STRICT, body=bad)
        assert err.value.status in (400, 422) and "portt" in str(err.value)
    finally:
        rest.request("DELETE", f"/api/v1/namespaces/{tag}")


def _path(rest: JsonApi, obj: Obj) -> str:
    """The collection path of ``obj``'s kind, namespaced ones with a {} for
    the namespace, from the apiserver's discovery."""
    group_version = str(obj["apiVersion"])
    base = f"/api/{group_version}" if "/" not in group_version else f"/apis/{group_version}"
    found: Any = rest.request("GET", base)
    (res,) = [r for r in found["resources"] if r["kind"] == obj["kind"] and "/" not in r["name"]]
    return f"{base}/namespaces/{{}}/{res['name']}" if res["namespaced"] else f"{base}/{res['name']}"


@pytest.mark.cluster
def test_the_deployments_command_serves_the_pool(cluster: Cluster, tmp_path: Path) -> None:
    """The picker Deployment's command with its rendered config, on the host
    against the real apiserver: it reads the InferencePool the chart made
    (applied for real) and answers gRPC health on the port the pool's
    endpointPickerRef names, and /ready?role=any on the probe's port."""
    rest = JsonApi(cluster.api)
    crds.install_named(rest, ["inference-pool"])
    tag = f"tsc-{uuid.uuid4().hex[:6]}"
    http_port, grpc_port = free_port(), free_port()
    objs = _picker(f"router.namespace={tag}", "router.replicas=1", "router.apiKeys.enabled=false",
                   "apiServer.host=127.0.0.1", f"router.port={http_port}",
                   f"router.pickerPort={grpc_port}")
    pool = one(objs, "InferencePool", "llama")
    assert pool["spec"]["endpointPickerRef"]["port"]["number"] == grpc_port
    cfg = yaml.safe_load(one(objs, "ConfigMap", "toposerve-router")["data"]["config.yaml"])
    # here: loopback, the test cluster's kubeconfig, no Redis (one replica shares nothing)
    kubeconfig = str(kubeconfig_path(cluster.name))
    cfg["server"]["host"] = cfg["endpointPicker"]["host"] = "127.0.0.1"
    cfg["discovery"]["inferencePool"]["kubeconfig"] = kubeconfig
    cfg["ha"].pop("lease")
    cfg["responses"] = {"backend": "memory"}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (dep,) = _router(objs)
    cmd = [f"--config={tmp_path / 'config.yaml'}" if a.startswith("--config=") else a
           for a in _container(dep)["command"]]
    cmd[:1] = [sys.executable, "-m", "toposerve.main"]
    rest.request("POST", "/api/v1/namespaces", body={"metadata": {"name": tag}})
    proc = None
    try:
        rest.request("POST", POOLS.format(tag), body=pool)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                text=True)

        def ready() -> bool:
            if proc.poll() is not None:
                return True
            try:
                with urllib.request.urlopen(
                        f"http://127.0.0.1:{http_port}/ready?role=any", timeout=2) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_for("picker warm", ready, timeout=30, interval=0.3)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:
            check = health_pb2_grpc.HealthStub(channel).Check
            alive = check(health_pb2.HealthCheckRequest(service="liveness"), timeout=5)
            assert alive.status == health_pb2.HealthCheckResponse.SERVING
            # an empty pool: alive, and not ready to pick (no endpoint)
            picking = check(health_pb2.HealthCheckRequest(
                service="envoy.service.ext_proc.v3.ExternalProcessor"), timeout=5)
            assert picking.status == health_pb2.HealthCheckResponse.NOT_SERVING
    finally:
        if proc is not None:
            end_process(proc, 30)
        rest.request("DELETE", f"/api/v1/namespaces/{tag}")
