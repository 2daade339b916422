"""The bus of the worker processes of one pod when there is no Redis
(``server.workers`` without ``ha.enabled``): a hub in the parent process
on a unix socket in a private directory, and each worker's client of it.
It does for the workers what Redis does for replicas: it relays every
published message to every subscriber and keeps snapshots for a while.

Why a hub and not shared memory: what the workers share is the same
stream of messages replicas share (decisions, in-flight reports, snapshot
requests), so one replication code serves both; counters in shared
memory would need a slot per endpoint URL and a second code path. A
frame costs the hub a read and a write per subscriber, and a report is
sent at most every ``ha.inflight.intervalSeconds`` whatever the request
rate.

Frames: one kind byte, a 4-byte big-endian length, the payload. Client to
hub: ``P`` publish, ``U`` subscribe (this connection then hears ``M``
frames), ``S`` store (2-byte key length, key, 4-byte TTL, blob), ``G``
get (key; answered ``V``: a found byte, the blob). A frame over the
hub's limit, or an unknown kind, ends that connection; a subscriber that
falls too far behind (its unsent frames over the limit) is cut off and
resubscribes, as after a lost Redis."""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import structlog

from toposerve.router.ha.bus import Subscription

log = structlog.get_logger("router.ha.local_bus")
HEADER = struct.Struct(">cI")
MAX_KEYS = 64  # blobs kept at once (a snapshot a starting worker)
CONNECT_TIMEOUT_S = 2.0
FRAME_SLACK = 2**20  # beyond a snapshot's own limit: its framing, and room for a report


def max_frame(snapshot_max_bytes: int) -> int:
    """The hub's frame limit for snapshots of at most ``snapshot_max_bytes``."""
    return snapshot_max_bytes + FRAME_SLACK


class BusError(Exception):
    """The hub answered something that is not a frame of this protocol."""


async def _read_frame(reader: asyncio.StreamReader, limit: int) -> tuple[bytes, bytes]:
    kind, n = HEADER.unpack(await reader.readexactly(HEADER.size))
    if n > limit:
        raise BusError(f"a frame of {n} bytes, over the limit of {limit}")
    return kind, await reader.readexactly(n)


def _frame(kind: bytes, payload: bytes) -> bytes:
    return HEADER.pack(kind, len(payload)) + payload


class Hub:
    """The parent's side: relays and stores for the workers' connections."""

    def __init__(self, path: str, max_frame: int) -> None:
        """``max_frame``: the largest frame taken, and how far a subscriber
        may fall behind (a snapshot is the largest)."""
        self.path, self.max_frame = path, max_frame
        self._subscribers: set[asyncio.StreamWriter] = set()
        self._blobs: OrderedDict[str, tuple[float, bytes]] = OrderedDict()
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve, self.path,
                                                       limit=self.max_frame)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            for w in list(self._subscribers):
                w.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                kind, payload = await _read_frame(reader, self.max_frame)
                if kind == b"P":
                    self._broadcast(_frame(b"M", payload))
                elif kind == b"U":
                    self._subscribers.add(writer)
                elif kind == b"S":
                    self._store(payload)
                elif kind == b"G":
                    found = self._blob(payload.decode())
                    writer.write(_frame(b"V", b"\x00" if found is None else b"\x01" + found))
                    await writer.drain()
                else:
                    raise BusError(f"unknown frame kind {kind!r}")
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # a worker went away
        except (BusError, ValueError, struct.error) as err:
            log.warning("local bus: connection dropped", error=str(err))
        finally:
            self._subscribers.discard(writer)
            writer.close()

    def _broadcast(self, frame: bytes) -> None:
        for w in list(self._subscribers):
            transport = w.transport
            if transport.is_closing():
                self._subscribers.discard(w)
            elif transport.get_write_buffer_size() > self.max_frame:
                # it reads too slowly: cut off, it resubscribes and catches up by snapshot
                log.warning("local bus: a subscriber fell behind; cut off")
                self._subscribers.discard(w)
                w.close()
            else:
                w.write(frame)

    def _store(self, payload: bytes) -> None:
        (n,) = struct.unpack_from(">H", payload)
        key = payload[2:2 + n].decode()
        (ttl,) = struct.unpack_from(">I", payload, 2 + n)
        now = time.monotonic()
        self._blobs.pop(key, None)
        self._blobs[key] = (now + ttl, payload[6 + n:])
        while len(self._blobs) > MAX_KEYS or (
                self._blobs and next(iter(self._blobs.values()))[0] < now):
            self._blobs.popitem(last=False)

    def _blob(self, key: str) -> bytes | None:
        held = self._blobs.get(key)
        return held[1] if held is not None and held[0] >= time.monotonic() else None


class _LocalSubscription:
    def __init__(self, reader: asyncio.StreamReader, limit: int) -> None:
        self._reader, self._limit = reader, limit

    async def next(self, timeout: float) -> bytes | None:
        # only the header waits with a timeout: a read cancelled there has
        # taken nothing, one cancelled inside a frame would split the stream
        try:
            head = await asyncio.wait_for(self._reader.readexactly(HEADER.size), timeout)
        except TimeoutError:
            return None
        kind, n = HEADER.unpack(head)
        if kind != b"M" or n > self._limit:
            raise BusError(f"the hub sent a frame of kind {kind!r} and {n} bytes")
        return await self._reader.readexactly(n)


class LocalBus:
    """A worker's side: one connection for what it sends (and its gets),
    one per subscription."""

    def __init__(self, path: str, max_frame: int) -> None:
        self.path, self.max_frame = path, max_frame
        self.where = f"local bus {path}"
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._lock = asyncio.Lock()

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.wait_for(
            asyncio.open_unix_connection(self.path, limit=self.max_frame), CONNECT_TIMEOUT_S)

    async def _send(self, frames: bytes, reply: bool = False) -> bytes | None:
        async with self._lock:
            if self._conn is None:
                self._conn = await self._connect()
            reader, writer = self._conn
            try:
                writer.write(frames)
                await writer.drain()
                return (await _read_frame(reader, self.max_frame))[1] if reply else None
            except BaseException:
                self._conn = None  # the next call connects afresh
                writer.close()
                raise

    async def publish(self, messages: Sequence[bytes]) -> None:
        await self._send(b"".join(_frame(b"P", m) for m in messages))

    def subscribe(self) -> AbstractAsyncContextManager[Subscription]:
        return self._subscription()

    @asynccontextmanager
    async def _subscription(self) -> AsyncIterator[Subscription]:
        reader, writer = await self._connect()
        try:
            writer.write(_frame(b"U", b""))
            await writer.drain()
            yield _LocalSubscription(reader, self.max_frame)
        finally:
            writer.close()

    async def put(self, key: str, blob: bytes, ttl_s: int) -> None:
        k = key.encode()
        await self._send(_frame(b"S", struct.pack(">H", len(k)) + k
                                + struct.pack(">I", ttl_s) + blob))

    async def get(self, key: str) -> bytes | None:
        answer = await self._send(_frame(b"G", key.encode()), reply=True)
        return answer[1:] if answer and answer[:1] == b"\x01" else None

    async def close(self) -> None:
        if self._conn is not None:
            self._conn[1].close()
            self._conn = None
