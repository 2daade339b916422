"""The precise prefix index, fed by each endpoint's KV events over ZMQ.

Engine hashes are not trusted as keys: each stored block is re-keyed from
its ``token_ids`` with our own chained hash, the same one a request's
tokens get, so the router needs no knowledge of the engine's hash seed.
Engine hashes are kept only to map ``BlockRemoved`` back to our keys.
Each connection to the publisher, and each gap in sequence numbers,
triggers a replay from the endpoint's replay socket. A publisher that goes
away (its engine stopped or restarted, or unreachable past the heartbeat)
takes its endpoint's blocks with it, and the next connection replays from
the start: a restarted engine's cache is empty, and one that was only out
of reach tells again what its replay buffer still holds.

Each endpoint's subscription runs under the router's supervisor
(``toposerve.router.supervise``): a batch that cannot be read or applied,
or a replay answer that is not one, is dropped, logged once a streak and
counted, and the subscription goes on; one that fails whole starts again
after a backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import structlog
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from toposerve.router.prefix.index import PrefixIndex
from toposerve.router.request import RequestContext
from toposerve.router.supervise import Streak, supervise
from toposerve.wire.chat_template import ChatTemplate, chat_text
from toposerve.wire.hashing import SEED, token_block_hashes
from toposerve.wire.kv_events import (
    AllBlocksCleared,
    BadEvent,
    BlockRemoved,
    BlockStored,
    Event,
    decode_batch,
)
from toposerve.wire.tokens import Tokenizer

log = structlog.get_logger("router.prefix.kv_index")
REPLAY_TIMEOUT_S = 2.0
HEARTBEAT_MS = 1000
# the events of device memory (vLLM and SGLang name it "GPU"; None: unsaid)
GPU_MEDIA = (None, "GPU")


class KVIndex:
    def __init__(self, index: PrefixIndex, tokenizer: Tokenizer, block_size: int,
                 template: ChatTemplate | None = None,
                 fallback: Callable[[str], None] = lambda reason: None) -> None:
        self.index = index
        self.tokenizer = tokenizer
        # chat requests are tokenized as the engine renders them; when they
        # cannot be, ``fallback`` hears why and the approximate prompt serves
        self.template = template
        self.fallback = fallback
        self.block_size = block_size
        self._keys: dict[str, dict[int, int]] = {}  # url -> engine hash -> our key
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._streaks: dict[str, Streak] = {}  # url -> its subscription's errors
        self.applied: dict[str, int] = {}  # url -> last applied seq
        self.orphans = 0
        self.bad = 0

    # --- applying events (pure, testable without sockets) ---------------
    def apply(self, url: str, events: list[Event]) -> None:
        emap = self._keys.setdefault(url, {})
        for ev in events:
            if isinstance(ev, BlockStored | BlockRemoved) and ev.medium not in GPU_MEDIA:
                continue  # an offloading tier's copy: says nothing of the GPU's
            if isinstance(ev, BlockStored):
                if ev.parent_block_hash is None:
                    parent = SEED
                elif ev.parent_block_hash in emap:
                    parent = emap[ev.parent_block_hash]
                else:
                    self.orphans += 1  # chain broken: we cannot key these blocks
                    continue
                bs = ev.block_size or self.block_size
                keys = token_block_hashes(ev.token_ids, bs, parent)
                emap.update(zip(ev.block_hashes, keys, strict=False))
                self.index.add(url, keys)
            elif isinstance(ev, BlockRemoved):
                self.index.remove(url, [emap.pop(h) for h in ev.block_hashes if h in emap])
            elif isinstance(ev, AllBlocksCleared):
                self.index.clear(url)
                emap.clear()

    def request_keys(self, ctx: RequestContext) -> list[int]:
        if ctx.token_keys is None:
            if ctx.chat is None:
                text = ctx.prompt.decode("utf-8", "replace")
            else:
                text, reason = chat_text(self.template, ctx.chat)
                if reason is not None:
                    self.fallback(reason)
            tokens = self.tokenizer.encode(text)
            ctx.token_keys = token_block_hashes(tokens, self.block_size)
        return ctx.token_keys

    # --- subscribing -------------------------------------------------------
    def watch(self, url: str, pub: str, replay: str | None) -> None:
        if url not in self._tasks:
            self._tasks[url] = asyncio.create_task(
                supervise(self._streak(url), lambda: self._subscribe(url, pub, replay)))

    async def unwatch(self, url: str) -> None:
        task = self._tasks.pop(url, None)
        if task:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._keys.pop(url, None)
        self._streaks.pop(url, None)
        self.applied.pop(url, None)
        self.index.clear(url)

    async def close(self) -> None:
        for url in list(self._tasks):
            await self.unwatch(url)

    def _streak(self, url: str) -> Streak:
        if (s := self._streaks.get(url)) is None:
            s = self._streaks[url] = Streak("kv-events", endpoint=url)
        return s

    def _handle(self, url: str, seq: int, payload: bytes) -> None:
        try:
            self.apply(url, decode_batch(payload))
        except (ValueError, TypeError) as err:  # BadEvent, or a field of another type
            self.bad += 1
            self._streak(url).failed(err)
            return
        self.applied[url] = seq
        self._streak(url).ok()

    async def _replay(self, ctx: zmq.asyncio.Context, url: str, endpoint: str,
                      start: int) -> None:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(endpoint)
        try:
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            while True:
                if not await sock.poll(REPLAY_TIMEOUT_S * 1000):
                    log.warning("kv event replay timed out", endpoint=url)
                    return
                frames = await sock.recv_multipart()
                if len(frames) < 2:  # the live events go on; a later gap asks again
                    self.bad += 1
                    self._streak(url).failed(BadEvent(
                        f"a replay answer of {len(frames)} frame(s), not [seq, batch]"))
                    return
                seq = int.from_bytes(frames[-2], "big", signed=True)
                if seq < 0:
                    return
                if seq > self.applied.get(url, -1):
                    self._handle(url, seq, frames[-1])
        finally:
            sock.close()

    async def _subscribe(self, url: str, pub: str, replay: str | None) -> None:
        ctx = zmq.asyncio.Context.instance()
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        # a publisher that no longer answers pings (its node gone, no FIN
        # sent) counts as disconnected
        sub.setsockopt(zmq.HEARTBEAT_IVL, HEARTBEAT_MS)
        sub.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * HEARTBEAT_MS)
        # the connection's ups and downs: a publisher gone is an engine
        # stopped (its cache with it) or events lost, either way its blocks
        # are no longer known; each connection begins with a replay
        monitor = sub.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        poller = zmq.asyncio.Poller()
        poller.register(sub, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        sub.connect(pub)
        try:
            while True:
                ready = dict(await poller.poll())
                if monitor in ready:
                    event = parse_monitor_message(await monitor.recv_multipart())["event"]
                    if event == zmq.EVENT_DISCONNECTED:
                        await self._gone(url, sub)
                    elif replay:
                        await self._replay(ctx, url, replay, self.applied.get(url, -1) + 1)
                if sub in ready:
                    await self._receive(ctx, url, await sub.recv_multipart(), replay)
        finally:
            sub.disable_monitor()
            monitor.close()
            sub.close()

    async def _gone(self, url: str, sub: zmq.asyncio.Socket) -> None:
        """The publisher went away: what it sent before is dropped unread
        (a restarted engine's numbering begins again at 0, its cache empty)
        and its blocks are forgotten."""
        while int(sub.get(zmq.EVENTS)) & zmq.POLLIN:
            await sub.recv_multipart()
        if self._keys.get(url) or self.index.held(url):
            log.info("kv event publisher gone: its blocks are forgotten", endpoint=url)
        self.apply(url, [AllBlocksCleared()])
        self.applied.pop(url, None)

    async def _receive(self, ctx: zmq.asyncio.Context, url: str, frames: list[bytes],
                       replay: str | None) -> None:
        if len(frames) != 3:
            self.bad += 1
            self._streak(url).failed(BadEvent(
                f"a message of {len(frames)} frame(s), not [topic, seq, batch]"))
            return
        seq = int.from_bytes(frames[1], "big")
        last = self.applied.get(url, -1)
        if seq == 0 and last >= 0:  # the engine restarted unseen: its cache is empty
            self.apply(url, [AllBlocksCleared()])
            last = self.applied[url] = -1
        if seq <= last:
            return
        if seq > last + 1 and replay:
            await self._replay(ctx, url, replay, last + 1)
            if seq <= self.applied.get(url, -1):
                return
        self._handle(url, seq, frames[2])
