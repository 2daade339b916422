"""The values `cluster up --real-node --install` renders with
(toposerve.localcluster.install): the loopback API server, the imported images never
pulled, every pod on the real node only, and the user's file and --set over
them, in that order."""

from __future__ import annotations

import io
import json
import os
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest

from toposerve.dra_driver.net.handoff import DEFAULT_PLUGIN
from toposerve.localcluster import image_keys
from toposerve.localcluster import install as inst
from toposerve.localcluster.realnode.paths import (
    REAL_NODE_LABEL,
    REAL_NODE_TOLERATION,
    default_layout,
)
from toposerve.manifests.render import render_objects
from toposerve.manifests.values import InstallValues

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
    # the NIC forwarder where the image has it (the values' default), into
    # the real node's own CNI folders and pod network
    init = dict(pods)["toposerve-net-driver"]["initContainers"][0]
    layout = default_layout()
    assert f"--plugin={DEFAULT_PLUGIN}" in init["command"]
    assert {f"--bin-dir={layout.cni_bin}", f"--conf-dir={layout.cni_conf}",
            f"--chain-into={inst.NODE_CONFLIST}"} <= set(init["command"])
    assert v.api_server is not None and v.api_server.url == "https://127.0.0.1:34567"
    # the chart's local-cluster overlay: every pod on the node's network,
    # which a real cluster's defaults give the NIC driver only
    assert all(pod.get("hostNetwork") for _, pod in pods)
    plain = _pods(render_objects(InstallValues()))
    assert [n for n, pod in plain if pod.get("hostNetwork")] == []


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


def test_endpoint_picker_pair_on_free_ports_of_its_own() -> None:
    """In endpoint-picker mode each replica also serves gRPC on the node's
    loopback: a free pair of ports, apart from the HTTP pair (the chart's
    default 9002 may be taken on a developer's machine)."""
    v = inst.local_values("c", IMAGES, Path("/s"), Path("/d"),
                          sets=["router.mode=endpoint-picker"])
    pods = dict(_pods(render_objects(v)))
    grpc = sorted(p["containerPort"] for name in ("toposerve-router-0", "toposerve-router-1")
                  for p in pods[name]["containers"][0]["ports"] if p["name"] == "grpc")
    assert grpc == [v.router.picker_port, v.router.picker_port + 1] != [9002, 9003]
    assert not set(grpc) & {v.router.port, v.router.port + 1}


def test_values_file_over_ours_and_set_over_the_file(tmp_path: Path) -> None:
    f = tmp_path / "values.yaml"
    f.write_text("apiVersion: toposerve.io/v1\nkind: InstallValues\nlogLevel: debug\n"
                 "extender: {replicas: 2, port: 9999}\n")
    v = inst.local_values("c", IMAGES, Path("/s"), Path("/d"), f, ["extender.port=7777"])
    assert v.log_level == "debug" and v.extender.replicas == 2 and v.extender.port == 7777
    # the file's extender section merges into ours: the placement stays
    assert v.extender.node_selector == {REAL_NODE_LABEL: "real"}
    assert v.image.pull_policy == "Never"


def _archive(path: Path, ref: str) -> None:
    """An OCI archive as buildah writes it, but for the blobs: its index
    names the reference."""
    index = json.dumps({"manifests": [{"annotations": {
        "org.opencontainers.image.ref.name": ref}}]}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        info = tarfile.TarInfo("index.json")
        info.size = len(index)
        tar.addfile(info, io.BytesIO(index))


def _built(cache: Path) -> dict[str, Path]:
    """``make image``'s archives for this tree in ``cache``, as it names them."""
    wanted = image_keys.expected_archives(cache)
    for ref in IMAGES:
        _archive(wanted[inst._image_name(ref)], ref)
    return wanted


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty tool cache of the test's (the NIC binary's path is under it too)."""
    monkeypatch.setenv("TOPOSERVE_CACHE", str(tmp_path))
    return tmp_path


def test_the_archives_of_this_tree_by_reference(cache: Path) -> None:
    wanted = _built(cache)
    got = inst.built_images(cache)
    assert got == {ref: wanted[inst._image_name(ref)] for ref in IMAGES}
    (cache / "images" / wanted["kube-scheduler"].name).unlink()
    with pytest.raises(inst.InstallError, match="no image archive for kube-scheduler"):
        inst.built_images(cache)


def test_an_archive_of_another_tree_is_refused_even_when_newer(cache: Path) -> None:
    """The archive whose key is this tree's is taken, not the newest; one
    that is not is refused, one line saying what to do."""
    wanted = _built(cache)
    older = cache / "images" / "toposerve-0123456789abcdef.oci.tar"
    _archive(older, "localhost/toposerve:0.1.0")
    os.utime(older, (time.time() + 60, time.time() + 60))
    assert inst.built_images(cache)["localhost/toposerve:0.1.0"] == wanted["toposerve"]
    wanted["toposerve"].unlink()
    with pytest.raises(inst.InstallError) as err:
        inst.built_images(cache)
    assert str(err.value) == (f"the image archives of toposerve in {cache / 'images'} were "
                              "built from another tree: run `make image` (docs/image.md)")


def test_the_key_follows_the_images_inputs(cache: Path) -> None:
    """A new wheel in the wheelhouse the build resolved (as a changed
    product file, NIC binary or base recipe would) names another toposerve
    archive: the one built before is then another tree's."""
    before = _built(cache)
    assert image_keys.expected_archives(cache) == before  # nothing changed: the same names
    house = image_keys.wheelhouse(cache, image_keys.python_base())
    house.mkdir(parents=True)
    (house / "extra-1.0-py3-none-any.whl").write_bytes(b"wheel")
    (house / ".complete").write_bytes(b"")  # the build's marker, not copied: not in the key
    after = image_keys.expected_archives(cache)
    assert after["toposerve"] != before["toposerve"]
    assert {k: v for k, v in after.items() if k != "toposerve"} == {
        k: v for k, v in before.items() if k != "toposerve"}
    with pytest.raises(inst.InstallError, match=r"toposerve in .* built from another tree"):
        inst.built_images(cache)
