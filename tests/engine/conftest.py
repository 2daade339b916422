"""The engine tier: two real vLLM servers (the CPU build `make engines`
caches) on loopback, one core each, shared by the tier's tests; the router
in front is started per test. A missing engine is an error naming `make
engines`, never a skip."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.engines import EngineMissing, installed, nixl_installed
from harness.vllm import VllmServer, start_many


@contextlib.contextmanager
def vllm_pair(logs: Path, nixl: bool = False) -> Iterator[list[VllmServer]]:
    """Two real vLLM servers logging under ``logs`` (``nixl``: with the
    NixlConnector, for prefill/decode), stopped after; a missing engine
    fails the test naming `make engines`."""
    try:
        installed()
        if nixl:
            nixl_installed()
    except EngineMissing as err:
        pytest.fail(str(err), pytrace=False)
    servers = start_many(logs, 2, nixl=nixl)
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.fixture(scope="package")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmServer]]:
    logs = tmp_path_factory.mktemp("vllm")
    print(f"[engine] vLLM logs in {logs}", file=sys.stderr)
    with vllm_pair(logs) as servers:
        yield servers


@pytest.fixture
def model_dir(engines: list[VllmServer]) -> Path:
    return Path(engines[0].extra["model"])
