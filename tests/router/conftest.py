"""Fixtures of the router tests: a real redis-server on loopback, with a
password (the URL carries it)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from harness.waiting import wait_for
from toposerve.localcluster.ports import free_port
from toposerve.localcluster.processes import end_process

REDIS_PASSWORD = "router-tests"


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    server = shutil.which("redis-server")
    assert server, "redis-server missing: `make setup` installs it (hack/install-system-deps.sh)"
    port = free_port()
    # with a password, as the install runs it: the router refuses an open Redis
    p = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", str(tmp_path),
                          "--requirepass", REDIS_PASSWORD],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{port}/0"

    def answers() -> bool:
        try:
            return bool(redis.Redis.from_url(url).ping())
        except redis.ConnectionError:
            return False

    wait_for("redis to answer", answers, interval=0.05)
    try:
        yield url, p
    finally:
        end_process(p, 10)


@pytest.fixture
def redis_url(redis_server: tuple[str, subprocess.Popen[bytes]]) -> str:
    return redis_server[0]
