"""The NIC driver's share of the install: off unless asked for; when on, its
DaemonSet (host network, NET_ADMIN + SYS_ADMIN, /sys, /run/netns), RBAC for
its own driver name, and its service account under the own-node slice
policy; the GPU driver's objects are the same either way."""

from __future__ import annotations

from typing import Any

from tests.manifests.helpers import Obj, objects, one, slice_policy
from toposerve.dra_driver.net.handoff import DEFAULT_PLUGIN
from toposerve.manifests.render import NET_DRIVER


def _named(objs: list[Obj], name: str) -> list[Obj]:
    return [o for o in objs if o["metadata"]["name"] == name]


def _policy_users(*sets: str) -> str:
    vap = slice_policy(*sets)
    expr: str = vap["spec"]["matchConditions"][0]["expression"]
    return expr


def test_off_by_default() -> None:
    assert not _named(objects(), "toposerve-net-driver")
    assert "net-driver" not in _policy_users()


def test_daemonset() -> None:
    objs = objects("netDriver.enabled=true", "netDriver.kubeletDir=/var/lib/k",
                   "netDriver.keepVirtual=true", "netDriver.interfaces=ens.*",
                   "netDriver.extraArgs=[--rescan-interval=2]", only=["net-driver"])
    ds = one(objs, "DaemonSet")
    assert ds["metadata"]["name"] == "toposerve-net-driver"
    pod = ds["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["serviceAccountName"] == "toposerve-net-driver"
    c = pod["containers"][0]
    assert c["command"][:4] == ["toposerve", "--log-level=info", "driver", "net"]
    for flag in ("--plugin-dir=/var/lib/k/plugins/net.toposerve.io",
                 "--state-dir=/var/lib/k/plugins/net.toposerve.io/handoff",
                 "--registry-dir=/var/lib/k/plugins_registry", "--sysfs-root=/sys",
                 "--dev-root=/dev", "--keep-virtual", "--interfaces=ens.*"):
        assert flag in c["command"], flag
    assert c["command"][-1] == "--rescan-interval=2"
    assert c["securityContext"]["capabilities"] == {"add": ["NET_ADMIN", "SYS_ADMIN"],
                                                    "drop": ["ALL"]}
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    probe: list[str] = c["livenessProbe"]["exec"]["command"]
    assert f"PluginPaths({NET_DRIVER!r}" in probe[2]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["/sys"]["readOnly"] is True and mounts["/dev"]["readOnly"] is True
    assert mounts["/run/netns"]["mountPropagation"] == "HostToContainer"
    for path in ("/run/netns", "/sys", "/var/lib/k/plugins/net.toposerve.io"):
        assert volumes[mounts[path]["name"]]["hostPath"]["path"] == path


def test_rbac_names_its_own_driver() -> None:
    role = one(objects("netDriver.enabled=true", only=["net-driver"]), "ClusterRole")
    rules: list[dict[str, Any]] = role["rules"]
    claimed = [r for r in rules if r["resources"] == ["resourceclaims/driver"]]
    assert [r["resourceNames"] for r in claimed] == [[NET_DRIVER]]
    assert {tuple(r["resources"]) for r in rules} == {
        ("resourceslices",), ("resourceclaims",), ("resourceclaims/status",),
        ("resourceclaims/driver",), ("nodes",),
        ("events",)}  # a Warning on a claim it gives up on


def test_policy_restricts_it_when_enabled() -> None:
    assert _policy_users("netDriver.enabled=true", "namespace=ts", "namePrefix=p") == (
        'request.userInfo.username in ["system:serviceaccount:ts:p-gpu-driver", '
        '"system:serviceaccount:ts:p-net-driver"]')


def test_gpu_driver_objects_unchanged() -> None:
    assert objects(only=["gpu-driver"]) == objects("netDriver.enabled=true",
                                                   only=["gpu-driver"])


def test_init_container_installs_the_cni_plugin() -> None:
    ds = one(objects("netDriver.enabled=true", "netDriver.kubeletDir=/var/lib/k",
                     "netDriver.cni.binDir=/opt/cni/b", "netDriver.cni.chainInto=10-pod.conflist",
                     only=["net-driver"]), "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    assert init["image"] == pod["containers"][0]["image"]
    assert init["command"] == ["toposerve", "--log-level=info", "driver", "net-install-cni",
                               "--bin-dir=/opt/cni/b",
                               f"--plugin={DEFAULT_PLUGIN}",
                               "--kubelet-dir=/var/lib/k", "--conf-dir=/etc/cni/net.d",
                               "--chain-into=10-pod.conflist"]
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    # host paths at the same paths; the driver's folder keeps the record of
    # what the install changed, for `net-install-cni --uninstall`
    for path in ("/opt/cni/b", "/etc/cni/net.d", "/var/lib/k/plugins/net.toposerve.io"):
        assert volumes[mounts[path]]["hostPath"]["path"] == path
    driver = pod["containers"][0]["command"]
    for flag in ("--journal-dir=/var/lib/k/plugins/net.toposerve.io/journal",
                 "--handoff-socket=/var/lib/k/plugins/net.toposerve.io/handoff.sock"):
        assert flag in driver, flag


def test_cni_install_off_and_unchained() -> None:
    pod = one(objects("netDriver.enabled=true", "netDriver.cni.install=false",
                      only=["net-driver"]), "DaemonSet")["spec"]["template"]["spec"]
    assert "initContainers" not in pod
    assert not {"cni-bin", "cni-conf"} & {v["name"] for v in pod["volumes"]}
    unchained = one(objects("netDriver.enabled=true", only=["net-driver"]),
                    "DaemonSet")["spec"]["template"]["spec"]
    [init] = unchained["initContainers"]
    assert not [a for a in init["command"] if a.startswith("--chain-into")]
    assert "cni-conf" not in {v["name"] for v in unchained["volumes"]}


def test_binding_conditions_add_the_flag_and_the_claim_watch() -> None:
    """Either driver: off, the claims it prepares are only read; on, its
    command asks for binding conditions and it may list and watch claims
    (those waiting on its devices), nothing more."""
    for section, component, enable in (("netDriver", "net-driver", ("netDriver.enabled=true",)),
                                       ("gpuDriver", "gpu-driver", ())):
        for on, verbs in ((False, ["get"]), (True, ["get", "list", "watch"])):
            objs = objects(*enable, f"{section}.bindingConditions={str(on).lower()}",
                           only=[component])  # type: ignore[list-item]
            [claims] = [r for r in one(objs, "ClusterRole")["rules"]
                        if r["resources"] == ["resourceclaims"]]
            assert claims["verbs"] == verbs, (section, on)
            command = one(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0][
                "command"]
            assert ("--binding-conditions" in command) is on, (section, on)
