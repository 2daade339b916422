"""The chart as an admin takes it: its version is the package's, its
generated values.yaml and values.schema.json are the models' (regenerate with
``python -m toposerve.manifests.chart``), ``helm lint --strict`` passes for
the defaults and every shipped overlay, helm itself refuses values the
models refuse, and a real cluster's defaults need no apiServer and put
nothing but the NIC driver on the node's network."""

from __future__ import annotations

import json
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.manifests.helpers import CLAIMS_RULES, objects, one
from toposerve.manifests.chart import chart_dir, find_helm, generated
from toposerve.manifests.values import InstallValues, load_values
from toposerve.topology.config_file import ConfigError

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[2]
OVERLAYS = sorted((chart_dir() / "ci").glob("*-values.yaml"))


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(find_helm()), *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_chart_version_is_the_package_version() -> None:
    chart = yaml.safe_load((chart_dir() / "Chart.yaml").read_text())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert chart["apiVersion"] == "v2"
    assert chart["version"] == chart["appVersion"] == project["version"]


@pytest.mark.parametrize("name", ["values.yaml", "values.schema.json"])
def test_generated_files_are_current(name: str) -> None:
    assert (chart_dir() / name).read_text() == generated()[name], (
        "run: python -m toposerve.manifests.chart")


def test_values_yaml_is_the_models_defaults() -> None:
    """What helm reads as the defaults is what the models default to."""
    doc = yaml.safe_load((chart_dir() / "values.yaml").read_text())
    assert InstallValues.model_validate(doc) == InstallValues()


@pytest.mark.parametrize("overlay", [None, *OVERLAYS], ids=lambda p: p.name if p else "defaults")
def test_lint_strict(overlay: Path | None) -> None:
    args = ["lint", "--strict", str(chart_dir())] + (["-f", str(overlay)] if overlay else [])
    done = _helm(*args)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("overlay", OVERLAYS, ids=lambda p: p.name)
def test_each_overlay_is_valid_values(overlay: Path) -> None:
    """An overlay passes the models as helm's schema check passes it."""
    load_values(overlay)


@pytest.mark.parametrize("bad, field", [
    ("gpuDriver.cdiRot=/x", "cdiRot"),
    ("extender.replicas=0", "replicas"),
    ("image.pullPolicy=Sometimes", "pullPolicy"),
    ("router.replicas=true", "replicas"),
    ("router.replicas=99999999999999999999999", "replicas"),
    ("router.resources.limits.memory=lots", "memory"),
    ("router.resources.limits.cpu=-5", "cpu"),
    ("router.resources.limits.foo=1", "foo"),
])
def test_helm_refuses_what_the_models_refuse(bad: str, field: str) -> None:
    """helm install -f/--set without toposerve's CLI: values.schema.json
    refuses the same mistakes, naming the field; and so do the models."""
    done = _helm("template", "t", str(chart_dir()), "--set", bad)
    assert done.returncode != 0 and field in done.stderr, done.stderr
    with pytest.raises(ConfigError, match=field):
        load_values(None, [bad])


def test_quantities_as_numbers_or_strings() -> None:
    """`cpu: 1` is how admins write a whole core; both paths take it."""
    sets = ["router.resources.limits.cpu=1", "router.resources.requests.memory=1.5Gi",
            "router.resources.requests.ephemeral-storage=1e9"]
    args = [a for s in sets for a in ("--set", s)]
    done = _helm("template", "t", str(chart_dir()), *args)
    assert done.returncode == 0, done.stderr
    router = one(objects(*sets, only=["router"]), "Deployment", "toposerve-router")
    resources = _pod(router)["containers"][0]["resources"]
    assert resources["limits"]["cpu"] == 1 and resources["requests"]["memory"] == "1.5Gi"


@pytest.mark.parametrize("bad, says", [
    ("scheduler.schedulerName=default-scheduler", "scheduler.schedulerName: default-scheduler"),
    ("scheduler.ungroupedSchedulerName=default-scheduler",
     "scheduler.ungroupedSchedulerName: default-scheduler"),
    ("scheduler.ungroupedSchedulerName=toposerve-scheduler", "is already schedulerName"),
])
def test_helm_alone_refuses_a_profile_that_is_not_its_own(bad: str, says: str) -> None:
    """What the values model refuses across fields, the chart refuses too
    (the schema checks one field at a time)."""
    done = _helm("template", "t", str(chart_dir()), "--set", bad)
    assert done.returncode != 0 and says in done.stderr, done.stderr
    assert _helm("template", "t", str(chart_dir()), "--set",
                 "scheduler.ungroupedSchedulerName=null").returncode == 0


