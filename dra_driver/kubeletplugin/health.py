"""Device health: a board the driver reports into, streamed to the kubelet
by ``DRAResourceHealth`` (v1 and v1alpha1). Every message lists every
device, so the kubelet never has to merge partial updates."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Any

import grpc

from toposerve.dra_driver._generated import (
    health_v1_pb2,
    health_v1_pb2_grpc,
    health_v1alpha1_pb2,
    health_v1alpha1_pb2_grpc,
)

DeviceKey = tuple[str, str]  # (pool, device)


class Health(IntEnum):  # the proto's HealthStatus numbers
    UNKNOWN = 0
    HEALTHY = 1
    UNHEALTHY = 2


@dataclass(frozen=True)
class DeviceHealth:
    pool: str
    device: str
    health: Health = Health.UNKNOWN
    message: str = ""
    updated: float = 0.0  # unix seconds


class HealthBoard:
    """Current health of every device; thread-safe. ``on_change`` runs after
    a device's health (not just its timestamp) changed."""

    def __init__(self, timeout_s: int = 60, clock: Callable[[], float] = time.time,
                 on_change: Callable[[list[DeviceHealth]], None] | None = None) -> None:
        self.timeout_s = timeout_s
        self._clock = clock
        self._on_change = on_change
        self._cond = threading.Condition()
        self._devices: dict[DeviceKey, DeviceHealth] = {}
        self._version = 0
        self._closed = False

    def set_devices(self, keys: Iterable[DeviceKey]) -> None:
        """The devices there are; new ones start UNKNOWN, gone ones are dropped."""
        keys = list(keys)
        with self._cond:
            old = self._devices
            self._devices = {k: old.get(k, DeviceHealth(pool=k[0], device=k[1])) for k in keys}
            changed = set(old) != set(self._devices)
            if changed:
                self._version += 1
                self._cond.notify_all()
        if changed and self._on_change:
            self._on_change(self.snapshot())

    def report(self, pool: str, device: str, healthy: bool, message: str = "") -> bool:
        """Record one check's outcome; True when the device's health changed."""
        return self.update([(pool, device, healthy, message)])

    def update(self, results: Iterable[tuple[str, str, bool, str]]) -> bool:
        """Record a round of checks (pool, device, healthy, message) at once,
        so the stream never shows half a round; True when any health changed."""
        changed = False
        with self._cond:
            now = self._clock()
            for pool, device, healthy, message in results:
                status = Health.HEALTHY if healthy else Health.UNHEALTHY
                old = self._devices.get((pool, device), DeviceHealth(pool=pool, device=device))
                self._devices[(pool, device)] = replace(old, health=status, message=message,
                                                        updated=now)
                changed |= old.health != status
            self._version += 1
            self._cond.notify_all()
        if changed and self._on_change:
            self._on_change(self.snapshot())
        return changed

    def snapshot(self) -> list[DeviceHealth]:
        with self._cond:
            return [self._devices[k] for k in sorted(self._devices)]

    def unhealthy(self) -> set[DeviceKey]:
        with self._cond:
            return {k for k, d in self._devices.items() if d.health == Health.UNHEALTHY}

    def watch(self, active: Callable[[], bool],
              poll_s: float = 0.5) -> Iterator[list[DeviceHealth]]:
        """A snapshot now, then one after every report, while ``active()``
        and the board is open."""
        seen = -1
        while active():
            with self._cond:
                if self._closed:
                    return
                if self._version == seen:
                    self._cond.wait(poll_s)
                    continue
                seen = self._version
            yield self.snapshot()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()


def _servicer(pb2: Any, base: type, board: HealthBoard) -> Any:
    class Servicer(base):  # type: ignore[misc]
        def NodeWatchResources(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            for snap in board.watch(context.is_active):
                yield pb2.NodeWatchResourcesResponse(devices=[
                    pb2.DeviceHealth(
                        device=pb2.DeviceIdentifier(pool_name=d.pool, device_name=d.device),
                        health=int(d.health), last_updated_time=int(d.updated),
                        health_check_timeout_seconds=board.timeout_s, message=d.message)
                    for d in snap])
    return Servicer()


_VERSIONS = ((health_v1_pb2, health_v1_pb2_grpc), (health_v1alpha1_pb2, health_v1alpha1_pb2_grpc))


def add_health_services(server: grpc.Server, board: HealthBoard) -> list[str]:
    """Serve the board on every health API version, newest first; returns
    their full service names (what registration advertises)."""
    names = []
    for pb2, stubs in _VERSIONS:
        stubs.add_DRAResourceHealthServicer_to_server(
            _servicer(pb2, stubs.DRAResourceHealthServicer, board), server)
        names.append(pb2.DESCRIPTOR.services_by_name["DRAResourceHealth"].full_name)
    return names
