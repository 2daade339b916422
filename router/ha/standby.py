"""One replica of a hot-standby pair: its election, its share of the
routing state, and its part in a rolling update (on SIGTERM it stops
leading and hands the Lease back at once, keeps serving for
``ha.shutdownDelaySeconds`` while Services stop sending to it, then stops
listening and lets in-flight requests finish)."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Mapping

import structlog
from aiohttp import web

from toposerve.kubeapi import JsonApi, connect
from toposerve.router.config import HAConfig, ResponsesStoreConfig
from toposerve.router.ha.elector import Elector
from toposerve.router.ha.pod_label import PodLabel, from_env
from toposerve.router.ha.replication import Replication
from toposerve.router.pool.endpoints import Pool
from toposerve.router.scheduling.profile import Decision, Scheduler

log = structlog.get_logger("router.ha")


def _exit() -> None:
    raise web.GracefulExit  # what aiohttp's own SIGTERM handler raises


class HotStandby:
    def __init__(self, cfg: HAConfig, redis: ResponsesStoreConfig,
                 schedulers: Mapping[str, Scheduler],
                 pool: Pool, leading: Callable[[bool], None],
                 count: Callable[[str, int], None],
                 count_snapshot: Callable[[str], None] = lambda outcome: None,
                 warm: Callable[[], bool] = lambda: False) -> None:
        """``leading`` is told of each change of role (from a thread);
        ``count`` of replicated decisions, ``count_snapshot`` of snapshots.
        It may take the Lease with a healthy endpoint, or once ``warm``
        (discovery listed the pods, every endpoint found was asked once):
        on a cluster with no model server yet one replica must lead, as the
        Service sends to the leader only, and answer 503 "no endpoint"."""
        self.cfg, self.leading = cfg, leading
        self.label: PodLabel | None = None
        self.elector = Elector(cfg.lease, on_change=self._role, eligible=lambda: any(
            e.healthy for e in pool.routable()) or warm())
        assert redis.redis_url is not None  # RouterConfig guarantees it with ha.enabled
        self.replication = Replication(redis.redis_url,
                                       f"toposerve:decisions:{cfg.lease.namespace}/"
                                       f"{cfg.lease.name}",
                                       self.elector.identity, schedulers, pool, count,
                                       cfg.snapshot, lambda: self.leader, count_snapshot,
                                       redis.redis_options())
        self.stopping = False

    @property
    def leader(self) -> bool:
        return self.elector.leader and not self.stopping

    def tap(self, d: Decision, sched: Scheduler) -> None:
        self.replication.tap(d, sched)

    def _role(self, leader: bool) -> None:
        self.leading(leader)
        if self.label is not None:
            self.label.set(leader)

    def start(self) -> None:
        self.label = from_env(JsonApi(connect(self.cfg.lease.kubeconfig)))
        self.elector.start()
        self.replication.start()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._terminate)

    def _terminate(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        loop = asyncio.get_running_loop()
        log.info("SIGTERM: handing the lease back; serving on while traffic moves",
                 delay_s=self.cfg.shutdown_delay_s)
        done = loop.run_in_executor(None, self.elector.step_down)
        done.add_done_callback(
            lambda _: loop.call_later(self.cfg.shutdown_delay_s, _exit))

    async def close(self) -> None:
        if not self.stopping:
            self.stopping = True
            await asyncio.get_running_loop().run_in_executor(None, self.elector.step_down)
        await self.replication.close()
