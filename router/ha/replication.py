"""What each router process learns from its own routing, told to the
others sharing its view (replicas through Redis, workers of one pod
through their local bus: ``toposerve.router.ha.bus``): for every answered
request, the endpoint that answered, the prompt's block keys and its
session. A process applies what the others publish to its own scorers,
as if it had routed the request itself, so every replica's approximate
prefix index, conversations and sessions are the same. (The precise
index, load and health each reads from the model servers itself.) Beside
the decisions, each reports what it has in flight to each endpoint
(``toposerve.router.ha.peers``).

Publishing never blocks a request: messages go through a bounded queue,
dropped (and counted) when the bus cannot keep up or is down.

A process that starts asks a peer for a snapshot
(``toposerve.router.ha.snapshot``) once subscribed: the peer named in the
request (the fullest of those its load reports say are done starting)
writes one under a key of its own and says so on the channel. Each
message carries its sender's sequence number, so the asker applies the
snapshot's decisions, then the messages it held meanwhile and all later
ones: nothing missed (it subscribed before asking) and nothing twice.

Later, a sender this process has not heard everything from since its
subscription began (a peer that came after the snapshot, or one back
from a partition, or every peer after this process's own subscription
was lost) is caught up the same way, on its own: its messages are held
while that peer is asked for a snapshot of its own decisions, and only
those numbered above what was applied of it are applied. So what the
replicas decided while Redis was down comes back when it does. A peer is
asked only once heard on this subscription: after an outage the others
resubscribe in their own time, and a request sent before one is back
would go unheard.

A snapshot that is corrupt, too large, of another version or late is
logged and left: the process goes on with what it has.

Publishing and the subscription run under the router's supervisor
(``toposerve.router.supervise``): the bus down is logged once a streak,
counted and retried after a backoff; a message that is not a decision or
a report is dropped, logged once a streak and counted, and the
subscription goes on."""

from __future__ import annotations

import asyncio
import contextlib
import math
import secrets
import time
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import orjson
import structlog

