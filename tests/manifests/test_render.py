"""What the templates render: valid, deterministic YAML; components
selectable; the driver's DaemonSet, RBAC, admission policy, device classes
and the scheduler wiring as the install needs them."""

from __future__ import annotations

import ipaddress
import re
from typing import Any

import pytest
import yaml

from tests.manifests.helpers import LOCAL_API, Obj, cli, objects, one, slice_policy
from toposerve.manifests.render import RenderError, _parse, render, to_yaml
from toposerve.manifests.values import COMPONENTS, load_values
from toposerve.scheduler_ext.scheduler_config import go_seconds
from toposerve.scheduler_ext.state.watch import PATHS as WATCH_PATHS
from toposerve.topology.config_file import ConfigError


def test_output_is_valid_yaml_and_deterministic() -> None:
    values = load_values(None, ["apiServer.host=127.0.0.1"])
    text = render(values)
    assert text == render(load_values(None, ["apiServer.host=127.0.0.1"]))
    docs = list(yaml.safe_load_all(text))
    # dumping what was parsed gives the same text: nothing lost, nothing ambiguous
    assert to_yaml(docs) == text
    kinds = [d["kind"] for d in docs]
    # the namespaces first (kubectl apply creates in order): the drivers' and the router's
    assert kinds[:2] == ["Namespace", "Namespace"] and "Namespace" not in kinds[2:]
    assert [d["metadata"]["name"] for d in docs[:2]] == ["toposerve-system", "toposerve-router"]
    assert {"DaemonSet", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
            "DeviceClass", "Deployment", "Service"} <= set(kinds)


def test_no_address_outside_loopback_is_rendered() -> None:
    """The network rule: nothing in a pod is pointed at a non-loopback address."""
    text = render(load_values(None, ["apiServer.host=127.0.0.1"]))
    for literal in re.findall(r"\b\d{1,3}(?:\.\d{1,3}){3}\b", text):
        addr = ipaddress.ip_address(literal)
        assert addr.is_loopback or addr.is_unspecified, literal


def test_components_are_selectable() -> None:
    for c in COMPONENTS:
        kinds = [o["kind"] for o in objects(only=[c])]
        namespaced = c in ("gpu-driver", "net-driver", "extender", "scheduler", "router")
        assert ("Namespace" in kinds) == namespaced, c
    assert {o["kind"] for o in objects(only=["device-classes"])} == {"DeviceClass"}
    # disabled in the values: not rendered unless asked for by name
    kinds = [o["kind"] for o in objects("extender.enabled=false", "scheduler.enabled=false",
                                        "router.enabled=false")]
    assert "Deployment" not in kinds and "DaemonSet" in kinds


