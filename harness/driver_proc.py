"""A DRA driver of ours (``toposerve driver <kind>``) as a subprocess of a
test or benchmark, everything it writes under one folder: what the GPU and
the NIC driver's harnesses (``dra_gpu.DriverProc``, ``dra_net.NetDriverProc``)
share."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Generic, Protocol, TypeVar

from harness.dra_kubelet import Kubelet, end_plugin, launch_plugin
from toposerve.dra_driver.kubeletplugin.cdi import CdiSpecs
from toposerve.localcluster.ports import free_port


class DriverEnv(Protocol):
    node: str
    kubeconfig: Path  # the driver's own (service-account token)


E = TypeVar("E", bound=DriverEnv)


@dataclass
class DriverProc(Generic[E]):
    kind: ClassVar[str]        # `toposerve driver <kind>`
    driver: ClassVar[str]
    cdi_vendor: ClassVar[str]
    cdi_class: ClassVar[str]

    env: E
    root: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, kw_only=True)
    port: int = field(default_factory=free_port, kw_only=True)

    @property
    def plugin_dir(self) -> Path:
        return self.root / "plugin"

    @property
    def registration_socket(self) -> Path:
        return self.root / "registry" / f"{self.driver}-reg.sock"

    @property
    def cdi(self) -> CdiSpecs:
        return CdiSpecs(self.root / "cdi", self.cdi_vendor, self.cdi_class)

    @property
    def kubelet(self) -> Kubelet:
        return Kubelet(self.registration_socket, timeout=30)

    @property
    def log(self) -> Path:
        return self.root / "driver.log"

    def argv(self, sysfs: Path, dev: Path, *extra: str, console_script: bool = False
             ) -> list[str]:
        """``console_script``: through ``toposerve`` itself; else the same
        command line through ``toposerve.driver_cmd``, which starts
        quicker (it does not load the other parts)."""
        entry = [str(Path(sys.executable).with_name("toposerve"))] if console_script else [
            sys.executable, "-m", "toposerve.driver_cmd"]
        return [*entry, "--log-level", "warning", "driver", self.kind,
                "--node-name", self.env.node, "--kubeconfig", str(self.env.kubeconfig),
                "--plugin-dir", str(self.plugin_dir), "--registry-dir", str(self.root / "registry"),
                "--cdi-root", str(self.root / "cdi"), "--sysfs-root", str(sysfs),
                "--dev-root", str(dev), "--http-address", f"127.0.0.1:{self.port}", *extra]

    def launch(self, argv: list[str], env: Mapping[str, str] = os.environ) -> None:
        """Returns once the registration socket answers."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.proc = launch_plugin(argv, env, self.log, self.kubelet)

    def stop(self) -> int:
        """SIGTERM, as the kubelet's pod teardown does; the exit code."""
        assert self.proc is not None
        rc = end_plugin(self.proc)
        self.proc = None
        return rc

    def kill(self) -> None:
        if self.proc is not None:
            end_plugin(self.proc, signal.SIGKILL)
            self.proc = None
