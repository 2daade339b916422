"""Where a part's credentials come from, the same order for every part
(kubectl's, then the pod's own): ``--kubeconfig``, ``$KUBECONFIG``,
``~/.kube/config``, in-cluster service account."""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any

from toposerve.kubeapi.kubeconfig import problem

__all__ = ["ConfigError", "connect"]


class ConfigError(Exception):
    """No usable credentials; the message is one line naming the cause and the fix."""


def _readable(path: str, where: str) -> None:
    """ConfigError unless ``path`` holds a kubeconfig the client's loader
    can read (it would raise whatever its parser or a field's type hits)."""
    import yaml

    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{where}: cannot read: {err.strerror}") from None
    except (UnicodeDecodeError, yaml.YAMLError):
        doc = None
    if not isinstance(doc, dict):
        raise ConfigError(f"{where}: not a kubeconfig (a YAML mapping with clusters, users "
                          "and contexts); give the path of one")
    wrong = problem(doc)
    if wrong is not None:
        raise ConfigError(f"{where}: {wrong}; correct it or give another kubeconfig")


def _pem(cfg: Any, where: str) -> None:
    """ConfigError unless the TLS files the loader left (the ``*-data``
    fields written out, or the files named) load: else every request
    fails later, in whatever loop makes it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    try:
        if cfg.ssl_ca_cert:
            ctx.load_verify_locations(cafile=cfg.ssl_ca_cert)
    except OSError as err:  # ssl.SSLError is one
        raise ConfigError(f"{where}: certificate-authority: not a PEM certificate "
                          f"({getattr(err, 'reason', None) or err.strerror or err}); "
                          "correct it or give another kubeconfig") from None
    try:
        if cfg.cert_file:  # an encrypted key is refused (the client cannot ask for a password)
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file, password=lambda: b"")
    except OSError as err:
        raise ConfigError(f"{where}: client-certificate: not a PEM certificate and key "
                          f"({getattr(err, 'reason', None) or err.strerror or err}); "
                          "correct it or give another kubeconfig") from None


def connect(kubeconfig: str | os.PathLike[str] | None = None, *, pool_size: int = 16,
            named_by: str = "--kubeconfig") -> Any:
    """A ``kubernetes`` ApiClient. ``pool_size`` bounds the connections kept
    open (long watches hold one each); ``named_by`` is what gave
    ``kubeconfig`` (a flag, a config field), for the error's line."""
    from kubernetes import client, config
    from kubernetes.config.config_exception import ConfigException

    cfg = client.Configuration()
    explicit = str(kubeconfig) if kubeconfig else os.environ.get("KUBECONFIG")
    path = explicit or str(Path.home() / ".kube/config")
    from_file = bool(explicit) or Path(path).exists()
    where = (f"{named_by if kubeconfig else '$KUBECONFIG'} {path}" if explicit
             else path if from_file else "in-cluster config")
    try:
        if from_file:
            if not Path(path).is_file():
                raise ConfigError(f"{where}: no such file; give the path of a "
                                  "kubeconfig (or unset it inside a pod)")
            _readable(path, where)
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=path, client_configuration=cfg)
        else:
            config.load_incluster_config(  # type: ignore[no-untyped-call]
                client_configuration=cfg)
    except ConfigException as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0].rstrip(".")
        raise ConfigError(f"{where}: {first}; give {named_by}, set $KUBECONFIG, or run "
                          "in a pod with a service account") from None
    _pem(cfg, where)
    cfg.connection_pool_maxsize = pool_size
    return client.ApiClient(cfg)
