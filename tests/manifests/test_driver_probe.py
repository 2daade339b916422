"""The DaemonSet's exec liveness probe, run exactly as rendered: it passes
while this pod's own sockets (named by its UID) answer GetInfo and an empty
prepare, and fails with the reason when they do not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.manifests.helpers import objects, one
from toposerve.dra_driver._generated import dra_v1_pb2 as dra_pb2
from toposerve.dra_driver._generated import dra_v1_pb2_grpc as dra_grpc
from toposerve.dra_driver.kubeletplugin import registration, sockets


class EmptyPrepare(dra_grpc.DRAPluginServicer):  # type: ignore[misc]
    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        return dra_pb2.NodePrepareResourcesResponse()


def _probe_command(registry: Path) -> list[str]:
    ds = one(objects(f"gpuDriver.kubeletDir={registry.parent}", only=["gpu-driver"]),
             "DaemonSet")
    cmd: list[str] = ds["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["exec"][
        "command"]
    assert cmd[-1] == str(registry)
    return [sys.executable, *cmd[1:]]  # the test's interpreter in place of the image's python3


@pytest.fixture
def plugin() -> Iterator[tuple[Path, str, Any]]:
    # short: a unix socket path has at most 107 bytes
    tmp = Path(tempfile.mkdtemp(prefix="tsm-", dir="/tmp"))
    registry = tmp / "plugins_registry"
    registry.mkdir()
    pod_uid = str(uuid.uuid4())
    paths = sockets.PluginPaths("gpu.toposerve.io", registry_dir=registry,
                                plugin_dir=tmp / "plugin", pod_uid=pod_uid)
    paths.data_dir.mkdir()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    registration.add_registration_service(server, registration.RegistrationServicer(
        "gpu.toposerve.io", str(paths.dra_socket), ["v1.DRAPlugin"], lambda ok, err: None))
    dra_grpc.add_DRAPluginServicer_to_server(EmptyPrepare(), server)
    for sock in (paths.registration_socket, paths.dra_socket):
        server.add_insecure_port(sockets.unix_address(sock))
    server.start()
    try:
        yield registry, pod_uid, server
    finally:
        server.stop(grace=None)
        shutil.rmtree(tmp)


def _run(cmd: list[str], pod_uid: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env={**os.environ, "POD_UID": pod_uid}, text=True,
                          capture_output=True, timeout=60, check=False)


def test_probe_passes_on_own_sockets_and_fails_with_the_reason(
        plugin: tuple[Path, str, Any]) -> None:
    registry, pod_uid, server = plugin
    cmd = _probe_command(registry)
    ok = _run(cmd, pod_uid)
    assert ok.returncode == 0, ok.stderr
    # another pod's UID: its sockets are not there, so this probe cannot pass for it
    other = _run(cmd, str(uuid.uuid4()))
    assert other.returncode == 1 and "UNAVAILABLE" in other.stderr
    server.stop(grace=None)
    gone = _run(cmd, pod_uid)
    assert gone.returncode == 1 and "UNAVAILABLE" in gone.stderr
