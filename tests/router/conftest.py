"""Fixtures of the router tests: a real redis-server on loopback, with a
password (the URL carries it)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import redis_proc
from toposerve.localcluster.processes import end_process

REDIS_PASSWORD = "router-tests"


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    # with a password, as the install runs it: the router refuses an open Redis
    url, p = redis_proc.start(REDIS_PASSWORD, workdir=tmp_path)
    try:
        yield url, p
    finally:
        end_process(p, 10)


@pytest.fixture
def redis_url(redis_server: tuple[str, subprocess.Popen[bytes]]) -> str:
    return redis_server[0]
