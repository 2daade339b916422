"""The engine tier: two real vLLM servers (the CPU build `make engines`
caches) on loopback, one core each, shared by the tier's tests; the router
in front is started per test. A missing engine is an error naming `make
engines`, never a skip."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.engines import EngineMissing, installed
from harness.vllm import VllmServer, start_many


@pytest.fixture(scope="package")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmServer]]:
    try:
        installed()
    except EngineMissing as err:
        pytest.fail(str(err), pytrace=False)
    logs = tmp_path_factory.mktemp("vllm")
    servers = start_many(logs, 2)
    print(f"[engine] vLLM logs in {logs}", file=sys.stderr)
    try:
        yield servers
    finally:
        for s in servers:
            s.stop()


@pytest.fixture
def model_dir(engines: list[VllmServer]) -> Path:
    return Path(engines[0].extra["model"])