from toposerve.router.config import InflightShareConfig, SnapshotConfig
from toposerve.router.ha.bus import Bus
from toposerve.router.ha.peers import Peers, ReportError, Spending
from toposerve.router.ha.snapshot import (
    DecisionLog,
    Snapshot,
    SnapshotError,
    decision,
    parse,
)
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
POLL_S = 0.05  # how often the listener looks at the time while it waits for a snapshot
IDLE_POLL_S = 1.0  # and otherwise


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
    def __init__(self, bus: Bus, identity: str, schedulers: Mapping[str, Scheduler], pool: Pool,
                 count: Callable[[str, int], None] = lambda outcome, n: None,
                 snapshot: SnapshotConfig | None = None,
                 count_snapshot: Callable[[str], None] = lambda outcome: None,
                 inflight: InflightShareConfig | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 room: Callable[[], None] = lambda: None,
                 spending: Spending | None = None) -> None:
        """``count`` is told of messages sent, received and dropped;
        ``count_snapshot`` of snapshots written, loaded, ignored and
        missing. ``inflight``: how often this process's in-flight counts
        are told the others, and when a silent peer counts as gone;
        ``room``: told when the others' requests end, ``spending``: the
        tenants' rates shared (``Peers``)."""
        self.bus = bus
        # the sender of this process's messages: a restarted replica's
        # sequence numbers start afresh under a name of their own
        self.instance = f"{identity}#{secrets.token_hex(4)}"
        self.schedulers, self.pool = schedulers, pool
        self.share = inflight or InflightShareConfig()
        self.peers = Peers(self.instance, pool, self.share, clock, room, spending)
        self._stage = {id(s): name for name, s in schedulers.items()}
        self._queue: asyncio.Queue[bytes] = asyncio.Queue(QUEUE)
        self._tasks: list[asyncio.Task[None]] = []
        self.count, self.count_snapshot = count, count_snapshot
        self.snapshot_cfg = snapshot or SnapshotConfig()
        self.log = DecisionLog(self.snapshot_cfg.max_bytes)
        self._seq = 0
        self._applied: dict[str, int] = {}  # sender -> the last sequence number applied
        # from each subscription until the snapshot is in (or late), what
        # is heard is held; the snapshot is asked for once this process
        # knows an endpoint (decisions name endpoints) and a peer to ask
        self._holding = False
        self._subscribed = False  # reports wait for it: a peer's answer to one must be heard
        self._since = math.inf  # when the subscription began (the peers' clock)
        # done starting (its snapshot in, or none to be had): it may serve,
        # and answer others' requests for one
        self._started = asyncio.Event()
        if not self.snapshot_cfg.enabled:
            self._started.set()
        self._asked: str | None = None  # the nonce of the snapshot asked for
        self._held: list[tuple[dict[str, Any], bytes]] = []
        # the catch-up of one sender (after the first snapshot): those applied
        # in full since this subscription began, the nonces asked of others,
        # and what each of the others sent meanwhile (since when)
        self._synced: set[str] = set()
        self._catching: dict[str, str] = {}  # nonce -> the sender asked
        self._waiting: dict[str, tuple[float, list[tuple[dict[str, Any], bytes]]]] = {}
        self._publishing = Streak("replication-publish", where=bus.where)
        self._subscribing = Streak("replication-subscribe", where=bus.where)
        self._messages = Streak("replication-subscribe", where=bus.where, what="messages")
        self._reporting = Streak("replication-publish", where=bus.where, what="in-flight")

    @property
    def started(self) -> bool:
        return self._started.is_set()

    async def ready(self) -> None:
        """Until this process has the others' view (a snapshot, or none to be
        had), at most ``ha.snapshot.waitSeconds`` and a heartbeat: the
        router starts serving after it, so a request it takes meanwhile is
        not placed on a cold view."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._started.wait(),
                                   self.snapshot_cfg.wait_s + self.peers.heartbeat_s)

    def tap(self, d: Decision, sched: Scheduler) -> None:
        stage = self._stage.get(id(sched))
        if stage is not None:
            d.scorers = [*d.scorers, _Tap(self, stage)]

    def decided(self, stage: str, ctx: RequestContext, ep: Endpoint) -> None:
        """This process sent a request of ``stage`` to ``ep``: the others are told."""
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
                       asyncio.create_task(supervise(self._subscribing, self._listen)),
                       asyncio.create_task(self._report())]

    async def close(self) -> None:
        # bounded: a subscription cancelled mid-read can hang in its own
        # clean-up, and a router on its way out must not wait for it
        for t in self._tasks:
            t.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=CLOSE_TIMEOUT_S)
        with contextlib.suppress(Exception):  # the others stop counting this one at once
            await asyncio.wait_for(self.bus.publish([orjson.dumps(self.peers.goodbye())]),
                                   CLOSE_TIMEOUT_S)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.bus.close(), CLOSE_TIMEOUT_S)

    async def _send(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < BATCH and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            try:
                await self.bus.publish(batch)
            except Exception:  # the bus down: the others' indexes go stale, routing goes on
                self.count("dropped", len(batch))
                raise
            self.count("sent", len(batch))
            self._publishing.ok()

    async def _report(self) -> None:
        """Tell the others what this process has in flight, and forget the
        peers gone silent; the latter goes on while the bus is down (so
        their counts stop weighing), the former waits for it."""
        ticks = 0
        while True:
            await asyncio.sleep(self.share.interval_s)
            # a peer back after this would have missed: it is caught up again
            self._synced.difference_update(self.peers.expire())
            ticks += 1
            if ticks * self.share.interval_s >= self.peers.heartbeat_s:
                ticks = 0
                self.peers.reapply()  # on endpoints discovery added since
            if not self._subscribed or self._reporting.backing_off():
                continue
            doc = self.peers.report(len(self.log), self.started)
            if doc is None:
                continue
            try:
                await self.bus.publish([orjson.dumps(doc)])
            except Exception as err:
                self.peers.want_full = True  # the others may have missed what changed
                self._reporting.failed(err)
            else:
                self._reporting.ok()

    async def _listen(self) -> None:
        """One subscription, until it is lost."""
        loop = asyncio.get_running_loop()
        try:
            async with self.bus.subscribe() as sub:
                self._subscribing.ok()
                # the first: the others' view comes by a snapshot; after a lost
                # subscription, each sender is caught up on its own
                self._holding, self._asked = not self.started, None
                self._synced.clear()
                # the others hear of this one now (they may have dropped it),
                # and answer with a full report each: a heartbeat is plenty
                self._subscribed, self.peers.want_full = True, True
                # a peer is asked once heard on this subscription: one heard
                # only before it may still be resubscribing, and miss the request
                self._since = self.peers.clock()
                now = loop.time()
                deadline, alone = now + self.snapshot_cfg.wait_s, now + self.peers.heartbeat_s
                while True:
                    if self._holding and self._asked is None:
                        peer = self.peers.source(self._since)
                        if peer is not None and len(self.pool):
                            # subscribed first: nothing after the snapshot is missed
                            self._asked = await self._ask(peer, whole=True)
                        elif peer is None and loop.time() > alone:
                            self._late("no peer has a view to give")
                    elif not self._holding and self.snapshot_cfg.enabled:
                        await self._catch_up(loop.time())
                    raw = await sub.next(POLL_S if self._holding or self._waiting
                                         else IDLE_POLL_S)
                    if raw is not None:
                        await self._on_message(raw, loop.time())
                    if self._holding and loop.time() > deadline:
                        self._late("no routing snapshot came in time")
        except Exception:
            self._subscribed = False
            self._resume()  # a snapshot asked for on a lost subscription will not come
            for sender in list(self._waiting):
                self._release(sender)
            self._catching.clear()
            raise

    async def _catch_up(self, now: float) -> None:
        """Ask each started peer not caught up (and not asked) for its own
        decisions; give up on a sender whose answer is late."""
        asked = set(self._catching.values())
        for peer in self.peers.started(self._since):
            if peer not in self._synced and peer not in asked:
                self._waiting.setdefault(peer, (now, []))
                self._catching[await self._ask(peer, whole=False)] = peer
        for sender, (since, _) in list(self._waiting.items()):
            if now - since > self.snapshot_cfg.wait_s:
                log.info("a peer's decisions did not come in time; going on without them",
                         peer=sender, wait_s=self.snapshot_cfg.wait_s)
                self.count_snapshot("missing")
                self._catching = {n: p for n, p in self._catching.items() if p != sender}
                self._release(sender)

    def _release(self, sender: str) -> None:
        """``sender`` is caught up (or given up on): what it sent meanwhile applies."""
        self._synced.add(sender)
        for doc, raw in self._waiting.pop(sender, (0.0, []))[1]:
            self._apply(doc, raw)

    def _late(self, why: str) -> None:
        log.info(f"{why}; going on with what this process has",
                 wait_s=self.snapshot_cfg.wait_s, peers=len(self.peers))
        self.count_snapshot("missing")
        self._resume()

    # --- messages -------------------------------------------------------------
    async def _on_message(self, raw: bytes, now: float) -> None:
        try:
            doc = orjson.loads(raw)
            if not isinstance(doc, dict):
                raise SnapshotError("not a JSON object")
        except ValueError as err:  # not JSON either
            self._messages.failed(err)
            return
        sender = doc.get("from")
        if sender == self.instance:
            return
        kind = doc.get("kind")
        if kind == "load":
            try:
                self.peers.heard(doc)
            except ReportError as err:
                self._messages.failed(err)
        elif kind == "snapshot-request":
            if doc.get("to") == self.instance and isinstance(doc.get("nonce"), str):
                await self._write_snapshot(doc["nonce"], whole=doc.get("whole") is not False)
        elif kind == "snapshot":
            nonce = doc.get("nonce")
            if self._holding and self._asked is not None and nonce == self._asked:
                await self._load_snapshot(self._asked)
            elif isinstance(nonce, str) and (peer := self._catching.pop(nonce, None)):
                await self._load_own(peer, nonce)
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
            elif (not self.snapshot_cfg.enabled or not isinstance(sender, str)
                  or sender in self._synced):
                self._apply(doc, raw)
            else:  # not caught up on its sender yet: held until it is
                held = self._waiting.setdefault(sender, (now, []))[1]
                if len(held) >= QUEUE:
                    self.count("dropped", 1)
                else:
                    held.append((doc, raw))

    def _unseen(self, doc: Mapping[str, Any]) -> bool:
        """Whether ``doc`` is another's decision not applied yet."""
        sender, seq = doc.get("from"), doc.get("seq")
        if sender == self.instance:
            return False  # this process's own, in another's snapshot
        return not (isinstance(sender, str) and isinstance(seq, int)
                    and seq <= self._applied.get(sender, 0))

    def _apply(self, doc: dict[str, Any], raw: bytes) -> None:
        if not self._unseen(doc):
            return
        sender, seq = doc.get("from"), doc.get("seq")
        if isinstance(sender, str) and isinstance(seq, int):
            self._applied[sender] = seq
        if replay(doc, self.schedulers, self.pool):
            self.count("received", 1)
            if self.snapshot_cfg.enabled:
                self.log.add(doc, raw)

    def _resume(self) -> None:
        """Stop waiting for a snapshot: apply what was held meanwhile."""
        self._holding = False
        self._started.set()
        self._synced.update(self.peers.known())  # the snapshot held what they had sent
        held, self._held = self._held, []
        for doc, raw in held:
            self._apply(doc, raw)

    # --- snapshots ------------------------------------------------------------
    async def _ask(self, peer: str, whole: bool) -> str:
        """Ask ``peer`` for a snapshot: of all it holds (``whole``), or of
        its own decisions; the request's nonce."""
        nonce = secrets.token_hex(8)
        await self.bus.publish([orjson.dumps(
            {"kind": "snapshot-request", "from": self.instance, "to": peer, "nonce": nonce,
             "whole": whole})])
        return nonce

    async def _write_snapshot(self, nonce: str, whole: bool) -> None:
        """A peer asked this one: it writes what it holds (``whole``) or
        its own decisions, with the sequence number it holds of each
        sender (its own: the last it gave, so a message still in its send
        queue is not applied twice)."""
        blob = self.log.snapshot({**self._applied, self.instance: self._seq},
                                 None if whole else self.instance)
        await self.bus.put(f"snapshot:{nonce}", blob, SNAPSHOT_TTL_S)
        await self.bus.publish([orjson.dumps(
            {"kind": "snapshot", "from": self.instance, "nonce": nonce})])
        self.count_snapshot("written")
        log.info("routing snapshot written", whole=whole, decisions=len(self.log),
                 bytes=len(blob))

    async def _read(self, nonce: str) -> Snapshot | None:
        raw = await self.bus.get(f"snapshot:{nonce}")
        try:
            if raw is None:
                raise SnapshotError("its key is gone")
            return parse(raw, self.snapshot_cfg.max_bytes)
        except SnapshotError as err:
            log.warning("routing snapshot ignored; going on with what this process has",
                        error=str(err))
            self.count_snapshot("ignored")
            return None

    def _replay(self, snap: Snapshot, senders: Container[str] | None = None) -> int:
        """Apply the snapshot's decisions (of ``senders``, when given) not
        applied yet, then count its sequence numbers applied."""
        applied = 0
        for entry in snap.entries:
            # the seqs are raised after the whole snapshot: its entries
            # are compared with what was applied before it only
            if (senders is None or entry.get("from") in senders) and self._unseen(
                    entry) and replay(entry, self.schedulers, self.pool):
                self.log.add(entry, orjson.dumps(entry))
                applied += 1
        for sender, seq in snap.seqs.items():
            if sender != self.instance and (senders is None or sender in senders):
                self._applied[sender] = max(seq, self._applied.get(sender, 0))
        self.count_snapshot("loaded")
        return applied

    async def _load_own(self, peer: str, nonce: str) -> None:
        """A peer's own decisions, to catch up on it."""
        snap = await self._read(nonce)
        if snap is not None:
            applied = self._replay(snap, {peer})
            log.info("caught up on a peer's decisions", peer=peer, applied=applied)
        self._release(peer)

    async def _load_snapshot(self, nonce: str) -> None:
        snap = await self._read(nonce)
        if snap is not None:
            applied = self._replay(snap)
            log.info("routing snapshot loaded", decisions=len(snap.entries), applied=applied)
        self._resume()
