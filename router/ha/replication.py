"""What each replica learns from its own routing, told to the others
through Redis pub/sub: for every answered request, the endpoint that
answered, the prompt's block keys and its session. A replica applies what
the others publish to its own scorers, as if it had routed the request
itself, so a standby's approximate prefix index, conversations and
sessions are the leader's when it takes over. (The precise index, load and
health each replica reads from the model servers itself.)

Publishing never blocks a request: messages go through a bounded queue,
dropped (and counted) when Redis cannot keep up or is down.

A replica that starts beside a running leader asks it for a snapshot
(``toposerve.router.ha.snapshot``) once subscribed: the leader writes one to a key
of its own for that request and says so on the channel. Each message
carries its sender's sequence number, so the new replica applies the
snapshot, then the messages it held meanwhile and all later ones, from
the snapshot's sequence on: nothing missed (it subscribed before asking)
and nothing twice. A snapshot that is corrupt, too large, of another
version or late is logged and left: the replica goes on cold, as before.

Publishing and the subscription run under the router's supervisor
(``toposerve.router.supervise``): Redis down is logged once a streak,
counted and retried after a backoff; a message that is not a decision is
dropped, logged once a streak and counted, and the subscription goes on."""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
import structlog

from toposerve.router.config import SnapshotConfig
from toposerve.router.ha.snapshot import DecisionLog, SnapshotError, decision, parse
from toposerve.router.pool.endpoints import Endpoint, Pool
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.cycle import CycleState
from toposerve.router.scheduling.profile import Decision, Scheduler
from toposerve.router.supervise import Streak, supervise

log = structlog.get_logger("router.ha.replication")
QUEUE = 10_000
BATCH = 256
CLOSE_TIMEOUT_S = 1.0
SNAPSHOT_TTL_S = 60  # a snapshot's key outlives its reader's wait, then goes
POLL_S = 0.2  # how often the listener looks at the time while it waits for one


def message(sender: str, seq: int, stage: str, ctx: RequestContext, ep: Endpoint
            ) -> dict[str, Any]:
    # the block keys every scorer of the run computed (memoised on the context)
    blocks = {str(size): keys for size, keys in ctx._byte_blocks.items()}
    return {"from": sender, "seq": seq, "stage": stage, "url": ep.url, "session": ctx.session,
            "blocks": blocks}


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
        self.replication.decided(self.stage, ctx, ep)


