"""``server.workers``: N router processes serving one port, so a pod uses
N cores. The parent binds one socket a worker on the port, each with
SO_REUSEPORT (the kernel spreads the connections over them evenly, where
one shared socket would wake every worker for each), starts each worker
as a fresh interpreter (``toposerve router --worker``) with its socket and
its assignment on stdin, and supervises them: a worker that dies is
started again on a new socket after a backoff, SIGTERM and SIGINT are
passed on to every worker, and the parent exits once they have all
drained.

Each worker writes its metrics to files in a directory of the parent's
(PROMETHEUS_MULTIPROC_DIR), so a scrape of the port, whichever worker it
reaches, counts every worker's requests; a dead worker's counts stay.

The workers share their view as replicas do: through Redis with
``ha.enabled``, else through a hub the parent runs on a unix socket in a
private directory (``toposerve.router.ha.local_bus``). A worker whose
parent is gone (its stdin closes) stops as on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import sys
import tempfile
import threading
from dataclasses import asdict, dataclass
from typing import Any

import structlog
from prometheus_client import multiprocess

from toposerve.kubeapi import backoff
from toposerve.router.config import RouterConfig
from toposerve.router.ha.local_bus import Hub, max_frame
from toposerve.router.metrics import MULTIPROCESS_ENV
from toposerve.serving.http import bind

log = structlog.get_logger("router.workers")
RESTART_CAP_S = 10.0
STABLE_S = 30.0  # a worker that lived this long starts its restarts' backoff afresh
KILL_MARGIN_S = 5.0  # past a worker's own drain, before SIGKILL


@dataclass
class Assignment:
    """What a worker is told on its stdin: its config document (as the
    parent read it, so every worker runs the same even if the file
    changes), where that came from (for errors), its socket, its index and
    the hub's socket (None with Redis)."""

    doc: dict[str, Any]
    source: str
    fd: int
    index: int
    bus: str | None

    @classmethod
    def read(cls) -> Assignment:
        """This worker's, from the first line of stdin; then a thread waits
        for stdin to close (the parent gone) and stops the worker with
        SIGTERM."""
        a = cls(**json.loads(sys.stdin.buffer.readline()))

        def orphaned() -> None:
            # the descriptor, not sys.stdin: a thread blocked in the buffered
            # reader holds its lock, which the interpreter's exit then waits for
            while os.read(0, 4096):
                pass
            os.kill(os.getpid(), signal.SIGTERM)

        threading.Thread(target=orphaned, name="parent-watch", daemon=True).start()
        return a


class Workers:
    def __init__(self, cfg: RouterConfig, doc: dict[str, Any], source: str,
                 first: socket.socket, argv: list[str]) -> None:
        """``first``: the socket the parent bound (with SO_REUSEPORT), to be
        the first worker's; ``argv``: the command that starts a worker."""
        self.cfg, self.doc, self.source, self.argv = cfg, doc, source, argv
        self.host, self.port = cfg.server.host, first.getsockname()[1]
        self.first: socket.socket | None = first
        self.dir = tempfile.mkdtemp(prefix="toposerve-router-")  # 0700: this user's only
        self.metrics = os.path.join(self.dir, "metrics")
        os.mkdir(self.metrics, 0o700)
        self.hub = (None if cfg.ha.enabled else
                    Hub(os.path.join(self.dir, "bus.sock"), max_frame(cfg.ha.snapshot.max_bytes)))
        self.stopping = asyncio.Event()

    def run(self) -> int:
        try:
            return asyncio.run(self._main())
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    async def _main(self) -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.stopping.set)
        if self.hub is not None:
            await self.hub.start()
        try:
            await asyncio.gather(*(self._keep(i) for i in range(self.cfg.server.workers)))
        finally:
            if self.hub is not None:
                await self.hub.close()
        return 0

    async def _start(self, index: int) -> asyncio.subprocess.Process:
        sock, self.first = self.first or bind(self.host, self.port, reuse_port=True), None
        fd = sock.fileno()
        try:
            proc = await asyncio.create_subprocess_exec(
                *self.argv, stdin=asyncio.subprocess.PIPE, pass_fds=(fd,),
                env={**os.environ, MULTIPROCESS_ENV: self.metrics})
        finally:
            sock.close()  # the worker has its own copy; the parent must accept nothing
        a = Assignment(self.doc, self.source, fd, index,
                       None if self.hub is None else self.hub.path)
        assert proc.stdin is not None  # kept open: it closes when this parent goes
        proc.stdin.write(json.dumps(asdict(a), default=str).encode() + b"\n")
        return proc

    async def _keep(self, index: int) -> None:
        """Worker ``index``, started again whenever it dies, until stopped."""
        loop = asyncio.get_running_loop()
        failures = 0
        while not self.stopping.is_set():
            proc = await self._start(index)
            began = loop.time()
            stop = asyncio.ensure_future(self.stopping.wait())
            exited = asyncio.ensure_future(proc.wait())
            await asyncio.wait({stop, exited}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if self.stopping.is_set():
                await self._end(proc, exited)
                return
            # its gauges go (its counters stay, so the totals never fall back)
            multiprocess.mark_process_dead(proc.pid, self.metrics)  # type: ignore[no-untyped-call]
            failures = 1 if loop.time() - began > STABLE_S else failures + 1
            delay = backoff(failures, RESTART_CAP_S)
            log.error("router worker exited; starting it again", worker=index,
                      code=proc.returncode, retry_in_s=round(delay, 2))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopping.wait(), delay)

    async def _end(self, proc: asyncio.subprocess.Process, exited: asyncio.Future[int]) -> None:
        """SIGTERM, then its own drain's time, then SIGKILL."""
        s = self.cfg.server
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.shield(exited), self.cfg.ha.shutdown_delay_s
                                   + s.drain_timeout_s + KILL_MARGIN_S)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await exited
