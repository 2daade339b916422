"""A DRA driver of ours as a host process on the real node: the kubelet's
own plugin paths (the drivers' defaults), a kubeconfig (never in-cluster
config: the service range is not loopback), a work folder for its fake
hardware and its log. For tests, benchmarks and the demo."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from toposerve.localcluster.processes import end_process
from toposerve.localcluster.realnode.paths import NODE_NAME

CDI_ROOT = Path("/var/run/cdi")  # one of the real node's containerd CDI spec dirs


@dataclass
class HostDriver:
    kubeconfig: Path
    workdir: Path  # the driver's fake hardware and driver.log
    http_address: str = "127.0.0.1:0"
    env: Mapping[str, str] = field(default_factory=dict)  # beside this process's own
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    @property
    def log(self) -> Path:
        return self.workdir / "driver.log"

    def driver_args(self) -> list[str]:
        """``driver <kind> ...`` after the node, kubeconfig and CDI options."""
        raise NotImplementedError

    def argv(self) -> list[str]:
        kind, *rest = self.driver_args()
        # toposerve.driver_cmd, not the console script: it starts without the other parts
        return [sys.executable, "-m", "toposerve.driver_cmd", "--log-level", "info",
                "driver", kind, "--node-name", NODE_NAME, "--kubeconfig", str(self.kubeconfig),
                "--cdi-root", str(CDI_ROOT), "--http-address", self.http_address, *rest]

    def registrations(self) -> int:
        """How often the kubelet has registered it (its log says so each time)."""
        text = self.log.read_text() if self.log.exists() else ""
        return text.count("registered with the kubelet")

    def start(self, timeout_s: float = 30) -> None:
        """Start it and return once the kubelet has registered it."""
        before = self.registrations()
        self.workdir.mkdir(parents=True, exist_ok=True)
        argv = self.argv()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=out,
                                         env={**os.environ, **self.env})
        deadline = time.monotonic() + timeout_s
        while self.registrations() <= before:
            if self.proc.poll() is not None:
                raise RuntimeError(f"driver exited {self.proc.returncode}: "
                                   f"{self.log.read_text()[-1500:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the kubelet did not register the driver in {timeout_s:.0f}s")
            time.sleep(0.1)

    def stop(self) -> int:
        """SIGTERM, as a pod's shutdown would; the exit code."""
        if self.proc is None:
            return 0
        rc = end_process(self.proc, 30)
        self.proc = None
        return rc
