"""One replica of a router group that shares one view: its role, and its
part in a rolling update.

active-active: every replica serves while it is up, and nothing needs a
Lease (nothing a router writes must have a single writer: Responses turns
are keyed by unique ids, decisions and in-flight reports are each
replica's own, a snapshot request names the peer that answers it).
hot-standby: the Lease's holder serves, labelled on its pod for a Service
that selects the leader.

On SIGTERM a replica stops serving (/ready 503 at once; a hot-standby
leader also hands the Lease back), keeps serving for
``ha.shutdownDelaySeconds`` while Services stop sending to it, then
stops listening and lets in-flight requests finish."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

import structlog
from aiohttp import web

from toposerve.kubeapi import JsonApi, connect
from toposerve.router.config import HAConfig
from toposerve.router.ha.elector import Elector
from toposerve.router.ha.pod_label import PodLabel, from_env
from toposerve.router.ha.replication import Replication
from toposerve.router.pool.endpoints import Pool

log = structlog.get_logger("router.ha")


def channel(cfg: HAConfig) -> str:
    """The replicas' Redis channel, named like their Lease."""
    return f"toposerve:decisions:{cfg.lease.namespace}/{cfg.lease.name}"


def _exit() -> None:
    raise web.GracefulExit  # what aiohttp's own SIGTERM handler raises


class Replica:
    def __init__(self, cfg: HAConfig, replication: Replication, pool: Pool,
                 leading: Callable[[bool], None], warm: Callable[[], bool] = lambda: False
                 ) -> None:
        """``leading`` is told of each change of role (from a thread).
        hot-standby: it may take the Lease with a healthy
        endpoint, or once ``warm`` (discovery listed the pods, every
        endpoint found was asked once): on a cluster with no model server
        yet one replica must lead, as the Service sends to the leader
        only, and answer 503 "no endpoint"."""
        self.cfg, self.replication, self.leading = cfg, replication, leading
        self.label: PodLabel | None = None
        self.elector: Elector | None = None
        if cfg.mode == "hot-standby":
            self.elector = Elector(cfg.lease, on_change=self._role, eligible=lambda: any(
                e.healthy for e in pool.routable()) or warm())
        self.stopping = False

    @property
    def leader(self) -> bool:
        """Whether this replica takes traffic now."""
        if self.stopping:
            return False
        return self.elector is None or self.elector.leader

    def _role(self, leader: bool) -> None:
        self.leading(leader)
        if self.label is not None:
            self.label.set(leader)

    def start(self) -> None:
        if self.elector is not None:
            self.label = from_env(JsonApi(connect(self.cfg.lease.kubeconfig)))
            self.elector.start()
        else:
            self.leading(True)
        self.replication.start()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._terminate)

    def _terminate(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        loop = asyncio.get_running_loop()
        log.info("SIGTERM: serving on while traffic moves, then stopping",
                 delay_s=self.cfg.shutdown_delay_s)
        if self.elector is None:
            self.leading(False)
            loop.call_later(self.cfg.shutdown_delay_s, _exit)
            return
        done = loop.run_in_executor(None, self.elector.step_down)  # hands the Lease back
        done.add_done_callback(
            lambda _: loop.call_later(self.cfg.shutdown_delay_s, _exit))

    async def close(self) -> None:
        if not self.stopping:
            self.stopping = True
            if self.elector is not None:
                await asyncio.get_running_loop().run_in_executor(None, self.elector.step_down)
        await self.replication.close()
