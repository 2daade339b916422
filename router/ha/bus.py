"""The channel over which router processes that serve one pool tell each
other what they learn: a pub/sub stream every process hears (routing
decisions, in-flight reports, snapshot requests) and a small store of
short-lived blobs (snapshots). ``RedisBus`` is the replicas' (Redis
pub/sub on one channel, keys under it); ``toposerve.router.ha.local_bus``
is the workers' of one pod without Redis. Replication
(``toposerve.router.ha.replication``) is written against ``Bus`` alone."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, Protocol


class Subscription(Protocol):
    async def next(self, timeout: float) -> bytes | None:
        """The next message, or None when none came within ``timeout``;
        raises when the subscription is lost."""
        ...


class Bus(Protocol):
    where: str  # for the log: what it is and where

    async def publish(self, messages: Sequence[bytes]) -> None:
        """Every subscriber hears each message (its sender too); raises
        when the bus cannot take them."""
        ...

    def subscribe(self) -> AbstractAsyncContextManager[Subscription]:
        """One subscription, until it is lost or left."""
        ...

    async def put(self, key: str, blob: bytes, ttl_s: int) -> None:
        """Kept under ``key`` for ``ttl_s`` seconds; stored before any
        message this process publishes after it."""
        ...

    async def get(self, key: str) -> bytes | None: ...

    async def close(self) -> None: ...


class _RedisSubscription:
    def __init__(self, ps: Any) -> None:
        self._ps = ps

    async def next(self, timeout: float) -> bytes | None:
        msg = await self._ps.get_message(ignore_subscribe_messages=True, timeout=timeout)
        if msg is None or msg.get("type") != "message":
            return None
        data = msg["data"]
        return data.encode() if isinstance(data, str) else bytes(data)


class RedisBus:
    """Redis pub/sub on ``channel``; blobs as keys ``<channel>:<key>``."""

    def __init__(self, url: str, channel: str, options: Mapping[str, Any] | None = None) -> None:
        """``options``: redis-py's beyond the URL (password, TLS CA:
        ResponsesStoreConfig.redis_options)."""
        import redis.asyncio as redis

        self._r = redis.from_url(url, **(options or {}))
        self.channel = channel
        self.where = f"redis channel {channel}"

    async def publish(self, messages: Sequence[bytes]) -> None:
        async with self._r.pipeline(transaction=False) as pipe:
            for m in messages:
                pipe.publish(self.channel, m)
            await pipe.execute()

    def subscribe(self) -> AbstractAsyncContextManager[Subscription]:
        return self._subscription()

    @asynccontextmanager
    async def _subscription(self) -> AsyncIterator[Subscription]:
        async with self._r.pubsub() as ps:
            await ps.subscribe(self.channel)
            yield _RedisSubscription(ps)

    async def put(self, key: str, blob: bytes, ttl_s: int) -> None:
        await self._r.set(f"{self.channel}:{key}", blob, ex=ttl_s)

    async def get(self, key: str) -> bytes | None:
        raw = await self._r.get(f"{self.channel}:{key}")
        return raw.encode() if isinstance(raw, str) else raw

    async def ping(self) -> bool:
        return bool(await self._r.ping())

    async def close(self) -> None:
        await self._r.aclose()