def test_cli_prints_the_documents(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["manifests", "render", "--set", "apiServer.host=127.0.0.1",
                 "--component", "device-classes"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["metadata"]["name"] for d in docs] == [
        "gpu.toposerve.io", "gpu-share.toposerve.io", "nic.toposerve.io",
        "rdma-nic.toposerve.io"]


def test_bad_template_output_is_reported() -> None:
    with pytest.raises(RenderError, match=r"the chart: a document without apiVersion"):
        _parse("apiVersion: v1\nkind: ConfigMap\n", "the chart")
    with pytest.raises(RenderError, match=r"the chart: rendered text is not YAML"):
        _parse("a: [", "the chart")


def _container(obj: Obj) -> dict[str, Any]:
    return _container_of(obj["spec"]["template"]["spec"])


def _container_of(pod: Obj) -> dict[str, Any]:
    c: dict[str, Any] = pod["containers"][0]
    return c


def test_gpu_driver_daemonset() -> None:
    # a real cluster's: on the pod network, the API server through the in-cluster service
    plain = one(objects(only=["gpu-driver"]), "DaemonSet")
    assert "hostNetwork" not in plain["spec"]["template"]["spec"]
    assert not [a for a in _container(plain)["command"] if a.startswith("--kubeconfig")]
    assert "KUBERNETES_SERVICE_HOST" not in {e["name"] for e in _container(plain)["env"]}
    ds = one(objects("gpuDriver.kubeletDir=/var/lib/k", "gpuDriver.cdiRoot=/run/cdi",
                     "gpuDriver.extraArgs=[--x=1]", LOCAL_API, "apiServer.port=7443",
                     "gpuDriver.hostNetwork=true"), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "system-node-critical"
    assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "Default"
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    c = _container(ds)
    assert c["command"][:4] == ["toposerve", "--log-level=info", "driver", "gpu"]
    for flag in ("--node-name=$(NODE_NAME)", "--pod-uid=$(POD_UID)",
                 "--registry-dir=/var/lib/k/plugins_registry",
                 "--plugin-dir=/var/lib/k/plugins/gpu.toposerve.io", "--cdi-root=/run/cdi",
                 "--sysfs-root=/sys", "--dev-root=/dev",
                 "--kubeconfig=/etc/toposerve/kubeconfig/kubeconfig"):
        assert flag in c["command"]
    assert c["command"][-1] == "--x=1"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["POD_UID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["KUBERNETES_SERVICE_HOST"]["value"] == "127.0.0.1"
    assert env["KUBERNETES_SERVICE_PORT"]["value"] == "7443"
    assert "livenessProbe" in c
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    for path in ("/var/lib/k/plugins_registry", "/var/lib/k/plugins/gpu.toposerve.io",
                 "/run/cdi", "/sys", "/dev"):
        m = mounts[path]
        assert volumes[m["name"]]["hostPath"]["path"] == path
    assert mounts["/sys"]["readOnly"] is True and mounts["/dev"]["readOnly"] is True
    assert not any(m.get("readOnly") for p, m in mounts.items()
                   if p.startswith(("/var/lib/k", "/run/cdi")))


@pytest.mark.parametrize("root", ["/", "/run/nvidia/driver"])
def test_gpu_driver_mounts_the_nvidia_driver_root(root: str) -> None:
    """The image has no libnvidia-ml.so.1: the host's driver root is mounted
    read-only and the driver told to search it."""
    sets = () if root == "/" else (f"gpuDriver.nvidiaDriverRoot={root}",)
    ds = one(objects(*sets, only=["gpu-driver"]), "DaemonSet")
    c = _container(ds)
    assert "--nvidia-driver-root=/driver-root" in c["command"]
    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/driver-root")
    assert mount["readOnly"] is True
    volume = next(v for v in ds["spec"]["template"]["spec"]["volumes"]
                  if v["name"] == mount["name"])
    assert volume["hostPath"] == {"path": root, "type": "Directory"}


def test_gpu_memory_shares_are_opt_in() -> None:
    assert "--memory-shares" not in _container(
        one(objects(only=["gpu-driver"]), "DaemonSet"))["command"]
    on = _container(one(objects("gpuDriver.memoryShares=true", only=["gpu-driver"]),
                        "DaemonSet"))["command"]
    assert "--memory-shares" in on and "--nvidia-driver-root=/driver-root" in on


def test_kubeconfig_names_the_values_api_server() -> None:
    objs = objects("apiServer.host=api.example.test", "apiServer.port=443")
    cm = one([o for o in objs if o["metadata"].get("namespace") == "toposerve-system"],
             "ConfigMap", "toposerve-kubeconfig")
    # one beside the router too, in its own namespace
    assert one([o for o in objs if o["metadata"].get("namespace") == "toposerve-router"],
               "ConfigMap", "toposerve-kubeconfig")["data"] == cm["data"]
    assert not [o for o in objects() if o["metadata"]["name"] == "toposerve-kubeconfig"]
    kc = yaml.safe_load(cm["data"]["kubeconfig"])
    assert kc["clusters"][0]["cluster"]["server"] == "https://api.example.test:443"
    assert kc["users"][0]["user"] == {
        "tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}


def test_gpu_driver_rbac_is_exactly_the_listed_rules() -> None:
    role = one(objects(only=["gpu-driver"]), "ClusterRole")
    rules = {(tuple(r["apiGroups"]), tuple(r["resources"]), tuple(r.get("resourceNames", ())),
              tuple(sorted(r["verbs"]))) for r in role["rules"]}
    assert rules == {
        (("resource.k8s.io",), ("resourceslices",), (),
         ("create", "delete", "get", "list", "update", "watch")),
        (("resource.k8s.io",), ("resourceclaims",), (), ("get",)),
        (("resource.k8s.io",), ("resourceclaims/status",), (), ("patch", "update")),
        (("resource.k8s.io",), ("resourceclaims/driver",), ("gpu.toposerve.io",),
         ("associated-node:patch", "associated-node:update")),
        (("",), ("nodes",), (), ("get",)),
        # a Warning on a claim given up on, on the Node when GPUs are withheld
        (("",), ("events",), (), ("create",)),
    }
    net = one(objects("netDriver.enabled=true", only=["net-driver"]), "ClusterRole")
    # a Warning on a claim it gives up on, as the GPU driver
    assert [r for r in net["rules"] if "events" in r["resources"]] == [
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]


def test_admission_policy_covers_the_net_driver_when_asked() -> None:
    def users(*sets: str) -> str:
        vap = slice_policy(*sets)
        expr: str = vap["spec"]["matchConditions"][0]["expression"]
        return expr

    assert users() == ('request.userInfo.username in '
                       '["system:serviceaccount:toposerve-system:toposerve-gpu-driver"]')
    assert users("admissionPolicy.includeNetDriver=true", "namespace=ts", "namePrefix=p") == (
        'request.userInfo.username in ["system:serviceaccount:ts:p-gpu-driver", '
        '"system:serviceaccount:ts:p-net-driver"]')
    binding = one(objects(only=["admission-policy"]), "ValidatingAdmissionPolicyBinding",
                  "toposerve-resourceslices-own-node")
    assert binding["spec"] == {"policyName": "toposerve-resourceslices-own-node",
                               "validationActions": ["Deny"]}


def test_device_classes() -> None:
    classes = {o["metadata"]["name"]: [s["cel"]["expression"] for s in o["spec"]["selectors"]]
               for o in objects(only=["device-classes"])}
    assert classes == {
        "gpu.toposerve.io": ["device.driver == 'gpu.toposerve.io'"],
        # memory shares: only devices that allow multiple allocations
        "gpu-share.toposerve.io": [
            "device.driver == 'gpu.toposerve.io' && device.allowMultipleAllocations"],
        "nic.toposerve.io": ["device.driver == 'net.toposerve.io'"],
        "rdma-nic.toposerve.io": [
            "device.driver == 'net.toposerve.io'",
            "'rdma' in device.attributes['net.toposerve.io'] && "
            "device.attributes['net.toposerve.io'].rdma == true"],
    }


def test_gpu_class_extended_resource_name() -> None:
    """Set, the GPU class alone carries it (pods asking resources.limits for
    it get GPUs through a claim the scheduler makes); unset, no class does."""
    def specs(*sets: str) -> dict[str, Any]:
        return {o["metadata"]["name"]: o["spec"] for o in objects(*sets, only=["device-classes"])}

    assert not any("extendedResourceName" in s for s in specs().values())
    got = specs("deviceClasses.extendedResourceName=nvidia.com/gpu",
                "deviceClasses.gpu=accel.example.test")
    assert got["accel.example.test"]["extendedResourceName"] == "nvidia.com/gpu"
    assert got["accel.example.test"]["selectors"] == [
        {"cel": {"expression": "device.driver == 'gpu.toposerve.io'"}}]
    assert [n for n, s in got.items() if "extendedResourceName" in s] == ["accel.example.test"]


def _scheduler_config(*sets: str) -> dict[str, Any]:
    cm = one(objects(*sets, only=["scheduler"]), "ConfigMap", "toposerve-scheduler")
    cfg: dict[str, Any] = yaml.safe_load(cm["data"]["config.yaml"])
    return cfg


def test_second_scheduler_wires_the_extender() -> None:
    cfg = _scheduler_config()
    assert cfg["kind"] == "KubeSchedulerConfiguration"
    assert cfg["percentageOfNodesToScore"] == 100
    # groups' pods see every node; pods of no group a sample (0: the adaptive default)
    assert cfg["profiles"] == [{"schedulerName": "toposerve-scheduler"},
                               {"schedulerName": "toposerve-ungrouped",
                                "percentageOfNodesToScore": 0}]
    assert _scheduler_config("scheduler.ungroupedSchedulerName=null")["profiles"] == [
        {"schedulerName": "toposerve-scheduler"}]
    # a real cluster's: the extender's Service, the scheduler anywhere
    assert cfg["extenders"] == [{
        "urlPrefix": "http://toposerve-extender.toposerve-system.svc:8888", "filterVerb": "filter",
        "prioritizeVerb": "prioritize", "preemptVerb": "preempt", "weight": 1,
        "enableHTTPS": False, "nodeCacheCapable": True, "managedResources": [],
        "ignorable": True, "httpTimeout": "5s"}]
    assert cfg["leaderElection"] == {"leaderElect": True, "resourceNamespace": "toposerve-system",
                                     "resourceName": "toposerve-scheduler"}
    # the timeout as scheduler-config writes it: a duration Go reads
    for seconds in (2.5, 0.001, 10):
        ext = _scheduler_config(f"scheduler.extenderTimeoutSeconds={seconds}")["extenders"][0]
        assert ext["httpTimeout"] == go_seconds(seconds)
    # an extender that waits out samples: the scheduler's adaptive default
    sampled = _scheduler_config("extender.config.placement.sampledNodes=true")
    assert "percentageOfNodesToScore" not in sampled and sampled["extenders"] == cfg["extenders"]
    pod = one(objects(only=["scheduler"]), "Deployment")["spec"]["template"]["spec"]
    assert "podAffinity" not in pod["affinity"] and "hostNetwork" not in pod
    assert "--bind-address=0.0.0.0" in _container_of(pod)["command"]
    assert "host" not in _container_of(pod)["readinessProbe"]["httpGet"]
    # both on the node's network (the local cluster): loopback, beside an extender pod
    on_node = ("extender.hostNetwork=true", "scheduler.hostNetwork=true")
    assert _scheduler_config(*on_node)["extenders"][0]["urlPrefix"] == "http://127.0.0.1:8888"
    pod = one(objects(*on_node, only=["scheduler"]), "Deployment")["spec"]["template"]["spec"]
    assert pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0][
        "labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "extender"
    assert "--bind-address=127.0.0.1" in _container_of(pod)["command"]
    assert _container_of(pod)["readinessProbe"]["httpGet"]["host"] == "127.0.0.1"
    # the scheduler alone on it dials the Service through the cluster's DNS
    pod = one(objects("scheduler.hostNetwork=true", only=["scheduler"]),
              "Deployment")["spec"]["template"]["spec"]
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    url = "http://extender.example.test:8888"
    assert _scheduler_config(f"scheduler.extenderURL={url}")["extenders"][0]["urlPrefix"] == url
    aff = one(objects(f"scheduler.extenderURL={url}", only=["scheduler"]),
              "Deployment")["spec"]["template"]["spec"]["affinity"]
    assert "podAffinity" not in aff


def test_extender_deployment_and_config() -> None:
    objs = objects("extender.port=9000", "extender.config={placement: {promiseTTLSeconds: 30}}",
                   "deviceClasses.gpu=accel.example.test", only=["extender"])
    cfg = yaml.safe_load(one(objs, "ConfigMap", "toposerve-extender")["data"]["config.yaml"])
    assert cfg["kind"] == "ExtenderConfig"
    assert cfg["placement"]["promiseTTLSeconds"] == 30
    # it listens where the scheduler calls it, and counts the class this install creates
    assert cfg["server"] == {"host": "0.0.0.0", "port": 9000}
    assert cfg["accelerators"]["deviceClasses"] == ["accel.example.test"]
    dep = one(objs, "Deployment")
    c = _container(dep)
    assert c["command"][2:] == ["extender", "--config=/etc/toposerve/extender/config.yaml"]
    assert "host" not in c["readinessProbe"]["httpGet"]
    assert "hostNetwork" not in dep["spec"]["template"]["spec"]
    assert one(objs, "Service")["spec"]["ports"][0]["port"] == 9000
    # a changed config rolls the pods
    other = one(objects("extender.port=9001", only=["extender"]), "Deployment")
    ann = "toposerve.io/config-hash"
    assert (dep["spec"]["template"]["metadata"]["annotations"][ann]
            != other["spec"]["template"]["metadata"]["annotations"][ann])
    # both on the node's network: on its loopback, where the scheduler beside it calls
    on_node = ("extender.hostNetwork=true", "scheduler.hostNetwork=true", LOCAL_API)
    objs = objects(*on_node, only=["extender"])
    cm = one(objs, "ConfigMap", "toposerve-extender")
    assert yaml.safe_load(cm["data"]["config.yaml"])["server"]["host"] == "127.0.0.1"
    c = _container(one(objs, "Deployment"))
    assert c["readinessProbe"]["httpGet"]["host"] == "127.0.0.1"
    assert "--kubeconfig=/etc/toposerve/kubeconfig/kubeconfig" in c["command"]
    # unless the scheduler is given a URL: every address again
    url = "scheduler.extenderURL=http://extender.example.test:8888"
    cm = one(objects(*on_node, url, only=["extender"]), "ConfigMap", "toposerve-extender")
    assert yaml.safe_load(cm["data"]["config.yaml"])["server"]["host"] == "0.0.0.0"


def test_extender_rbac_writes_only_pod_annotations_and_events() -> None:
    def writes(*sets: str) -> list[Any]:
        rules = one(objects(*sets, only=["extender"]), "ClusterRole")["rules"]
        return [r for r in rules if set(r["verbs"]) - {"list", "watch"}]

    # decisions, and the retry mark on a group's waiting pods (even without decisions);
    # a Warning on a group's pod that names another scheduler
    patch = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]},
             {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    assert writes() == writes("extender.config={persistDecisions: false}") == patch


def test_extender_expects_groups_at_this_installs_scheduler() -> None:
    def named(*sets: str) -> object:
        cm = one(objects(*sets, only=["extender"]), "ConfigMap", "toposerve-extender")
        return yaml.safe_load(cm["data"]["config.yaml"]).get("schedulerName")

    assert named() == "toposerve-scheduler"
    assert named("scheduler.schedulerName=gangs") == "gangs"
    assert named("extender.config={schedulerName: site-sched}") == "site-sched"
    assert named("scheduler.enabled=false") is None  # the site's scheduler: not checked


def test_extender_rbac_covers_every_watch() -> None:
    """Each collection the extender watches is one its role may list and watch
    (an optional API it may not read would be skipped as not installed)."""
    rules = one(objects(only=["extender"]), "ClusterRole")["rules"]
    granted = {(g, res) for r in rules if {"list", "watch"} <= set(r["verbs"])
               for g in r["apiGroups"] for res in r["resources"]}
    for path, _params in WATCH_PATHS.values():
        parts = path.strip("/").split("/")
        group = "" if parts[0] == "api" else parts[1]
        assert (group, parts[-1]) in granted, f"the extender may not watch {path}"


@pytest.mark.parametrize(("sets", "says"), [
    (["scheduler.ungroupedSchedulerName=toposerve-scheduler"],
     r"scheduler.*ungroupedSchedulerName: 'toposerve-scheduler' is already schedulerName"),
    (["scheduler.schedulerName=default-scheduler"],
     r"scheduler.*schedulerName: default-scheduler is the cluster's own"),
    (["scheduler.ungroupedSchedulerName=default-scheduler"],
     r"scheduler.*ungroupedSchedulerName: default-scheduler is the cluster's own"),
])
def test_the_schedulers_profiles_are_its_own(sets: list[str], says: str) -> None:
    # the chart's scheduler runs beside the cluster's: a profile of the stock
    # name would have two schedulers bind the same pods
    with pytest.raises(ConfigError, match=says):
        objects(*sets, only=["scheduler"])


def test_bad_extender_config_names_the_field() -> None:
    with pytest.raises(ConfigError, match=r"extender\.config\.placement\.kvSizePerRequest"):
        objects("extender.config={placement: {kvSizePerRequest: lots}}")
