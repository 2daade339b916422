"""Where the built cluster tools live (a cache outside the repository,
keyed by version) and a clear error when they are missing."""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path


class ToolsMissing(RuntimeError):
    pass


def versions() -> dict[str, str]:
    text = resources.files("toposerve.localcluster").joinpath("versions.env").read_text()
    pairs = (line.split("=", 1) for line in text.splitlines()
             if line.strip() and not line.startswith("#"))
    return {k.strip(): v.strip() for k, v in pairs}


def cache_dir() -> Path:
    return Path(os.environ.get("TOPOSERVE_CACHE", Path.home() / ".cache/toposerve"))


def state_dir() -> Path:
    """Where running clusters keep their files (kwokctl's workdir)."""
    return Path(os.environ.get("TOPOSERVE_HOME", Path.home() / ".toposerve"))


@dataclass(frozen=True)
class Tools:
    kwokctl: Path
    kwok: Path
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path
    kube_scheduler: Path


def helm_path() -> Path:
    """Where ``make setup`` builds the install's helm (it may not be there yet)."""
    return cache_dir() / "bin" / f"helm-{versions()['HELM_VERSION']}" / "helm"


def find_tools() -> Tools:
    v = versions()
    b = cache_dir() / "bin"
    k8s = b / f"kubernetes-{v['K8S_VERSION']}"
    kwok = b / f"kwok-{v['KWOK_VERSION']}"
    tools = Tools(
        kwokctl=kwok / "kwokctl",
        kwok=kwok / "kwok",
        etcd=b / f"etcd-{v['ETCD_VERSION']}" / "etcd",
        kube_apiserver=k8s / "kube-apiserver",
        kube_controller_manager=k8s / "kube-controller-manager",
        kube_scheduler=k8s / "kube-scheduler",
    )
    missing = [str(p) for p in vars(tools).values() if not os.access(p, os.X_OK)]
    if missing:
        raise ToolsMissing(
            f"cluster tools missing ({', '.join(Path(m).name for m in missing)}): "
            "run `make setup` (or hack/build-cluster-tools.sh) to build them into "
            f"{cache_dir() / 'bin'}")
    return tools
