"""CPU profiles of a local cluster's control-plane components, from their
own ``/debug/pprof/profile`` (Go's pprof), so a slow run says where the
time went instead of being guessed at. The scheduler's pprof paths are
open on loopback (``toposerve.localcluster.cluster.SCHEDULER_OPEN_PATHS``)."""

from __future__ import annotations

import shutil
import subprocess
import warnings
from pathlib import Path
from typing import Any

import urllib3
import yaml

from toposerve.localcluster.clusters import cluster_dir


def component(cluster: str, name: str) -> tuple[str, Path]:
    """``(https://127.0.0.1:port, binary)`` of one component of the cluster
    (``kube-scheduler``, ``kube-apiserver``), from kwokctl's record of it."""
    docs = yaml.safe_load_all((cluster_dir(cluster) / "kwok.yaml").read_text())
    doc: dict[str, Any] = next(d for d in docs if d.get("kind") == "KwokctlConfiguration")
    for c in doc.get("components") or []:
        if c.get("name") == name:
            port = next(p["port"] for p in c.get("ports") or [] if p.get("name") == "https")
            return f"https://127.0.0.1:{port}", Path(c["binary"])
    raise LookupError(f"cluster {cluster!r} has no component {name!r}")


def fetch(cluster: str, name: str, path: str, read_timeout: float = 30) -> bytes:
    """GET ``path`` from one component of the cluster (``/metrics``,
    ``/debug/pprof/profile?seconds=N``), with the cluster's admin cert."""
    url, _ = component(cluster, name)
    pki = cluster_dir(cluster) / "pki"
    # kwokctl's components serve its own self-signed admin cert on loopback
    http = urllib3.PoolManager(cert_reqs="CERT_NONE", cert_file=str(pki / "admin.crt"),
                               key_file=str(pki / "admin.key"))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        r = http.request("GET", f"{url}{path}", retries=False,
                         timeout=urllib3.Timeout(connect=5, read=read_timeout))
    if r.status != 200:
        raise RuntimeError(f"{name} {path}: HTTP {r.status}: {r.data[:200]!r}")
    return bytes(r.data)


def cpu_profile(cluster: str, name: str, seconds: int, out: Path) -> Path:
    """Write a ``seconds``-long CPU profile of the component to ``out``."""
    out.write_bytes(fetch(cluster, name, f"/debug/pprof/profile?seconds={seconds}",
                          read_timeout=seconds + 60))
    return out


def top(binary: Path, profile: Path, lines: int = 30) -> str:
    """``go tool pprof -top`` of a profile (cumulative order), or why not."""
    go = shutil.which("go")
    if go is None:
        return "(no go command to read the profile with)"
    p = subprocess.run([go, "tool", "pprof", "-top", "-cum", f"-nodecount={lines}",
                        str(binary), str(profile)], capture_output=True, text=True,
                       timeout=120, check=False)
    return p.stdout if p.returncode == 0 else p.stderr.strip()
