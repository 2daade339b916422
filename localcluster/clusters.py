"""Where a local cluster's files live and how to reach it: the floor under
both the kwok cluster (``cluster``) and the real node (``realnode``), which
each need it and must not import each other's modules for it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from toposerve.kubeapi import connect
from toposerve.localcluster.tools import state_dir


class ClusterError(RuntimeError):
    """A cluster operation failed; the message is one line for a person."""


def kwok_workdir() -> Path:
    return state_dir() / "kwok"


def cluster_dir(name: str) -> Path:
    return kwok_workdir() / "clusters" / name


def kubeconfig_path(name: str) -> Path:
    return cluster_dir(name) / "kubeconfig.yaml"


def api_client(name: str) -> Any:
    path = kubeconfig_path(name)
    if not path.exists():
        raise ClusterError(f"no cluster named {name!r} (no {path})")
    return connect(path, pool_size=32, named_by=f"local cluster {name}: kubeconfig")
