"""The precise index follows its publisher's connection: each connection
begins with a replay, and a publisher that goes away (an engine killed or
restarted on the same port) takes its endpoint's blocks with it at once,
not when (or if) its successor's first batch arrives."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import msgpack
import pytest
import zmq
import zmq.asyncio

from toposerve.localcluster.ports import free_port
from toposerve.router.prefix.index import PrefixIndex
from toposerve.router.prefix.kv_index import KVIndex
from toposerve.wire.tokens import ByteTokenizer

URL = "http://127.0.0.1:9"
END = (-1).to_bytes(8, "big", signed=True)


def stored(first: int, blocks: int) -> bytes:
    """One BlockStored batch: ``blocks`` blocks of 16 tokens, a chain of its own."""
    hashes = list(range(first, first + blocks))
    tokens = list(range(16 * first, 16 * (first + blocks)))
    batch: bytes = msgpack.packb([0.0, [["BlockStored", hashes, None, tokens, 16]]])
    return batch


class Publisher:
    """An engine's two sockets on fixed ports: PUB for live batches, ROUTER
    answering each replay request with ``replayed`` (seq, batch) and the end."""

    def __init__(self, pub_port: int, replay_port: int,
                 replayed: list[tuple[int, bytes]]) -> None:
        ctx = zmq.asyncio.Context.instance()
        self.pub, self.replay = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
        for s in (self.pub, self.replay):
            s.setsockopt(zmq.LINGER, 0)
        self.pub.bind(f"tcp://127.0.0.1:{pub_port}")
        self.replay.bind(f"tcp://127.0.0.1:{replay_port}")
        self.replays = 0
        self._answering = asyncio.create_task(self._answer(replayed))

    async def _answer(self, replayed: list[tuple[int, bytes]]) -> None:
        while True:
            ident, _, start = await self.replay.recv_multipart()
            self.replays += 1
            for seq, batch in replayed:
                if seq >= int.from_bytes(start, "big"):
                    await self.replay.send_multipart([ident, b"", seq.to_bytes(8, "big"), batch])
            await self.replay.send_multipart([ident, b"", END, b""])

    async def close(self) -> None:
        self._answering.cancel()
        self.pub.close()
        self.replay.close()


async def until(what: str, check: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def publish_until(pub: Publisher, seq: int, batch: bytes, done: Callable[[], bool]) -> None:
    """Sends the batch until ``done`` (a subscriber that is connecting misses
    what is sent meanwhile; the repeats are old numbers, dropped)."""
    deadline = time.monotonic() + 10
    while not done():
        assert time.monotonic() < deadline, f"batch {seq} was never applied"
        await pub.pub.send_multipart([b"kv", seq.to_bytes(8, "big"), batch])
        await asyncio.sleep(0.05)


@pytest.mark.unit
def test_a_publisher_gone_takes_its_blocks_and_its_successor_is_heard() -> None:
    async def go() -> None:
        pub_port, replay_port = free_port(), free_port()
        index = PrefixIndex()
        kv = KVIndex(index, ByteTokenizer(), 16)
        first = Publisher(pub_port, replay_port, [(0, stored(100, 3))])
        kv.watch(URL, f"tcp://127.0.0.1:{pub_port}", f"tcp://127.0.0.1:{replay_port}")
        try:
            # what the engine stored before the router connected comes by replay
            await until("the replayed blocks", lambda: index.held(URL) == 3)
            await publish_until(first, 1, stored(200, 2), lambda: kv.applied.get(URL) == 1)
            assert index.held(URL) == 5
            await first.close()  # killed: its cache goes with it
            await until("the publisher's blocks to be forgotten", lambda: index.held(URL) == 0)
            assert URL not in kv.applied
            # a new engine on the same ports numbers from 0 again: heard, not
            # taken for batches already applied
            second = Publisher(pub_port, replay_port, [])
            try:
                await until("a replay on the new connection", lambda: second.replays >= 1)
                await publish_until(second, 0, stored(300, 1), lambda: index.held(URL) == 1)
                assert kv.applied[URL] == 0
            finally:
                await second.close()
        finally:
            await kv.close()

    asyncio.run(asyncio.wait_for(go(), 60))
