"""Socket names: the kubelet's defaults, pod-UID names for rolling updates,
hashed when the path would pass AF_UNIX's 108 bytes."""

from __future__ import annotations

from pathlib import Path

import pytest

from toposerve.dra_driver.kubeletplugin.sockets import (
    UNIX_PATH_MAX,
    PathError,
    PluginPaths,
    registration_socket_name,
    remove_stale_socket,
)

UID = "6d4b2c9e-0f1a-4b3c-8d2e-9a8b7c6d5e4f"


def test_defaults() -> None:
    p = PluginPaths(driver="gpu.toposerve.io")
    assert p.registration_socket == Path(
        "/var/lib/kubelet/plugins_registry/gpu.toposerve.io-reg.sock")
    assert p.dra_socket == Path("/var/lib/kubelet/plugins/gpu.toposerve.io/dra.sock")


def test_rolling_update_names() -> None:
    p = PluginPaths(driver="gpu.toposerve.io", pod_uid=UID)
    assert p.registration_socket.name == f"gpu.toposerve.io-{UID}-reg.sock"
    assert p.dra_socket.name == f"dra-{UID}.sock"


@pytest.mark.parametrize("dir_len, prefix", [(60, "gpu.toposerve.io-"), (71, "dra-")])
def test_hashed_when_too_long(dir_len: int, prefix: str) -> None:
    registry = Path("/" + "d" * (dir_len - 1))
    name = registration_socket_name(registry, "gpu.toposerve.io", UID)
    assert name.startswith(prefix) and UID not in name and name.endswith("-reg.sock")
    assert len(str(registry / name)) <= UNIX_PATH_MAX
    assert name == registration_socket_name(registry, "gpu.toposerve.io", UID)  # stable
    assert name != registration_socket_name(registry, "gpu.toposerve.io", UID[::-1])


def test_only_sockets_are_removed(tmp_path: Path) -> None:
    f = tmp_path / "x.sock"
    assert not remove_stale_socket(f)
    f.write_text("not a socket")
    with pytest.raises(PathError, match="is not a socket"):
        remove_stale_socket(f)
