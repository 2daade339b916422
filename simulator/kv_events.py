"""vLLM KV-cache events over ZMQ: a PUB socket sending
``(topic, seq as 8-byte big-endian, msgpack batch)`` and a ROUTER socket
that replays buffered batches from a requested sequence number, ending
with sequence -1 and an empty payload.

A batch is ``[ts, events, data_parallel_rank]``. Each event is either a
positional array with its tag first (older vLLM) or a map with a
``"type"`` key (newer vLLM); ``encoding`` picks which.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from enum import StrEnum
from typing import Any

import msgpack
import zmq
import zmq.asyncio

from simulator.kvcache import Stored

END_OF_REPLAY = (-1).to_bytes(8, "big", signed=True)


class EventEncoding(StrEnum):
    ARRAY = "array"
    MAP = "map"


# fields the map encoding's vLLM added after the array encoding's six; every
# one is written, null here (no LoRA, no extra hash keys, one KV cache group)
# as vLLM writes them, and strict decoders want them all
_MAP_ONLY_STORED = {"lora_name": None, "extra_keys": None, "group_idx": None}


def encode_stored(s: Stored, block_size: int, enc: EventEncoding) -> Any:
    fields = {"block_hashes": s.block_hashes, "parent_block_hash": s.parent_block_hash,
              "token_ids": s.token_ids, "block_size": block_size, "lora_id": None,
              "medium": "GPU"}
    if enc == EventEncoding.MAP:
        return {"type": "BlockStored", **fields, **_MAP_ONLY_STORED}
    return ["BlockStored", *fields.values()]


def encode_removed(hashes: list[int], enc: EventEncoding) -> Any:
    if enc == EventEncoding.MAP:
        return {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU",
                "group_idx": None}
    return ["BlockRemoved", hashes, "GPU"]


def encode_cleared(enc: EventEncoding) -> Any:
    return {"type": "AllBlocksCleared"} if enc == EventEncoding.MAP else ["AllBlocksCleared"]


class KVEventPublisher:
    """Batches events raised during one engine step and publishes them."""

    def __init__(self, endpoint: str, replay_endpoint: str | None, topic: str = "",
                 encoding: EventEncoding = EventEncoding.ARRAY, buffer: int = 10_000,
                 dp_rank: int = 0) -> None:
        self._ctx = zmq.asyncio.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.setsockopt(zmq.LINGER, 0)
        self._pub.bind(endpoint)
        self._replay = None
        if replay_endpoint:
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self._replay.bind(replay_endpoint)
        self.topic = topic.encode()
        self.encoding = encoding
        self.dp_rank = dp_rank
        self.seq = -1
        self._pending: list[Any] = []
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer)
        self._replay_task: asyncio.Task[None] | None = None

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
