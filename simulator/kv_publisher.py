"""vLLM KV-cache events over ZMQ: a PUB socket sending
``(topic, seq as 8-byte big-endian, msgpack batch)`` and a ROUTER socket
that replays buffered batches from a requested sequence number, ending
with sequence -1 and an empty payload.

A batch is ``[ts, events, data_parallel_rank]``; the events are encoded by
``toposerve.wire.kv_events`` (the router decodes them there too), in the array or the
map encoding as ``encoding`` says.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from toposerve.wire.kv_events import EventEncoding

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)


class BindError(Exception):
    """An address the simulator serves on besides HTTP cannot be had;
    ``field`` is the SimConfig field of its port, where known."""

    def __init__(self, address: str, reason: str, field: str = "") -> None:
        super().__init__(f"cannot listen on {address}: {reason}")
        self.address, self.reason, self.field = address, reason, field


class KVEventPublisher:
    """Batches events raised during one engine step and publishes them.
    Its sockets are bound when it is made (BindError), before any loop runs."""

    def __init__(self, endpoint: str, replay_endpoint: str | None, topic: str = "",
                 encoding: EventEncoding = EventEncoding.ARRAY, buffer: int = 10_000,
                 dp_rank: int = 0) -> None:
        self._ctx = zmq.asyncio.Context.instance()
        self._pub = self._bound(zmq.PUB, endpoint)
        self._replay = None
        if replay_endpoint:
            try:
                self._replay = self._bound(zmq.ROUTER, replay_endpoint)
            except BindError:
                self._pub.close()
                raise
        self.topic = topic.encode()
        self.encoding = encoding
        self.dp_rank = dp_rank
        self.seq = -1
        self._pending: list[Any] = []
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self._replay_task: asyncio.Task[None] | None = None

    def _bound(self, kind: int, endpoint: str) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(endpoint)
        except zmq.ZMQError as err:
            sock.close()
            # the bare reason: pyzmq's strerror adds the address to it
            raise BindError(endpoint, zmq.strerror(err.errno) if err.errno else str(err)) from None
        return sock

    def add(self, event: Any) -> None:
        self._pending.append(event)

    async def flush(self) -> None:
        if not self._pending:
            return
        events, self._pending = self._pending, []
        self.seq += 1
        payload = msgpack.packb([time.time(), events, self.dp_rank], use_bin_type=True)
        self._buffer.append((self.seq, payload))
        await self._pub.send_multipart([self.topic, self.seq.to_bytes(8, "big"), payload])

    def start(self) -> None:
        if self._replay is not None:
            self._replay_task = asyncio.create_task(self._serve_replay())

    async def _serve_replay(self) -> None:
        assert self._replay is not None
        while True:
            frames = await self._replay.recv_multipart()
            if len(frames) < 2:
                continue
            client, start = frames[0], int.from_bytes(frames[-1], "big")
            for seq, payload in list(self._buffer):
                if seq >= start:
                    await self._replay.send_multipart(
                        [client, b"", seq.to_bytes(8, "big"), payload])
            await self._replay.send_multipart([client, b"", END_OF_REPLAY, b""])

    async def close(self) -> None:
        if self._replay_task:
            self._replay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._replay_task
        self._pub.close()
        if self._replay is not None:
            self._replay.close()
