"""Stored Responses-API turns, so a ``previous_response_id`` chain works on
any endpoint. In memory (bounded, with a TTL) for one router, or in Redis
for a hot-standby pair. Each turn belongs to the tenant that created it:
to any other tenant it does not exist (the router answers 404, not 403,
so ids of other tenants' responses cannot be probed)."""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import orjson
import structlog
from aiohttp import web

from router.admission.tenants import TENANT
from router.config import ResponsesStoreConfig
from router.pool.endpoints import Endpoint
from topology.config_file import ConfigError
from wire.errors import ApiError

log = structlog.get_logger("router.responses.store")
REDIS_TIMEOUT_S = 2.0


class ResponsesStore(Protocol):
    async def get(self, rid: str, tenant: str) -> dict[str, Any] | None:
        """The turn if ``tenant`` stored it, else None."""

    async def put(self, rid: str, record: dict[str, Any], tenant: str) -> None: ...

    async def close(self) -> None: ...


def tenant_of(request: web.Request) -> str:
    """Who asks: set by the tenants middleware (router.admission.tenants),
    "" when no API keys are configured."""
    return request.get(TENANT) or ""


def _owned(record: dict[str, Any] | None, tenant: str) -> dict[str, Any] | None:
    # a record from before tenants were kept belongs to the keyless tenant ""
    return record if record is not None and record.get("tenant", "") == tenant else None


class MemoryStore:
    def __init__(self, max_items: int, ttl_s: float) -> None:
        self._items: OrderedDict[str, tuple[float, dict[str, Any]]] = OrderedDict()
        self.max_items, self.ttl_s = max_items, ttl_s

    async def get(self, rid: str, tenant: str) -> dict[str, Any] | None:
        item = self._items.get(rid)
        if item is None:
            return None
        expires, record = item
        if time.monotonic() > expires:
            del self._items[rid]
            return None
        return _owned(record, tenant)

    async def put(self, rid: str, record: dict[str, Any], tenant: str) -> None:
        self._items[rid] = (time.monotonic() + self.ttl_s, {**record, "tenant": tenant})
        self._items.move_to_end(rid)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    async def close(self) -> None:
        self._items.clear()


class RedisStore:
    PREFIX = "toposerve:response:"

    def __init__(self, url: str, ttl_s: float,
                 options: Mapping[str, Any] | None = None) -> None:
        import redis.asyncio as redis

        # bounded waits: a Redis that hangs must cost a request an error, not forever
        self._r = redis.from_url(url, socket_timeout=REDIS_TIMEOUT_S,
                                 socket_connect_timeout=REDIS_TIMEOUT_S, **(options or {}))
        self._errors = (redis.RedisError, OSError)
        self.ttl_ms = int(ttl_s * 1000)

    def _unavailable(self, err: Exception) -> ApiError:
        log.warning("responses store unavailable", error=str(err))
        return ApiError(503, "The Responses store is unavailable; retry shortly.")

    async def get(self, rid: str, tenant: str) -> dict[str, Any] | None:
        try:
            raw = await self._r.get(self.PREFIX + rid)
        except self._errors as err:
            raise self._unavailable(err) from err
        record: dict[str, Any] | None = None if raw is None else orjson.loads(raw)
        return _owned(record, tenant)

    async def put(self, rid: str, record: dict[str, Any], tenant: str) -> None:
        try:
            await self._r.set(self.PREFIX + rid, orjson.dumps({**record, "tenant": tenant}),
                              px=self.ttl_ms)
        except self._errors as err:
            raise self._unavailable(err) from err

    async def close(self) -> None:
        await self._r.aclose()


Keep = Callable[[Endpoint, dict[str, Any], str], Awaitable[None]]
KeepOrFail = Callable[[Endpoint, dict[str, Any], str], Awaitable[ApiError | None]]


def failed_event(completed: dict[str, Any], err: ApiError) -> bytes:
    """The ``response.failed`` event a stream ends with instead of the
    ``response.completed`` event ``completed`` when its turn could not be
    stored: its id names nothing, so the client must not take it for a
    turn it can continue (an ``error`` event alone would leave the response
    without its terminal event)."""
    resp = {**completed.get("response", {}), "status": "failed",
            "error": {"code": "server_error", "message": err.message}}
    data = {"type": "response.failed", "sequence_number": completed.get("sequence_number"),
            "response": resp}
    return b"event: response.failed\ndata: " + orjson.dumps(data)


def keep_or_fail(keep: Keep, failed: Callable[[], None]) -> KeepOrFail:
    """``keep`` for a stream: the store's refusal is returned (the stream
    then ends with ``failed_event``) and counted by ``failed``, not raised
    into a stream already under way. Nothing of the turn is stored: it is
    one SET, done or not."""
    async def kept(ep: Endpoint, resp: dict[str, Any], text: str) -> ApiError | None:
        try:
            await keep(ep, resp, text)
        except ApiError as err:
            failed()
            return err
        return None

    return kept


def _without_credentials(url: str) -> str:
    # redis-py lets a URL's user and password win over its keyword arguments
    u = urlsplit(url)
    host = u.netloc.rpartition("@")[2]
    return urlunsplit(u._replace(netloc=host))


def refuse_open_redis(cfg: ResponsesStoreConfig, options: Mapping[str, Any]) -> None:
    """Stops the start (ConfigError) when the Redis answers a PING sent
    without credentials, unless ``allowUnauthenticated``: such a Redis gives
    every pod that reaches it every tenant's stored turns. A Redis that
    cannot be reached now is left to the store's own errors (503s until it
    answers): a router may start before its Redis."""
    import redis

    assert cfg.redis_url is not None  # the config model guarantees it
    probe = redis.Redis.from_url(
        _without_credentials(cfg.redis_url), socket_timeout=REDIS_TIMEOUT_S,
        socket_connect_timeout=REDIS_TIMEOUT_S,
        **{k: v for k, v in options.items() if k != "password"})
    try:
        probe.ping()
    except redis.AuthenticationError:
        return  # NOAUTH: it needs a password
    except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
        log.warning("cannot check that Redis needs a password", error=str(err))
        return
    finally:
        probe.close()
    if not cfg.allow_unauthenticated:
        raise ConfigError(
            f"responses.redisUrl {_without_credentials(cfg.redis_url)}: this Redis answers "
            "without a password, so whoever reaches it reads every tenant's stored turns; "
            "give it one (requirepass) and the router responses.redisPasswordFile, or set "
            "responses.allowUnauthenticated: true")


def make_store(cfg: ResponsesStoreConfig) -> ResponsesStore:
    if cfg.backend == "redis":
        assert cfg.redis_url is not None  # the config model guarantees it
        try:
            options = cfg.redis_options()
        except OSError as err:
            raise ConfigError(f"responses.redisPasswordFile: cannot read "
                              f"{cfg.redis_password_file}: {err.strerror}") from None
        refuse_open_redis(cfg, options)
        return RedisStore(cfg.redis_url, cfg.ttl_s, options)
    return MemoryStore(cfg.max_items, cfg.ttl_s)
