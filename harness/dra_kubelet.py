"""What the kubelet does to a DRA plugin, as a gRPC client built from our
protos: find it through its registration socket, then call it."""

from __future__ import annotations

import contextlib
import signal
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from harness.waiting import wait_for
from toposerve.dra_driver._generated import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from toposerve.dra_driver.kubeletplugin.sockets import grpc_target

DRA = {"v1": (dra_v1_pb2, dra_v1_pb2_grpc), "v1beta1": (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)}
HEALTH = {"v1": (health_v1_pb2, health_v1_pb2_grpc),
          "v1alpha1": (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc)}


def launch_plugin(argv: list[str], env: Mapping[str, str], log: Path,
                  kubelet: Kubelet) -> subprocess.Popen[bytes]:
    """A driver command as a subprocess, its output appended to ``log``,
    returned once its registration socket answers ``GetInfo``."""
    with open(log, "ab") as out:  # the child keeps its own copy of the descriptor
        proc = subprocess.Popen(argv, env=dict(env), stdout=out, stderr=out)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"driver exited {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            kubelet.get_info()
        except Exception:
            return False
        return True

    wait_for("the driver's registration socket", up, timeout=30)
    return proc


def end_plugin(proc: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGTERM) -> int:
    """Send ``sig`` (SIGTERM, as the kubelet's pod teardown does); the exit code."""
    proc.send_signal(sig)
    return proc.wait(timeout=30)


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    uid: str


class Kubelet:
    def __init__(self, registration_socket: Path, timeout: float = 45) -> None:
        self.registration_socket = registration_socket
        self.timeout = timeout  # the kubelet's own limit for a DRA call

    @contextlib.contextmanager
    def _channel(self, path: str | Path) -> Iterator[grpc.Channel]:
        # Go's kubelet dials any AF_UNIX path; gRPC in Python needs help with long ones.
        with grpc_target(Path(path)) as target, grpc.insecure_channel(target) as ch:
            yield ch

    def get_info(self) -> Any:
        with self._channel(self.registration_socket) as ch:
            return pluginregistration_pb2_grpc.RegistrationStub(ch).GetInfo(
                pluginregistration_pb2.InfoRequest(), timeout=self.timeout)

    def notify(self, registered: bool, error: str = "") -> Any:
        with self._channel(self.registration_socket) as ch:
            return pluginregistration_pb2_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=registered,
                                                          error=error), timeout=self.timeout)

    @contextlib.contextmanager
    def _dra(self, version: str) -> Iterator[tuple[Any, Any]]:
        pb2, stubs = DRA[version]
        with self._channel(self.get_info().endpoint) as ch:
            yield pb2, stubs.DRAPluginStub(ch)

    def prepare(self, claims: list[Claim], version: str = "v1",
                timeout: float | None = None) -> dict[str, Any]:
        with self._dra(version) as (pb2, stub):
            resp = stub.NodePrepareResources(pb2.NodePrepareResourcesRequest(claims=[
                pb2.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]),
                timeout=timeout or self.timeout)
        return dict(resp.claims)

    def unprepare(self, claims: list[Claim], version: str = "v1") -> dict[str, str]:
        with self._dra(version) as (pb2, stub):
            resp = stub.NodeUnprepareResources(pb2.NodeUnprepareResourcesRequest(claims=[
                pb2.Claim(namespace=c.namespace, name=c.name, uid=c.uid) for c in claims]),
                timeout=self.timeout)
        return {uid: r.error for uid, r in resp.claims.items()}

    def watch_health(self, version: str = "v1") -> Iterator[list[tuple[str, str, int, str]]]:
        """(pool, device, health, message) of every device, message by message."""
        pb2, stubs = HEALTH[version]
        with self._channel(self.get_info().endpoint) as ch:
            for msg in stubs.DRAResourceHealthStub(ch).NodeWatchResources(
                    pb2.NodeWatchResourcesRequest(), timeout=self.timeout):
                yield [(d.device.pool_name, d.device.device_name, d.health, d.message)
                       for d in msg.devices]
