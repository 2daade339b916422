"""The values `cluster up --real-node --install` renders with
(localcluster.install): the loopback API server, the imported images never
pulled, every pod on the real node only, and the user's file and --set over
them, in that order."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest

from localcluster import install as inst
from localcluster.realnode.paths import REAL_NODE_LABEL, REAL_NODE_TOLERATION
from manifests.render import render_objects

pytestmark = pytest.mark.unit

IMAGES = {"localhost/toposerve:0.1.0": Path("/x/toposerve.oci.tar"),
          "localhost/kube-scheduler:v1.37.2": Path("/x/ks.oci.tar"),
          "localhost/redis:7.0.15": Path("/x/redis.oci.tar")}


@pytest.fixture(autouse=True)
def _api(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inst, "api_address", lambda cluster: ("127.0.0.1", 34567))


def _pods(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(o["metadata"]["name"], o["spec"]["template"]["spec"]) for o in objects
            if "template" in (o.get("spec") or {})]


def test_every_pod_on_the_real_node_with_imported_images_and_the_loopback_api() -> None:
    v = inst.local_values("c", IMAGES, Path("/hw/sysfs"), Path("/hw/dev"),
                          sets=["netDriver.enabled=true"])
    pods = _pods(render_objects(v))
    assert {n for n, _ in pods} >= {"toposerve-gpu-driver", "toposerve-net-driver",
                                    "toposerve-extender", "toposerve-scheduler",
                                    "toposerve-router-0", "toposerve-router-1",
                                    "toposerve-router-redis"}
    for name, pod in pods:
        assert pod["nodeSelector"] == {REAL_NODE_LABEL: "real"}, name
        assert pod["tolerations"] == [REAL_NODE_TOLERATION], name
        for c in pod["containers"] + pod.get("initContainers", []):
            assert c["imagePullPolicy"] == "Never" and c["image"] in IMAGES, (name, c["name"])
    gpu = dict(pods)["toposerve-gpu-driver"]
    assert f"--sysfs-root={Path('/hw/sysfs')}" in gpu["containers"][0]["command"]
    # the NIC forwarder where the image has it
    init = dict(pods)["toposerve-net-driver"]["initContainers"][0]
    assert f"--plugin={inst.IMAGE_NIC_PLUGIN}" in init["command"]
    assert v.api_server.url == "https://127.0.0.1:34567"


def test_router_pair_and_redis_on_the_nodes_loopback() -> None:
    """The host cannot reach the real node's pod network and nothing on
    loopback resolves a Service name: the router replicas and Redis listen on
    127.0.0.1, each replica on a port of its own."""
    v = inst.local_values("c", IMAGES, Path("/s"), Path("/d"))
    assert v.router.enabled and v.router.host_network and v.gpu_driver.enabled
    pods = dict(_pods(render_objects(v)))
    ports = set()
    for name in ("toposerve-router-0", "toposerve-router-1", "toposerve-router-redis"):
        assert pods[name]["hostNetwork"] is True, name
        ports |= {p["containerPort"] for c in pods[name]["containers"]
                  for p in c.get("ports", [])}
    assert v.router.port in ports and v.router.port + 1 in ports


def test_values_file_over_ours_and_set_over_the_file(tmp_path: Path) -> None:
    f = tmp_path / "values.yaml"
    f.write_text("apiVersion: toposerve.io/v1\nkind: InstallValues\nlogLevel: debug\n"
                 "extender: {replicas: 2, port: 9999}\n")
    v = inst.local_values("c", IMAGES, Path("/s"), Path("/d"), f, ["extender.port=7777"])
    assert v.log_level == "debug" and v.extender.replicas == 2 and v.extender.port == 7777
    # the file's extender section merges into ours: the placement stays
    assert v.extender.node_selector == {REAL_NODE_LABEL: "real"}
    assert v.image.pull_policy == "Never"


def test_archive_reference_from_buildahs_oci_ref_name(tmp_path: Path) -> None:
    for name, ref in (("a", "localhost/toposerve:0.1.0"), ("b", "localhost/redis:7.0.15"),
                      ("c", "localhost/kube-scheduler:v1.37.2")):
        index = json.dumps({"manifests": [{"annotations": {
            "org.opencontainers.image.ref.name": ref}}]}).encode()
        with tarfile.open(tmp_path / f"{name}.oci.tar", "w") as tar:
            info = tarfile.TarInfo("index.json")
            info.size = len(index)
            tar.addfile(info, io.BytesIO(index))
    assert set(inst.built_images(tmp_path)) == set(IMAGES)
    (tmp_path / "c.oci.tar").unlink()
    with pytest.raises(inst.InstallError, match="kube-scheduler"):
        inst.built_images(tmp_path)