def _pod(obj: dict[str, Any]) -> dict[str, Any]:
    pod: dict[str, Any] = obj["spec"]["template"]["spec"]
    return pod


def test_a_real_clusters_defaults() -> None:
    """No apiServer: in-cluster access; the drivers, extender and scheduler
    in the release's namespace, the router and Redis in theirs; only the
    NIC driver on the node's network; every pod's service account token is
    the API credential (no kubeconfig mounted)."""
    objs = objects("netDriver.enabled=true")
    workloads = {o["metadata"]["name"]: o for o in objs if o["kind"] in ("Deployment",
                                                                           "DaemonSet")}
    where = {n: (o["metadata"]["namespace"], bool(_pod(o).get("hostNetwork")))
             for n, o in workloads.items()}
    assert where == {
        "toposerve-gpu-driver": ("toposerve-system", False),
        "toposerve-net-driver": ("toposerve-system", True),
        "toposerve-extender": ("toposerve-system", False),
        "toposerve-scheduler": ("toposerve-system", False),
        "toposerve-router": ("toposerve-router", False),
        "toposerve-router-redis": ("toposerve-router", False)}
    for name, o in workloads.items():
        for c in _pod(o)["containers"]:
            assert not [e for e in c.get("env", []) if e["name"].startswith("KUBERNETES_")], name
            assert not [m for m in c.get("volumeMounts", []) if m["name"] == "kubeconfig"], name
    ns = {o["metadata"]["name"]: o for o in objs if o["kind"] == "Namespace"}
    assert ns["toposerve-router"]["metadata"]["labels"][
        "pod-security.kubernetes.io/enforce"] == "restricted"
    assert {o["kind"] for o in objs if o["metadata"].get("namespace") == "toposerve-router"
            } >= {"Service", "PodDisruptionBudget", "NetworkPolicy", "Deployment"}


def test_every_pod_pulls_with_the_pull_secrets() -> None:
    """A private registry: every workload's pods name the Secrets, and none
    without them."""
    def pulls(*sets: str) -> dict[str, Any]:
        return {o["metadata"]["name"]: _pod(o).get("imagePullSecrets")
                for o in objects("netDriver.enabled=true", *sets)
                if o["kind"] in ("Deployment", "DaemonSet")}

    given = pulls("imagePullSecrets=[{name: regcred}, {name: mirror.example}]")
    assert len(given) == 6
    assert set(map(str, given.values())) == {"[{'name': 'regcred'}, {'name': 'mirror.example'}]"}
    assert set(pulls().values()) == {None}
    done = _helm("template", "t", str(chart_dir()), "--set", "imagePullSecrets[0].name=Reg_Cred")
    assert done.returncode != 0 and "imagePullSecrets" in done.stderr, done.stderr


def test_the_chart_as_a_dependency_of_another(tmp_path: Path) -> None:
    """An umbrella chart: helm hands a subchart its `global` values, and
    the parent's values for it by the chart's name."""
    parent = tmp_path / "site"
    (parent / "charts").mkdir(parents=True)
    shutil.copytree(chart_dir(), parent / "charts" / "toposerve")
    (parent / "Chart.yaml").write_text("apiVersion: v2\nname: site\nversion: 1.0.0\n"
                                       "dependencies: [{name: toposerve, version: '*'}]\n")
    (parent / "values.yaml").write_text("global: {team: inference}\n"
                                        "toposerve: {router: {replicas: 3}}\n")
    done = _helm("template", "t", str(parent))
    assert done.returncode == 0, done.stderr
    router = one(list(yaml.safe_load_all(done.stdout)), "Deployment", "toposerve-router")
    assert router["spec"]["replicas"] == 3


def test_replicated_deployments_drain_one_at_a_time() -> None:
    def budgets(*sets: str) -> dict[str, int]:
        return {o["metadata"]["name"]: o["spec"]["maxUnavailable"]
                for o in objects(*sets) if o["kind"] == "PodDisruptionBudget"}

    assert budgets() == {"toposerve-router": 1}  # the one Deployment of 2 by default
    assert budgets("extender.replicas=2", "scheduler.replicas=3") == {
        "toposerve-router": 1, "toposerve-extender": 1, "toposerve-scheduler": 1}


