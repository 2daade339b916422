"""What each replica learns from its own routing, told to the others
through Redis pub/sub: for every answered request, the endpoint that
answered, the prompt's block keys and its session. A replica applies what
the others publish to its own scorers, as if it had routed the request
itself, so a standby's approximate prefix index, conversations and
sessions are the leader's when it takes over. (The precise index, load and
health each replica reads from the model servers itself.)

Publishing never blocks a request: messages go through a bounded queue,
dropped (and counted) when Redis cannot keep up or is down."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
import structlog

from router.pool.endpoints import Endpoint, Pool
from router.scheduling.context import RequestContext
from router.scheduling.cycle import CycleState
from router.scheduling.profile import Decision, Scheduler

log = structlog.get_logger("router.ha.replication")
QUEUE = 10_000
BATCH = 256
CLOSE_TIMEOUT_S = 1.0


def message(sender: str, stage: str, ctx: RequestContext, ep: Endpoint) -> bytes:
    # the block keys every scorer of the run computed (memoised on the context)
    blocks = {str(size): keys for size, keys in ctx._byte_blocks.items()}
    return orjson.dumps({"from": sender, "stage": stage, "url": ep.url,
                         "session": ctx.session, "blocks": blocks})


def replay(doc: Mapping[str, Any], schedulers: Mapping[str, Scheduler], pool: Pool) -> bool:
    """Tell the stage's scorers where another replica's request went;
    False when this replica does not know that stage or endpoint (yet)."""
    sched, ep = schedulers.get(doc.get("stage", "")), pool.get(doc.get("url", ""))
    if sched is None or ep is None:
        return False
    ctx = RequestContext(model=None, prompt=b"", session=doc.get("session"))
    ctx._byte_blocks.update({int(k): v for k, v in (doc.get("blocks") or {}).items()})
    cycle = CycleState()
    for scorer, _ in sched.scorers:
        scorer.picked(ctx, cycle, ep)
    return True


@dataclass
class _Tap:
    """Appended to a decision's scorers: told the endpoint that answered
    last, once the others have recorded it."""

    replication: Replication
    stage: str
    name: ClassVar[str] = "replication"

    def score(self, ctx: RequestContext, cycle: CycleState, eps: list[Endpoint]
              ) -> dict[Endpoint, float]:
        return {}

    def picked(self, ctx: RequestContext, cycle: CycleState, ep: Endpoint) -> None:
        self.replication.publish(message(self.replication.identity, self.stage, ctx, ep))


class Replication:
    def __init__(self, redis_url: str, channel: str, identity: str,
                 schedulers: Mapping[str, Scheduler], pool: Pool,
                 count: Callable[[str, int], None] = lambda outcome, n: None) -> None:
        """``count`` is told of messages sent, received and dropped."""
        import redis.asyncio as redis

        self._r = redis.from_url(redis_url)
        self.channel, self.identity = channel, identity
        self.schedulers, self.pool = schedulers, pool
        self._stage = {id(s): name for name, s in schedulers.items()}
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(QUEUE)
        self._tasks: list[asyncio.Task[None]] = []
        self.count = count

    def tap(self, d: Decision, sched: Scheduler) -> None:
        stage = self._stage.get(id(sched))
        if stage is not None:
            d.scorers = [*d.scorers, _Tap(self, stage)]

    def publish(self, msg: bytes) -> None:
        try:
            self._queue.put_nowait(msg)
        except asyncio.QueueFull:
            self.count("dropped", 1)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._send()), asyncio.create_task(self._listen())]

    async def close(self) -> None:
        # bounded: a subscription cancelled mid-read can hang in its own
        # clean-up, and a router on its way out must not wait for it
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=CLOSE_TIMEOUT_S)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._r.aclose(), CLOSE_TIMEOUT_S)

    async def _send(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                async with self._r.pipeline(transaction=False) as pipe:
                    for m in batch:
                        pipe.publish(self.channel, m)
                    await pipe.execute()
                self.count("sent", len(batch))
            except Exception as err:  # Redis down: the others' indexes go stale, routing goes on
                self.count("dropped", len(batch))
                log.warning("replication publish failed", error=repr(err), dropped=len(batch))
                await asyncio.sleep(1.0)

    async def _listen(self) -> None:
        while True:
            try:
                async with self._r.pubsub() as ps:
                    await ps.subscribe(self.channel)
                    async for msg in ps.listen():
                        if msg.get("type") != "message":
                            continue
                        doc = orjson.loads(msg["data"])
                        if doc.get("from") != self.identity and replay(doc, self.schedulers,
                                                                       self.pool):
                            self.count("received", 1)
            except asyncio.CancelledError:
                raise
            except Exception as err:
                log.warning("replication subscription lost; resubscribing", error=repr(err))
                await asyncio.sleep(1.0)
