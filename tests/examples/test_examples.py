"""The cookbook in examples/: every file parses, says on its first line what
it asks for, names only DeviceClasses the install creates and attributes the
drivers publish, writes only LeaderWorkerSet and DisaggregatedSet fields the
upstream API has, and (cluster) every object passes the real apiserver's
server-side dry run with strict field validation."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient

from harness.extender_objects import planned
from tests.conftest import Cluster
from toposerve.dra_driver.gpu.devices import gpu_pool
from toposerve.dra_driver.net.devices import nic_pool
from toposerve.kubeapi import JsonApi
from toposerve.localcluster.scale.runner import install_crds
from toposerve.manifests.render import GPU_DRIVER, NET_DRIVER, render_objects
from toposerve.manifests.values import load_values
from toposerve.topology.labels import PRESETS, DialectName
from toposerve.topology.model import NodeTopology
from toposerve.topology.profiles import load_profile
from toposerve.topology.workloads import LLMD_ROLE, LWS_EXCLUSIVE

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
FILES = sorted(EXAMPLES.glob("*.yaml"))
KIND_CONFIG = EXAMPLES / "09-kind-cluster.yaml"  # for kind, not the apiserver
MANIFESTS = [f for f in FILES if f != KIND_CONFIG]
STD = "resource.kubernetes.io"
ROLES = {"prefill", "decode", "prefill-decode"}  # what the router's role filter knows

# The LeaderWorkerSet and DisaggregatedSet spec fields of kubernetes-sigs/lws at
# 060ab4d (config/crd/bases/*.yaml). A dict is an object's fields, a frozenset
# the values an enum allows, None any value, POD a PodTemplateSpec (dry-run by
# the apiserver as a PodTemplate, since the test cluster's CRDs take any spec).
POD = "PodTemplateSpec"
LWS_SPEC: dict[str, Any] = {
    "replicas": None,
    "startupPolicy": frozenset({"LeaderCreated", "LeaderReady"}),
    "networkConfig": {"subdomainPolicy": None},
    "rolloutStrategy": {"type": None, "rollingUpdateConfiguration": {
        "maxSurge": None, "maxUnavailable": None, "partition": None}},
    "leaderWorkerTemplate": {
        "leaderTemplate": POD, "workerTemplate": POD, "size": None,
        "restartPolicy": frozenset({"Default", "RecreateGroupOnPodRestart",
                                    "RecreateGroupAfterStart", "None"}),
        "subGroupPolicy": {"subGroupPolicyType": None, "subGroupSize": None},
        "persistentVolumeClaimRetentionPolicy": {"whenDeleted": None, "whenScaled": None},
        "volumeClaimTemplates": None},
}
OBJECT_META = {k: None for k in ("name", "namespace", "labels", "annotations", "finalizers")}
DS_SPEC: dict[str, Any] = {
    "slices": None,
    "placementPolicy": {"type": frozenset({"None", "ExclusiveSlice", "ExclusiveTopology"}),
                        "topology": None},
    "roles": [{"name": None, "scaling": {"mode": frozenset({"Static", "External"})},
               "metadata": OBJECT_META, "spec": LWS_SPEC}],
}
UPSTREAM = {"LeaderWorkerSet": LWS_SPEC, "DisaggregatedSet": DS_SPEC}


def device_classes() -> list[dict[str, Any]]:
    """The DeviceClasses the install creates, by their default names."""
    return render_objects(load_values(None, ["apiServer.host=127.0.0.1"]), ["device-classes"])


def objects(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def all_objects() -> Iterator[tuple[Path, dict[str, Any]]]:
    for f in MANIFESTS:
        for obj in objects(f):
            yield f, obj


def claim_specs() -> Iterator[tuple[str, dict[str, Any]]]:
    for f, obj in all_objects():
        if obj["kind"] == "ResourceClaimTemplate":
            yield f"{f.name}/{obj['metadata']['name']}", obj["spec"]["spec"]


def pod_templates(path: str, value: Any, schema: Any) -> Iterator[tuple[str, Any]]:
    """Every field of ``value`` checked against ``schema``; the pod templates
    found on the way, by their path."""
    if schema == POD:
        yield path, value
    elif isinstance(schema, dict):
        assert isinstance(value, dict), f"{path}: not an object"
        for k, v in value.items():
            assert k in schema, f"{path}.{k}: no such field upstream"
            yield from pod_templates(f"{path}.{k}", v, schema[k])
    elif isinstance(schema, list):
        assert isinstance(value, list), f"{path}: not a list"
        for i, v in enumerate(value):
            yield from pod_templates(f"{path}[{i}]", v, schema[0])
    elif isinstance(schema, frozenset):
        assert value in schema, f"{path}: {value!r} is not one of {sorted(schema)}"


def templates_of(obj: dict[str, Any]) -> list[tuple[str, Any]]:
    return list(pod_templates("spec", obj["spec"], UPSTREAM[obj["kind"]]))


@pytest.mark.unit
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_parses_and_says_what_it_asks_first(path: Path) -> None:
    first = path.read_text().splitlines()[0]
    assert re.fullmatch(r"# \S.{20,}", first), f"{path.name}: first line {first!r}"
    docs = objects(path)
    assert docs and all({"apiVersion", "kind"} <= d.keys() for d in docs)


@pytest.mark.unit
def test_the_cookbook_has_every_recipe() -> None:
    kinds = {o["kind"] for _, o in all_objects()}
    assert {"ResourceClaimTemplate", "Pod", "Deployment", "LeaderWorkerSet",
            "DisaggregatedSet"} <= kinds
    assert objects(KIND_CONFIG)[0]["kind"] == "Cluster"
    readme = (EXAMPLES / "README.md").read_text()
    assert all(f"]({f.name})" in readme for f in FILES)


@pytest.mark.unit
def test_device_classes_are_the_installs() -> None:
    installed = {o["metadata"]["name"] for o in device_classes()}
    named = {r["exactly"]["deviceClassName"] for _, spec in claim_specs()
             for r in spec["devices"]["requests"]}
    assert named <= installed, named - installed


def _published() -> dict[str, list[dict[str, Any]]]:
    """Each driver's device attributes on an HGX H100 node with its whole domain path."""
    (n,) = planned(("hgx-h100", 1))
    topo = NodeTopology(name=n.name, path=n.path, profile=n.profile,
                        hardware=load_profile(n.profile).hardware())
    return {GPU_DRIVER: [d["attributes"] for d in gpu_pool(topo).devices],
            NET_DRIVER: [d["attributes"] for d in nic_pool(topo).devices]}


