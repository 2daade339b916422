"""A real redis-server on loopback for the tests and benchmarks: with a
password (the router refuses an open Redis) or without (the tests of that
refusal), on a free port or on the one it had (started again after a kill),
returned once it answers PING."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit

import redis

from harness.waiting import wait_for
from toposerve.localcluster.ports import free_port


def answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url).ping())
    except redis.ConnectionError:
        return False


def start(password: str | None = None, port: int | None = None, workdir: Path | None = None,
          log: Path | None = None) -> tuple[str, subprocess.Popen[bytes]]:
    """The server's URL (the password in it) and its process; ``workdir``:
    where it may write (nothing is saved), ``log``: its output."""
    server = shutil.which("redis-server")
    if server is None:
        raise RuntimeError("redis-server missing: `make setup` installs it "
                           "(hack/install-system-deps.sh)")
    port = port or free_port()
    args = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no"]
    args += ["--dir", str(workdir)] if workdir else []
    args += ["--requirepass", password] if password else []
    out: IO[bytes] | int = log.open("wb") if log else subprocess.DEVNULL
    p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    url = f"redis://{f':{password}@' if password else ''}127.0.0.1:{port}/0"

    def ready() -> bool:
        if p.poll() is not None:
            said = f": {log.read_text()[-2000:]}" if log else ""
            raise RuntimeError(f"redis-server exited ({p.returncode}){said}")
        return answers(url)

    wait_for("redis to answer", ready, interval=0.05)
    return url, p


def start_again(url: str) -> subprocess.Popen[bytes]:
    """A server on ``url``'s port and password, after the one there was killed."""
    parts = urlsplit(url)
    return start(parts.password, parts.port)[1]
