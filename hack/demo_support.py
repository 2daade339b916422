"""What the demo's DRA and placement steps share: background processes
that are always stopped, waiting with a deadline, and raw JSON calls."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import urllib3

from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster.processes import end_process

T = TypeVar("T")
TOPOSERVE = [sys.executable, "-m", "toposerve.main"]


class DemoError(RuntimeError):
    """A demo step did not show what it should; the message says what."""


def wait_until(what: str, check: Callable[[], T | None], timeout: float,
               interval: float = 0.3) -> T:
    """``check()``'s first truthy answer; DemoError naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise DemoError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def http_ok(url: str) -> bool:
    try:
        return bool(urllib3.request("GET", url, timeout=2, retries=False).status == 200)
    except urllib3.exceptions.HTTPError:
        return False


class Background:
    """A process of the demo, its output in a log file."""

    def __init__(self, name: str, cmd: list[str], log: Path) -> None:
        self.name, self.log = name, log
        self.started = time.monotonic()
        with log.open("wb") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def alive(self) -> bool:
        """True while it runs; DemoError with its last log lines once it has exited."""
        if self.proc.poll() is None:
            return True
        tail = "\n     ".join(self.log.read_text(errors="replace").splitlines()[-8:])
        raise DemoError(f"{self.name} exited with code {self.proc.returncode}:\n     {tail}")

    def wait_http(self, url: str, timeout: float) -> float:
        """Seconds from the process's start until ``url`` answers 200."""
        wait_until(f"{self.name} at {url}", lambda: self.alive() and http_ok(url), timeout,
                   interval=0.1)
        return time.monotonic() - self.started

    def stop(self) -> None:
        end_process(self.proc, 15)


@contextmanager
def background(name: str, cmd: list[str], log: Path) -> Iterator[Background]:
    proc = Background(name, cmd, log)
    try:
        yield proc
    finally:
        proc.stop()


def create(rest: JsonApi, path: str, obj: dict[str, Any]) -> Any:
    """POST ``obj``; one that is already there is left as it is."""
    try:
        return rest.request("POST", path, body=obj)
    except ApiError as err:
        if err.status != 409:
            raise
        return None


def items(rest: JsonApi, path: str, selector: str = "") -> list[dict[str, Any]]:
    query = [("labelSelector", selector)] if selector else []
    found: list[dict[str, Any]] = rest.request("GET", path, query)["items"]
    return found
