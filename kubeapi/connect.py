"""Where a part's credentials come from, the same order for every part
(kubectl's, then the pod's own): ``--kubeconfig``, ``$KUBECONFIG``,
``~/.kube/config``, in-cluster service account."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["ConfigError", "connect"]


class ConfigError(Exception):
    """No usable credentials; the message is one line naming the cause and the fix."""


def _readable(path: str) -> None:
    """ConfigError unless ``path`` holds a YAML mapping (the client's loader
    would raise whatever its parser hits)."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from None
    except (UnicodeDecodeError, yaml.YAMLError):
        doc = None
    if not isinstance(doc, dict):
        raise ConfigError(f"{path}: not a kubeconfig (a YAML mapping with clusters, users "
                          "and contexts); give the path of one")


def connect(kubeconfig: str | os.PathLike[str] | None = None, *, pool_size: int = 16) -> Any:
    """A ``kubernetes`` ApiClient. ``pool_size`` bounds the connections kept
    open (long watches hold one each)."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    explicit = str(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG")
    path = explicit or str(Path.home() / ".kube/config")
    try:
        if explicit or Path(path).exists():
            if not Path(path).is_file():
                what = "--kubeconfig" if kubeconfig else "$KUBECONFIG"
                raise ConfigError(f"{what} {path}: no such file; give the path of a "
                                  "kubeconfig (or unset it inside a pod)")
            _readable(path)
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, client_configuration=cfg)
        else:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=cfg)
    except ConfigException as err:
        where = path if explicit or Path(path).exists() else "in-cluster config"
        first = (str(err).strip().splitlines() or [type(err).__name__])[0].rstrip(".")
        raise ConfigError(f"{where}: {first}; give --kubeconfig, set $KUBECONFIG, or run "
                          "in a pod with a service account") from None
    cfg.connection_pool_maxsize = pool_size
    return client.ApiClient(cfg)
