"""CustomResourceDefinitions a local cluster installs when asked
(``toposerve cluster up --crd NAME``, ``ClusterSpec.crds``), and the one way
any CRD is installed and waited for (``install``; the scale runner's LWS
CRDs go through it too).

A CRD another project publishes is read from that project's Go module at a
pinned version, as the Go module proxy serves it (``go mod download``,
which checks the module against the checksum database), and kept in the
tools cache keyed by that version: nothing of it is copied into this
repository, and the same version gives the same file on every machine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster.clusters import ClusterError
from toposerve.localcluster.tools import cache_dir

PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@dataclass(frozen=True)
class ModuleCRD:
    module: str
    version: str
    file: str  # inside the module
    # an annotation of the CRD that names the version, checked against ours
    version_annotation: str | None = None


# The Gateway API Inference Extension's InferencePool (inference.networking.k8s.io/v1):
# the version its conformance suite is built at (docs/endpoint-picker.md)
INFERENCE_POOL = ModuleCRD("sigs.k8s.io/gateway-api-inference-extension", "v1.6.0",
                           "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml",
                           "inference.networking.k8s.io/bundle-version")
# The Prometheus operator's ServiceMonitor and PodMonitor (monitoring.coreos.com/v1), which the
# chart renders when asked (docs/install.md, Monitoring); its annotation writes 0.85.0 for v0.85.0
PROMETHEUS_OPERATOR = ("github.com/prometheus-operator/prometheus-operator", "v0.85.0")
SERVICE_MONITOR = ModuleCRD(
    *PROMETHEUS_OPERATOR,
    "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml",
    "operator.prometheus.io/version")
POD_MONITOR = ModuleCRD(
    *PROMETHEUS_OPERATOR, "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml",
    "operator.prometheus.io/version")
CRDS: dict[str, ModuleCRD] = {"inference-pool": INFERENCE_POOL,
                              "service-monitor": SERVICE_MONITOR, "pod-monitor": POD_MONITOR}


def crd_file(name: str) -> Path:
    """The cached CRD of ``name`` (one of CRDS), fetched first if need be."""
    c = CRDS[name]
    cached = cache_dir() / "crds" / f"{name}-{c.version}.yaml"
    if cached.is_file():
        return cached
    go = shutil.which("go")
    if go is None:
        raise ClusterError(f"the {name} CRD comes from {c.module}@{c.version} on the Go module "
                           "proxy: install Go (go >= 1.22 on PATH) or put the file at "
                           f"{cached}")
    with tempfile.TemporaryDirectory() as tmp:  # outside any module: nothing is added to one
        done = subprocess.run([go, "mod", "download", "-json", f"{c.module}@{c.version}"],
                              cwd=tmp, capture_output=True, text=True, timeout=600, check=False,
                              env={**os.environ, "GOFLAGS": "-mod=mod"})
    try:
        info = json.loads(done.stdout)
    except ValueError:
        info = {"Error": (done.stderr or done.stdout).strip()[-300:]}
    if done.returncode or info.get("Error") or not info.get("Dir"):
        raise ClusterError(f"cannot fetch {c.module}@{c.version} for the {name} CRD: "
                           f"{info.get('Error') or 'go mod download failed'}")
    text = (Path(info["Dir"]) / c.file).read_text()
    check(name, yaml.safe_load(text))
    cached.parent.mkdir(parents=True, exist_ok=True)
    part = cached.with_suffix(".part")
    part.write_text(text)
    part.replace(cached)
    return cached


def check(name: str, crd: Any) -> None:
    """That ``crd`` is a CRD of the pinned version (the module's file moved or
    changed its meaning otherwise)."""
    c = CRDS[name]
    ok = isinstance(crd, dict) and crd.get("kind") == "CustomResourceDefinition"
    if ok and c.version_annotation is not None:
        named = (crd.get("metadata") or {}).get("annotations", {}).get(c.version_annotation)
        ok = named in (c.version, c.version.removeprefix("v"))
    if not ok:
        raise ClusterError(f"{c.module}@{c.version}'s {c.file} is not the {name} CRD of "
                           f"{c.version}")


def load(name: str) -> dict[str, Any]:
    crd: dict[str, Any] = yaml.safe_load(crd_file(name).read_text())
    check(name, crd)
    return crd


def established(crd: dict[str, Any]) -> bool:
    """Whether a CustomResourceDefinition as read back is served yet."""
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (crd.get("status") or {}).get("conditions") or [])


def install(rest: JsonApi, crds: list[dict[str, Any]], what: str,
            timeout: float = 60) -> float:
    """Creates ``crds`` (one already there is left as it is) and waits until
    each is served; the seconds it took."""
    t0 = time.monotonic()
    for c in crds:
        try:
            rest.request("POST", PATH, body=c)
        except ApiError as err:
            if err.status != 409:
                raise ClusterError(f"cannot create {what}: {err}") from None
    while not all(established(rest.request("GET", f"{PATH}/{c['metadata']['name']}"))
                  for c in crds):
        if time.monotonic() - t0 > timeout:
            raise ClusterError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.25)
    return time.monotonic() - t0


def install_named(rest: JsonApi, names: list[str]) -> float:
    """The CRDs of CRDS by name."""
    return install(rest, [load(n) for n in names], " and ".join(f"the {n} CRD" for n in names))