def test_the_gpu_driver_runs_under_the_default_syscall_filter() -> None:
    objs = objects("netDriver.enabled=true")
    sc = {o["metadata"]["name"]: _pod(o)["containers"][0]["securityContext"]
          for o in objs if o["kind"] == "DaemonSet"}
    assert sc["toposerve-gpu-driver"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # the NIC driver's netlink and namespace moves are its capabilities' business
    assert "seccompProfile" not in sc["toposerve-net-driver"]


def test_install_notes_say_what_to_do_next() -> None:
    done = _helm("install", "t", str(chart_dir()), "--dry-run=client", "-n", "ts")
    assert done.returncode == 0, done.stderr
    notes = done.stdout.partition("NOTES:")[2]
    assert "spec.schedulerName: toposerve-scheduler" in notes
    assert "port-forward svc/toposerve-router 8080:8080" in notes
    assert "toposerve-router-keys" in notes
    done = _helm("install", "t", str(chart_dir()), "--dry-run=client", "-n", "ts",
                 "--set", "router.enabled=false", "--set", "scheduler.enabled=false")
    assert "port-forward" not in done.stdout and "schedulerName" not in done.stdout


def test_restricted_pods_in_the_routers_namespace() -> None:
    """What pod security's restricted level asks of every container there."""
    for o in objects(only=["router"]):
        if o["kind"] != "Deployment":
            continue
        pod = _pod(o)
        for c in pod["containers"]:
            sc = {**pod.get("securityContext", {}), **c.get("securityContext", {})}
            assert sc["runAsNonRoot"] and sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, o["metadata"]["name"]


def test_the_values_file_and_set_reach_helm_as_given(tmp_path: Path) -> None:
    """toposerve manifests render passes helm only what was given; the
    rest is the chart's values.yaml (the same defaults): same objects as a
    plain helm template with the same -f."""
    f = tmp_path / "v.yaml"
    f.write_text("apiVersion: toposerve.io/v1\nkind: InstallValues\nlogLevel: debug\n"
                 "router: {replicas: 3}\n")
    done = _helm("template", "toposerve", str(chart_dir()), "-n", "toposerve-system",
                 "-f", str(f), "--kube-version", "v1.37.2")
    assert done.returncode == 0, done.stderr
    plain = [d for d in yaml.safe_load_all(done.stdout) if d]
    ours = [o for o in objects("logLevel=debug", "router.replicas=3") if o["kind"] != "Namespace"
            or o["metadata"]["name"] != "toposerve-system"]
    generated_secret = {"toposerve-router-redis-auth", "toposerve-extender-key"}

    def key(o: dict[str, Any]) -> str:
        return json.dumps([o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]])

    assert {key(o) for o in plain if o["metadata"]["name"] not in generated_secret} == {
        key(o) for o in ours}


def test_inference_pool_discovery_gets_its_rbac() -> None:
    """A router reading an InferencePool may read that pool, by name, and
    list the pods in its namespace: nothing else of the extension's."""
    objs = objects("router.config.discovery={kubernetes: null, "
                   "inferencePool: {name: llama, namespace: llm}}", only=["router"])
    (role,) = [o for o in objs if o["kind"] == "Role"
               and o["metadata"]["name"] == "toposerve-router-model-pods"]
    assert role["metadata"]["namespace"] == "llm"
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]},
        *CLAIMS_RULES,
        {"apiGroups": ["inference.networking.k8s.io"], "resources": ["inferencepools"],
         "resourceNames": ["llama"], "verbs": ["get", "list", "watch"]}]


def test_claim_devices_gets_its_rbac_unless_turned_off() -> None:
    """The router reads its pods' claims, the slices of their nodes and the
    DeviceTaintRules, and writes Events on its pods: read-only but for the
    Events, and gone with claimDevices: false."""
    def rules(*sets: str) -> tuple[list[Any], list[Any]]:
        objs = objects(*sets, only=["router"])
        (role,) = [o for o in objs if o["kind"] == "Role"
                   and o["metadata"]["name"] == "toposerve-router-model-pods"]
        (cluster,) = [o for o in objs if o["kind"] == "ClusterRole"]
        return role["rules"], cluster["rules"]

    role, cluster = rules()
    assert all(r in role for r in CLAIMS_RULES)
    assert {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices", "devicetaintrules"],
            "verbs": ["list", "watch"]} in cluster
    role, cluster = rules("router.config.discovery.kubernetes.claimDevices=false")
    assert role == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    assert cluster == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}]


def test_the_api_keys_secret_outlives_the_release() -> None:
    """The chart makes the tenants' keys Secret empty and keeps it on
    uninstall (an admin writes the keys); a Secret the values name is the
    admin's, not rendered."""
    (keys,) = [o for o in objects(only=["router"]) if o["kind"] == "Secret"]
    assert keys["metadata"]["name"] == "toposerve-router-keys" and "data" not in keys
    assert keys["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not [o for o in objects("router.apiKeys.secretName=mine", only=["router"])
                if o["kind"] == "Secret"]
