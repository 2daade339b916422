"""What the CLI tests share."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml


@pytest.fixture
def taken() -> Iterator[int]:
    """A port of 127.0.0.1 someone else listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


@pytest.fixture
def kubeconfig(tmp_path: Path) -> Path:
    """Credentials for an API server that is not there (nothing connects
    before the port is bound)."""
    f = tmp_path / "kubeconfig"
    f.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
        "users": [{"name": "x", "user": {}}]}))
    return f
