"""What every driver process on this framework is: its kind's kubelet
plugin, the slice publisher, a background loop (health checks, rescans)
that runs at an interval until the process stops and, with binding
conditions on, the controller that answers them (``binding``); plus
``Latest``, the kind's last discovery, made on first use."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import structlog

from toposerve.dra_driver.kubeletplugin import metrics
from toposerve.dra_driver.kubeletplugin.binding import BindingController, ReadinessOf
from toposerve.dra_driver.kubeletplugin.cdi import DEFAULT_CDI_ROOT, CdiSpecs
from toposerve.dra_driver.kubeletplugin.checkpoint import BOOT_ID_FILE, read_boot_id
from toposerve.dra_driver.kubeletplugin.device_kind import DeviceKind
from toposerve.dra_driver.kubeletplugin.plugin import KubeletPlugin, PluginConfig
from toposerve.dra_driver.kubeletplugin.sockets import KUBELET_REGISTRY_DIR, PluginPaths
from toposerve.dra_driver.resourceslice import SlicePublisher
from toposerve.topology.labels import DialectName

T = TypeVar("T")
log = structlog.get_logger("dra.process")


@dataclass(frozen=True)
class PluginOptions:
    """The options every driver on the framework takes (``toposerve driver
    gpu|net``); a driver's own options extend them."""

    node_name: str
    plugin_dir: Path | None = None
    registry_dir: Path = KUBELET_REGISTRY_DIR
    cdi_root: Path = DEFAULT_CDI_ROOT
    sysfs_root: Path = Path("/sys")
    dev_root: Path = Path("/dev")
    pod_uid: str | None = None
    dialect: DialectName = DialectName.TOPOSERVE
    boot_id_file: Path = BOOT_ID_FILE
    # publish devices with binding conditions and answer them (kubeletplugin.binding)
    binding_conditions: bool = False
    binding_failure_after_s: float = 10.0


class Latest(Generic[T]):
    """The last value ``make`` returned; thread-safe."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._value: T | None = None

    def refresh(self) -> T:
        value = self._make()
        with self._lock:
            self._value = value
        return value

    def get(self) -> T:
        with self._lock:
            value = self._value
        return value if value is not None else self.refresh()


class DriverProcess:
    """Plugin, publisher and the loop calling ``tick`` every ``interval_s``
    (first right after start); a failing tick is counted and logged. With
    ``opts.binding_conditions``, a ``BindingController`` asking
    ``readiness_of`` how the devices are."""

    def __init__(self, api: Any, kind: DeviceKind, opts: PluginOptions, *, cdi_vendor: str,
                 cdi_class: str, interval_s: float, tick: Callable[[], None],
                 loop_name: str, readiness_of: ReadinessOf | None = None) -> None:
        self.publisher = SlicePublisher(api, kind.driver, node_name=opts.node_name)
        paths = PluginPaths(driver=kind.driver, registry_dir=opts.registry_dir,
                            plugin_dir=opts.plugin_dir, pod_uid=opts.pod_uid)
        cfg = PluginConfig(driver=kind.driver, node_name=opts.node_name, paths=paths,
                           cdi=CdiSpecs(opts.cdi_root, cdi_vendor, cdi_class),
                           boot_id=read_boot_id(opts.boot_id_file),
                           health_timeout_s=max(30, int(interval_s * 3)))
        self.plugin = KubeletPlugin(cfg, kind, api, self.publisher)
        self.binding = BindingController(
            api, kind.driver, opts.node_name, self.plugin.pool_names, readiness_of,
            fail_after_s=opts.binding_failure_after_s
        ) if opts.binding_conditions and readiness_of is not None else None
        self._tick = tick
        self._interval_s = interval_s
        self._loop_name = loop_name
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=loop_name, daemon=True)

    def start(self) -> None:
        self.plugin.start()
        self._thread.start()
        if self.binding is not None:
            self.binding.start()

    def stop(self) -> None:
        if self.binding is not None:
            self.binding.stop()
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.plugin.stop()

    def _loop(self) -> None:
        while True:
            try:
                self._tick()
            except Exception as err:
                metrics.BACKGROUND_ERRORS.labels(self.plugin.cfg.driver, self._loop_name).inc()
                log.error("background loop failed", driver=self.plugin.cfg.driver,
                          loop=self._loop_name, error=str(err))
            if self._stop.wait(self._interval_s):
                return