class Replication:
    def __init__(self, redis_url: str, channel: str, identity: str,
                 schedulers: Mapping[str, Scheduler], pool: Pool,
                 count: Callable[[str, int], None] = lambda outcome, n: None,
                 snapshot: SnapshotConfig | None = None,
                 leading: Callable[[], bool] = lambda: False,
                 count_snapshot: Callable[[str], None] = lambda outcome: None,
                 redis_options: Mapping[str, Any] | None = None) -> None:
        """``count`` is told of messages sent, received and dropped;
        ``count_snapshot`` of snapshots written, loaded, ignored and
        missing. ``leading``: whether this replica leads (only the leader
        answers a request for a snapshot). ``redis_options``: redis-py's
        beyond the URL (password, TLS CA: ResponsesStoreConfig.redis_options)."""
        import redis.asyncio as redis

        self._r = redis.from_url(redis_url, **(redis_options or {}))
        self.channel, self.identity = channel, identity
        # the sender of this process's messages: a restarted replica's
        # sequence numbers start afresh under a name of their own
        self.instance = f"{identity}#{secrets.token_hex(4)}"
        self.schedulers, self.pool = schedulers, pool
        self._stage = {id(s): name for name, s in schedulers.items()}
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(QUEUE)
        self._tasks: list[asyncio.Task[None]] = []
        self.count, self.count_snapshot, self.leading = count, count_snapshot, leading
        self.snapshot_cfg = snapshot or SnapshotConfig()
        self.log = DecisionLog(self.snapshot_cfg.max_bytes)
        self._seq = 0
        self._applied: dict[str, int] = {}  # sender -> the last sequence number applied
        # from the first subscription until the snapshot is in (or late),
        # what is heard is held; the snapshot is asked for once this
        # replica knows an endpoint (decisions name endpoints)
        self._holding = self.snapshot_cfg.enabled
        self._asked: str | None = None  # the nonce of the snapshot asked for
        self._held: list[tuple[dict[str, Any], bytes]] = []
        self._publishing = Streak("replication-publish", channel=channel)
        self._subscribing = Streak("replication-subscribe", channel=channel)
        self._messages = Streak("replication-subscribe", channel=channel, what="messages")

    def tap(self, d: Decision, sched: Scheduler) -> None:
        stage = self._stage.get(id(sched))
        if stage is not None:
            d.scorers = [*d.scorers, _Tap(self, stage)]

    def decided(self, stage: str, ctx: RequestContext, ep: Endpoint) -> None:
        """This replica sent a request of ``stage`` to ``ep``: the others are told."""
        self._seq += 1
        doc = message(self.instance, self._seq, stage, ctx, ep)
        raw = orjson.dumps(doc)
        if self.snapshot_cfg.enabled:
            self.log.add(doc, raw)
        self.publish(raw)

    def publish(self, msg: bytes) -> None:
        try:
            self._queue.put_nowait(msg)
        except asyncio.QueueFull:
            self.count("dropped", 1)

    def start(self) -> None:
        self._tasks = [asyncio.create_task(supervise(self._publishing, self._send)),
                       asyncio.create_task(supervise(self._subscribing, self._listen))]

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
            except Exception:  # Redis down: the others' indexes go stale, routing goes on
                self.count("dropped", len(batch))
                raise
            self.count("sent", len(batch))
            self._publishing.ok()

    async def _listen(self) -> None:
        """One subscription, until it is lost."""
        loop = asyncio.get_running_loop()
        try:
            async with self._r.pubsub() as ps:
                await ps.subscribe(self.channel)
                self._subscribing.ok()
                deadline = loop.time() + self.snapshot_cfg.wait_s
                while True:
                    if self._holding and self._asked is None and len(self.pool):
                        # subscribed first: nothing after the snapshot is missed
                        await self._ask_snapshot()
                    msg = await ps.get_message(ignore_subscribe_messages=True, timeout=POLL_S)
                    if msg is not None and msg.get("type") == "message":
                        await self._on_message(msg["data"])
                    if self._holding and loop.time() > deadline:
                        log.warning("no routing snapshot came in time; starting cold",
                                    wait_s=self.snapshot_cfg.wait_s)
                        self.count_snapshot("missing")
                        self._resume()
        except Exception:
            self._resume()  # a snapshot asked for on a lost subscription will not come
            raise

    # --- messages -------------------------------------------------------------
    async def _on_message(self, raw: bytes) -> None:
        try:
            doc = orjson.loads(raw)
            if not isinstance(doc, dict):
                raise SnapshotError("not a JSON object")
        except ValueError as err:  # not JSON either
            self._messages.failed(err)
            return
        if doc.get("from") == self.instance:
            return
        kind = doc.get("kind")
        if kind == "snapshot-request":
            if self.leading() and isinstance(doc.get("nonce"), str):
                await self._write_snapshot(doc["nonce"])
        elif kind == "snapshot":
            if self._holding and self._asked is not None and doc.get("nonce") == self._asked:
                await self._load_snapshot(self._asked)
        elif kind is None:
            try:
                decision(doc)
            except SnapshotError as err:
                self._messages.failed(err)
                return
            self._messages.ok()
            if self._holding:
                if len(self._held) >= QUEUE:
                    self.count("dropped", 1)
                else:
                    self._held.append((doc, raw))
            else:
                self._apply(doc, raw)

    def _apply(self, doc: dict[str, Any], raw: bytes) -> None:
        sender, seq = doc.get("from"), doc.get("seq")
        if isinstance(sender, str) and isinstance(seq, int):
            if seq <= self._applied.get(sender, 0):
                return  # in the snapshot already
            self._applied[sender] = seq
        if replay(doc, self.schedulers, self.pool):
            self.count("received", 1)
            if self.snapshot_cfg.enabled:
                self.log.add(doc, raw)

    def _resume(self) -> None:
        """Stop waiting for a snapshot: apply what was held meanwhile."""
        self._holding = False
        held, self._held = self._held, []
        for doc, raw in held:
            self._apply(doc, raw)

    # --- snapshots ------------------------------------------------------------
    def _key(self, nonce: str) -> str:
        return f"{self.channel}:snapshot:{nonce}"

    async def _ask_snapshot(self) -> None:
        self._asked = nonce = secrets.token_hex(8)
        await self._r.publish(self.channel, orjson.dumps(
            {"kind": "snapshot-request", "from": self.instance, "nonce": nonce}))

    async def _write_snapshot(self, nonce: str) -> None:
        """A new replica asked: the leader writes what it holds, with the
        sequence number it holds of each sender (its own: the last it
        gave, so a message still in its send queue is not applied twice)."""
        blob = self.log.snapshot({**self._applied, self.instance: self._seq})
        await self._r.set(self._key(nonce), blob, ex=SNAPSHOT_TTL_S)
        await self._r.publish(self.channel, orjson.dumps(
            {"kind": "snapshot", "from": self.instance, "nonce": nonce}))
        self.count_snapshot("written")
        log.info("routing snapshot written", decisions=len(self.log), bytes=len(blob))

    async def _load_snapshot(self, nonce: str) -> None:
        raw = await self._r.get(self._key(nonce))
        try:
            if raw is None:
                raise SnapshotError("its key is gone")
            snap = parse(raw.encode() if isinstance(raw, str) else raw,
                         self.snapshot_cfg.max_bytes)
        except SnapshotError as err:
            log.warning("routing snapshot ignored; starting cold", error=str(err))
            self.count_snapshot("ignored")
        else:
            for entry in snap.entries:
                if replay(entry, self.schedulers, self.pool):
                    self.log.add(entry, orjson.dumps(entry))
            for sender, seq in snap.seqs.items():
                self._applied[sender] = max(seq, self._applied.get(sender, 0))
            self.count_snapshot("loaded")
            log.info("routing snapshot loaded", decisions=len(snap.entries))
        self._resume()
