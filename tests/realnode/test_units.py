"""The real node's pure parts and its CNI plugin, without a cluster: config
rendering, OCI archives, mountinfo parsing, and CNI ADD/CHECK/DEL against a
network namespace this test makes."""

from __future__ import annotations

import hashlib
import io
import ipaddress
import json
import subprocess
import tarfile
import tomllib
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from toposerve.localcluster.realnode import cni, config, images
from toposerve.localcluster.realnode.paths import PAUSE_IMAGE, Layout
from toposerve.localcluster.realnode.teardown import leftovers, mounts_under

LAYOUT = Layout(home=Path("/h/realnode"), run=Path("/run/rn"))


def test_containerd_config_is_version_4_with_our_paths() -> None:
    doc = tomllib.loads(config.to_toml(config.containerd_config(LAYOUT, Path("/usr/sbin/runc"))))
    assert doc["version"] == 4 and doc["imports"] == []
    assert doc["root"] == "/h/realnode/containerd" and doc["state"] == "/run/rn/containerd"
    plugins = doc["plugins"]
    assert plugins["io.containerd.server.v1.grpc"]["address"] == "/run/rn/containerd.sock"
    runtime = plugins["io.containerd.cri.v1.runtime"]
    assert runtime["restrict_oom_score_adj"] is True
    assert runtime["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    runc = runtime["containerd"]["runtimes"]["runc"]
    assert runc["disable_pause_image_pull"] is True
    assert runc["options"] == {"BinaryName": "/usr/sbin/runc", "Root": "/run/rn/runc",
                               "SystemdCgroup": False}
    assert runtime["cni"]["use_internal_loopback"] is True
    assert plugins["io.containerd.cri.v1.images"]["pinned_images"]["sandbox"] == PAUSE_IMAGE
    assert plugins["io.containerd.nri.v1.nri"]["disable"] is False


def test_kubelet_config_binds_loopback_and_tolerates_cgroup_v1() -> None:
    cfg = config.kubelet_config(LAYOUT, Path("/ca.crt"), Path("/resolv.conf"))
    assert cfg["address"] == cfg["healthzBindAddress"] == "127.0.0.1"
    assert cfg["readOnlyPort"] == 0 and cfg["failCgroupV1"] is False
    assert cfg["cgroupDriver"] == "cgroupfs" and cfg["cgroupsPerQOS"] is False
    assert cfg["containerRuntimeEndpoint"] == "unix:///run/rn/containerd.sock"
    assert config.RESOLV_CONF.split() == ["nameserver", "127.0.0.1"]


def test_toml_quotes_keys_and_strings() -> None:
    text = config.to_toml({"a": {"b.c": {"d": 'x"y', "e": ["1"], "f": True, "g": 2}}})
    assert tomllib.loads(text) == {"a": {"b.c": {"d": 'x"y', "e": ["1"], "f": True, "g": 2}}}


def _members(data: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return {m.name: tar.extractfile(m).read()  # type: ignore[union-attr]
                for m in tar.getmembers() if m.isfile()}


def test_oci_archive_is_a_valid_named_layout(tmp_path: Path) -> None:
    exe = tmp_path / "tool"
    exe.write_bytes(b"#!/bin/sh\n")
    exe.chmod(0o755)
    spec = images.ImageSpec(name="toposerve.local/x:1", files={"/bin/tool": exe},
                            symlinks={"/bin/alias": "tool"}, entrypoint=["/bin/tool"])
    archive = images.oci_archive(spec)
    assert archive == images.oci_archive(spec)  # deterministic: re-import changes nothing
    files = _members(archive)
    for name, blob in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(blob).hexdigest() == name.rsplit("/", 1)[1]
    index = json.loads(files["index.json"])
    desc = index["manifests"][0]
    assert desc["annotations"]["io.containerd.image.name"] == "toposerve.local/x:1"
    manifest = json.loads(files[f"blobs/sha256/{desc['digest'][7:]}"])
    layer = files[f"blobs/sha256/{manifest['layers'][0]['digest'][7:]}"]
    with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
        names = {m.name: m for m in tar.getmembers()}
    assert names["bin/tool"].mode == 0o755 and names["bin/alias"].linkname == "tool"
    config_doc = json.loads(files[f"blobs/sha256/{manifest['config']['digest'][7:]}"])
    assert config_doc["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]


def test_busybox_must_be_static(tmp_path: Path) -> None:
    assert images.is_static_elf(Path("/bin/busybox").read_bytes())
    assert not images.is_static_elf(Path("/bin/ls").read_bytes())  # needs ld.so
    with pytest.raises(images.ImageError, match="busybox-static"):
        images.busybox_image("x:1", Path("/bin/ls"), ["sh"])


def test_mounts_under_finds_ours_deepest_first() -> None:
    info = "\n".join([
        "22 1 8:1 / / rw - ext4 /dev/vda rw",
        "40 22 0:5 / /run/rn/containerd/a rw - tmpfs tmpfs rw",
        "41 40 0:6 / /run/rn/containerd/a/b\\040c rw - overlay overlay rw",
        "42 22 0:7 / /run/rnx rw - tmpfs tmpfs rw",
        "43 22 0:8 / /var/lib/kubelet/pods/u/vol rw - tmpfs tmpfs rw",
    ])
    assert mounts_under([Path("/run/rn"), Path("/var/lib/kubelet")], info) == [
        Path("/var/lib/kubelet/pods/u/vol"), Path("/run/rn/containerd/a/b c"),
        Path("/run/rn/containerd/a")]
    assert any(x.startswith("mount /run/rn/containerd/a") for x in leftovers(LAYOUT, info))


def test_first_free_skips_taken_and_dot_one() -> None:
    net = ipaddress.IPv4Network("127.9.0.0/16")
    assert str(cni.first_free(net, [])) == "127.9.0.2"
    assert str(cni.first_free(net, ["127.9.0.2", "127.9.0.3"])) == "127.9.0.4"
    with pytest.raises(cni.CniError):
        cni.first_free(ipaddress.IPv4Network("127.9.0.0/30"), ["127.9.0.2"])
    with pytest.raises(cni.CniError, match="not loopback"):
        cni.parse_conf({"subnet": "10.0.0.0/8", "dataDir": "/x"})


@pytest.fixture
def netns() -> Iterator[str]:
    name = f"tsrn-{uuid.uuid4().hex[:8]}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        yield f"/run/netns/{name}"
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def test_cni_add_check_del_in_a_namespace(netns: str, tmp_path: Path) -> None:
    conf = {"cniVersion": "1.0.0", "name": "t", "type": cni.PLUGIN_TYPE,
            "subnet": "127.9.0.0/24", "dataDir": str(tmp_path / "ipam")}
    env = {"CNI_CONTAINERID": "c1", "CNI_NETNS": netns, "CNI_IFNAME": "eth0"}
    out = cni.run({**env, "CNI_COMMAND": "ADD"}, conf)
    assert out and out["ips"] == [{"address": "127.9.0.2/32", "interface": 0}]
    assert out["interfaces"][0]["sandbox"] == netns
    again = cni.run({**env, "CNI_COMMAND": "ADD"}, conf)  # a retried ADD: same answer
    assert again == out
    other = cni.run({**env, "CNI_CONTAINERID": "c2", "CNI_COMMAND": "ADD",
                     "CNI_IFNAME": "eth1"}, conf)
    assert other and other["ips"][0]["address"] == "127.9.0.3/32"
    assert cni.run({**env, "CNI_COMMAND": "CHECK"}, conf) is None
    shown = subprocess.run(["ip", "-n", Path(netns).name, "-o", "addr"], capture_output=True,
                           text=True, check=True).stdout
    assert "eth0    inet 127.9.0.2/32" in shown
    assert cni.run({**env, "CNI_COMMAND": "DEL"}, conf) is None
    assert cni.run({**env, "CNI_COMMAND": "DEL"}, conf) is None  # DEL is idempotent
    with pytest.raises(cni.CniError, match="lost its address"):
        cni.run({**env, "CNI_COMMAND": "CHECK"}, conf)
    links = subprocess.run(["ip", "-n", Path(netns).name, "-o", "link"], capture_output=True,
                           text=True, check=True).stdout
    assert "eth0:" not in links and "eth0p" not in links and "eth1@" in links
    assert sorted(p.name for p in (tmp_path / "ipam").iterdir()) == ["127.9.0.3"]


def test_cni_main_speaks_the_protocol(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CNI_COMMAND", "VERSION")
    out = io.StringIO()
    assert cni.main(io.StringIO(""), out) == 0
    assert "1.0.0" in json.loads(out.getvalue())["supportedVersions"]
    monkeypatch.setenv("CNI_COMMAND", "ADD")
    monkeypatch.delenv("CNI_CONTAINERID", raising=False)
    out = io.StringIO()
    assert cni.main(io.StringIO(json.dumps({"subnet": "127.9.0.0/24", "dataDir": "/x"})),
                    out) == 1
    assert json.loads(out.getvalue())["code"] == 4
