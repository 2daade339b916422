"""Real processes for tests and benchmarks: simulated model servers and
routers (ours or a peer), each a subprocess on a loopback port."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from toposerve.localcluster.ports import free_port
from toposerve.localcluster.processes import end_process

MODEL = "toposerve/sim-model"


@dataclass
class Proc:
    url: str
    popen: subprocess.Popen[bytes]
    log: Path
    extra: dict[str, Any] = field(default_factory=dict)

    def cpu_seconds(self) -> float:
        """User + system CPU time so far of the process and its live
        descendants (some servers run their workers as child processes)."""
        root = psutil.Process(self.popen.pid)
        total = 0.0
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def samples(self) -> list[Sample]:
        """Every sample on its /metrics now (a process starved of CPU by
        the engines beside it may take seconds to answer)."""
        text = httpx.get(self.url + "/metrics", timeout=30).text
        return [s for fam in text_string_to_metric_families(text) for s in fam.samples]

    def metric(self, name: str, **labels: str) -> float:
        """The sum of the samples named ``name`` (with ``labels``, when
        given) on its /metrics now."""
        return sum(s.value for s in self.samples()
                   if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()))

    def counters(self) -> dict[str, float]:
        """Every counter and histogram sum and count on its /metrics now,
        summed over their labels."""
        out: dict[str, float] = {}
        for s in self.samples():
            if s.name.endswith(("_total", "_sum", "_count")):
                out[s.name] = out.get(s.name, 0.0) + s.value
        return out

    def kill(self) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)

    def stop(self) -> None:
        end_process(self.popen, 10)


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    """Until ``url`` answers 200 (a loaded machine may take a while to start
    a Python server and, for a router, to find its endpoints)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited ({proc.returncode}): {log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} never answered 200: {log.read_text()[-2000:]}")


class Procs:
    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.all: list[Proc] = []

    def _spawn(self, args: list[str], name: str) -> tuple[subprocess.Popen[bytes], Path]:
        log = self.tmp / f"{name}-{len(self.all)}.log"
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        p = subprocess.Popen([sys.executable, "-m", "toposerve.main", *args],
                             stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env)
        return p, log

    def sim(self, host: str = "127.0.0.1", port: int | None = None, wait: bool = True,
            **flags: Any) -> Proc:
        port = port or free_port(host)
        flags.setdefault("time_scale", 0.05)
        args = ["sim", "--host", host, "--port", str(port)]
        for k, v in flags.items():
            args += [f"--{k.replace('_', '-')}", str(v)]
        p, log = self._spawn(args, "sim")
        proc = Proc(f"http://{host}:{port}", p, log)
        self.all.append(proc)
        if wait and not flags.get("slow_start_s"):
            wait_http(proc.url + "/health", p, log)
        return proc

    def router(self, config: dict[str, Any] | None = None, endpoints: list[str] | None = None,
               wait_ready: bool = True, mode: str = "standalone") -> Proc:
        port = free_port()
        cfg: dict[str, Any] = {"apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
                               **(config or {})}
        cfg.setdefault("server", {}).update(host="127.0.0.1", port=port)
        if endpoints is not None:
            cfg["discovery"] = {"static": [{"url": u} for u in endpoints]}
        cfg.setdefault("scrape", {"intervalSeconds": 0.05})  # tests want quick reactions
        path = self.tmp / f"router-{len(self.all)}.yaml"
        path.write_text(yaml.safe_dump(cfg))
        p, log = self._spawn(["router", "--config", str(path), "--mode", mode], "router")
        proc = Proc(f"http://127.0.0.1:{port}", p, log, {"config": path})
        self.all.append(proc)
        wait_http(proc.url + ("/ready" if wait_ready else "/health"), p, log)
        return proc

    def command(self, argv: list[str], name: str, url: str, ready_paths: tuple[str, ...],
                env: dict[str, str] | None = None) -> Proc:
        """Any other router (a peer) given as a full command line; ``env``:
        added to this process's environment."""
        log = self.tmp / f"{name}-{len(self.all)}.log"
        p = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                             env=None if env is None else {**os.environ, **env})
        proc = Proc(url, p, log)
        self.all.append(proc)
        deadline = time.monotonic() + 60
        while True:
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited ({p.returncode}): {log.read_text()[-2000:]}")
            try:
                if any(httpx.get(url + path, timeout=1).status_code == 200
                       for path in ready_paths):
                    return proc
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} never became ready: {log.read_text()[-2000:]}")
            time.sleep(0.2)

    def close(self) -> None:
        for p in reversed(self.all):
            p.stop()