CEL_EQUALS = re.compile(r"device\.attributes\['([^']+)'\]\.(\w+) == '([^']*)'")
CEL_HAS = re.compile(r"'(\w+)' in device\.attributes\['([^']+)'\]")


@pytest.mark.unit
def test_attributes_are_what_the_drivers_publish() -> None:
    published = _published()
    checked = 0
    for where, spec in claim_specs():
        for c in spec["devices"].get("constraints", []):
            domain, name = c["matchAttribute"].split("/")
            drivers = list(published) if domain == STD else [domain]
            key = c["matchAttribute"] if domain == STD else name
            for drv in drivers:
                assert any(key in a for a in published[drv]), f"{where}: {drv} has no {key}"
            checked += 1
        for r in spec["devices"]["requests"]:
            for sel in r["exactly"].get("selectors", []):
                expr = sel["cel"]["expression"]
                for drv, name, value in CEL_EQUALS.findall(expr):
                    assert {"string": value} in (a.get(name) for a in published[drv]), \
                        f"{where}: no {drv} device has {name} == {value!r}"
                    checked += 1
                for name, drv in CEL_HAS.findall(expr):
                    assert any(name in a for a in published[drv]), f"{where}: {drv} has no {name}"
                    checked += 1
    assert checked >= 20


@pytest.mark.unit
def test_lws_and_disaggregatedset_fields_exist_upstream() -> None:
    found = [(o["kind"], len(templates_of(o))) for _, o in all_objects() if o["kind"] in UPSTREAM]
    assert sorted(found) == [("DisaggregatedSet", 2), ("LeaderWorkerSet", 2)]


@pytest.mark.unit
def test_workloads_carry_what_the_scheduler_and_router_read() -> None:
    rack = PRESETS[DialectName.TOPOSERVE].rack
    pods: list[dict[str, Any]] = []
    for _, o in all_objects():
        if o["kind"] == "LeaderWorkerSet":
            assert o["metadata"]["annotations"][LWS_EXCLUSIVE] == rack
        if o["kind"] == "DisaggregatedSet":
            assert o["spec"]["placementPolicy"]["topology"] == rack
        if o["kind"] in UPSTREAM:
            pods += [t for _, t in templates_of(o)]
            assert all(t["spec"]["schedulerName"] == "toposerve-scheduler"
                       for _, t in templates_of(o))
        if o["kind"] == "Deployment":
            pods.append(o["spec"]["template"])
    serving = [p for p in pods if LLMD_ROLE in p["metadata"]["labels"]]
    assert {p["metadata"]["labels"][LLMD_ROLE] for p in serving} <= ROLES
    for p in serving:
        (c,) = p["spec"]["containers"]
        args = [*c.get("command", []), *c.get("args", [])]
        ports = {x["containerPort"] for x in c["ports"]}
        events = next(json.loads(a.split("=", 1)[1]) for a in args
                      if a.startswith("--kv-events-config="))
        assert events["publisher"] == "zmq"
        assert int(events["endpoint"].rsplit(":", 1)[1]) in ports
        assert c["resources"]["claims"], "a model server without a device claim"


# --- against the real apiserver ---------------------------------------------------

FIELD_MANAGER = "toposerve-examples-test"


@pytest.fixture(scope="module")
def namespace(cluster: Cluster) -> Iterator[str]:
    """A namespace of the module's own, the CRDs the test cluster serves for LWS
    and DisaggregatedSet, and the install's DeviceClasses (those this module
    created are removed again; ones another test made are left alone)."""
    rest = JsonApi(cluster.api)
    install_crds(rest)
    ns = f"ex-{uuid.uuid4().hex[:6]}"
    core: Any = client.CoreV1Api(cluster.api)
    res: Any = client.ResourceV1Api(cluster.api)
    core.create_namespace({"metadata": {"name": ns}})
    created = []
    try:
        for dc in device_classes():
            try:
                res.create_device_class(dc)
                created.append(dc["metadata"]["name"])
            except ApiException as err:
                if err.status != 409:
                    raise
        yield ns
    finally:
        for name in created:
            res.delete_device_class(name)
        core.delete_namespace(ns)


def _dry_run(dyn: Any, obj: dict[str, Any], ns: str) -> Any:
    resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
    body = {**obj, "metadata": {**obj["metadata"], "namespace": ns}}
    return dyn.server_side_apply(
        resource, body=body, namespace=ns, field_manager=FIELD_MANAGER, dry_run="All",
        # an unknown or misspelt field is an error, not a silently dropped warning
        query_params=[("fieldValidation", "Strict")])


@pytest.mark.cluster
@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_accepted_by_server_side_dry_run(cluster: Cluster, namespace: str, path: Path) -> None:
    # after the CRDs: discovery is read once per client
    dyn: Any = DynamicClient(cluster.api)  # type: ignore[no-untyped-call]
    for obj in objects(path):
        got = _dry_run(dyn, obj, namespace)
        assert got.metadata.name == obj["metadata"]["name"]
        templates = templates_of(obj) if obj["kind"] in UPSTREAM else []
        for i, (where, template) in enumerate(templates):
            pt = {"apiVersion": "v1", "kind": "PodTemplate",
                  "metadata": {"name": f"{obj['metadata']['name']}-{i}"}, "template": template}
            try:
                _dry_run(dyn, pt, namespace)
            except ApiException as err:
                raise AssertionError(f"{path.name} {where}: {err.body}") from err
    # nothing was created
    res: Any = client.ResourceV1Api(cluster.api)
    assert not res.list_namespaced_resource_claim_template(namespace).items
