"""Stored Responses-API turns, so a ``previous_response_id`` chain works on
any endpoint. In memory (bounded in bytes and count, expired turns swept
in the background) for one router, or in Redis for a hot-standby pair.

Each turn stores its own input and output and a link to the turn before
(``previous``), never the conversation so far, so a chain's bytes grow
with its turns, not their square; reading a chain walks the links, at
most ``maxChainTurns`` of them and ``maxChainBytes`` of their input and
output. The answer as the model server gave it (``response``, which may
echo long instructions) is kept apart and read only by ``GET``, so no
chain walk pays for it. A turn's id is minted by the router and
written only where nothing is (Redis: SET NX), so no client or upstream
can choose a key that replaces another's turn. Each turn belongs to the
tenant that created it: to any other tenant it does not exist (the router
answers 404, not 403, so ids of other tenants' responses cannot be
probed)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import orjson
import structlog

from toposerve.router.config import ResponsesStoreConfig
from toposerve.router.pool.endpoints import Endpoint
from toposerve.topology.config_file import ConfigError
from toposerve.wire.errors import ApiError

log = structlog.get_logger("router.responses.store")
REDIS_TIMEOUT_S = 2.0


def new_id() -> str:
    """A turn's id: the router's, whatever id the upstream (or a client,
    through vLLM's ``request_id``) gave its answer."""
    return "resp_" + secrets.token_hex(24)


class ResponsesStore(Protocol):
    async def get(self, rid: str, tenant: str) -> dict[str, Any] | None:
        """The turn if ``tenant`` stored it, else None: its record without
        the ``response``."""

    async def response(self, rid: str, tenant: str) -> Any:
        """The turn's ``response`` if ``tenant`` stored it, else None."""

    async def put(self, rid: str, record: dict[str, Any], tenant: str,
                  earlier: Sequence[str] = ()) -> None:
        """Stores a new turn (an id already taken is refused), its
        ``response`` apart from the rest, and keeps the ``earlier`` turns of
        its chain as long as it."""

    async def delete(self, rid: str, tenant: str) -> bool:
        """Whether ``tenant``'s turn ``rid`` was there to delete."""

    async def run(self) -> None:
        """What the store does in the background while the router runs."""

    async def close(self) -> None: ...


def _owned(record: dict[str, Any] | None, tenant: str) -> dict[str, Any] | None:
    # a record from before tenants were kept belongs to the keyless tenant ""
    return record if record is not None and record.get("tenant", "") == tenant else None


def _taken(rid: str) -> ApiError:
    return ApiError(500, f"response id {rid} is taken; nothing was stored")


def _split(record: dict[str, Any], tenant: str) -> tuple[bytes, bytes]:
    """A turn as stored: the record but its response, and the response.
    Copied to their own size: orjson's result keeps the buffer it sized
    for the worst case (a 1 MiB turn held 16 MiB), and budgets count len."""
    link = {k: v for k, v in record.items() if k != "response"}
    return (bytes(memoryview(orjson.dumps({**link, "tenant": tenant}))),
            bytes(memoryview(orjson.dumps(record.get("response")))))


async def read_chain(store: ResponsesStore, rid: str, tenant: str, max_turns: int,
                     max_bytes: int) -> tuple[list[str], list[dict[str, Any]]] | None:
    """The chain ending with turn ``rid``, oldest first (ids and records);
    None when ``rid`` is not ``tenant``'s. An earlier turn gone (deleted),
    a chain over ``max_turns``, or one whose turns' input and output come to
    over ``max_bytes`` is an error naming it, found as the walk meets it: a
    small continuation must not make the router read a huge chain."""
    ids: list[str] = []
    turns: list[dict[str, Any]] = []
    size = 0
    cur: str | None = rid
    while cur is not None:
        if len(turns) == max_turns:
            raise ApiError(400, f"the chain of '{rid}' is longer than {max_turns} turns "
                                "(responses.maxChainTurns)", "previous_response_id")
        rec = await store.get(cur, tenant)
        if rec is None:
            if not turns:
                return None
            raise ApiError(404, f"Response with id '{cur}', an earlier turn of '{rid}', "
                                "not found.", "previous_response_id")
        size += len(orjson.dumps([rec.get("input"), rec.get("output")]))
        if size > max_bytes:
            raise ApiError(413, f"the conversation before previous_response_id is over "
                                f"{max_bytes} bytes (responses.maxChainBytes); start a new "
                                "one or send the history yourself", "previous_response_id")
        ids.append(cur)
        turns.append(rec)
        cur = rec.get("previous")
    return ids[::-1], turns[::-1]


class _Item:
    """A turn in the memory store."""

    __slots__ = ("expires", "link", "response", "size", "tenant")

    def __init__(self, expires: float, link: bytes, response: bytes, tenant: str) -> None:
        self.expires, self.link, self.response, self.tenant = expires, link, response, tenant
        self.size = len(link) + len(response)


class _Share:
    """One tenant's turns in the memory store, oldest first, and their bytes."""

    __slots__ = ("bytes", "turns")

    def __init__(self) -> None:
        self.turns: OrderedDict[str, None] = OrderedDict()
        self.bytes = 0


class MemoryStore:
    def __init__(self, cfg: ResponsesStoreConfig) -> None:
        # in expiry order: every write and refresh moves a turn to the end
        self._items: OrderedDict[str, _Item] = OrderedDict()
        self._shares: dict[str, _Share] = {}  # each tenant's turns, in the same order
        self.cfg = cfg
        self.bytes = 0
        self.share_items = max(1, int(cfg.max_items * cfg.tenant_share))
        self.share_bytes = int(cfg.max_bytes * cfg.tenant_share)

    def _item(self, rid: str, tenant: str) -> _Item | None:
        item = self._items.get(rid)
        if item is None or time.monotonic() > item.expires or item.tenant != tenant:
            return None
        return item

    async def get(self, rid: str, tenant: str) -> dict[str, Any] | None:
        item = self._item(rid, tenant)
        return None if item is None else _owned(orjson.loads(item.link), tenant)

    async def response(self, rid: str, tenant: str) -> Any:
        item = self._item(rid, tenant)
        return None if item is None else orjson.loads(item.response)

    def _pop(self, rid: str) -> None:
        item = self._items.pop(rid)
        self.bytes -= item.size
        share = self._shares[item.tenant]
        del share.turns[rid]
        share.bytes -= item.size
        if not share.turns:
            del self._shares[item.tenant]

    async def put(self, rid: str, record: dict[str, Any], tenant: str,
                  earlier: Sequence[str] = ()) -> None:
        if rid in self._items:
            raise _taken(rid)
        link, response = _split(record, tenant)
        expires = time.monotonic() + self.cfg.ttl_s
        for e in earlier:
            if (old := self._items.get(e)) is not None:
                old.expires = expires
                self._items.move_to_end(e)
                self._shares[old.tenant].turns.move_to_end(e)
        item = self._items[rid] = _Item(expires, link, response, tenant)
        self.bytes += item.size
        share = self._shares.setdefault(tenant, _Share())
        share.turns[rid] = None
        share.bytes += item.size
        # a tenant at its share makes room from its own turns, so no tenant can
        # drop every other's; without keys ("") the one tenant has the whole store
        if tenant:
            while len(share.turns) > 1 and (len(share.turns) > self.share_items
                                            or share.bytes > self.share_bytes):
                self._pop(next(iter(share.turns)))
        # then the oldest go first; the new turn stays even if it alone is over
        while len(self._items) > 1 and (len(self._items) > self.cfg.max_items
                                        or self.bytes > self.cfg.max_bytes):
            self._pop(next(iter(self._items)))

    async def delete(self, rid: str, tenant: str) -> bool:
        if await self.get(rid, tenant) is None:
            return False
        self._pop(rid)
        return True

    def sweep(self, now: float | None = None) -> int:
        """Drops the expired turns (at the front); how many."""
        now = time.monotonic() if now is None else now
        gone = 0
        while self._items and next(iter(self._items.values())).expires < now:
            self._pop(next(iter(self._items)))
            gone += 1
        return gone

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.sweep_interval_s)
            self.sweep()

    async def close(self) -> None:
        self._items.clear()
        self._shares.clear()
        self.bytes = 0


RESPONSE_SUFFIX = ":response"  # a turn's response, beside its record


class RedisStore:
    PREFIX = "toposerve:response:"

    def __init__(self, url: str, ttl_s: float, options: Mapping[str, Any] | None = None,
                 allow_open: bool = False) -> None:
        """``allow_open``: skip the check, made on each new connection, that
        the Redis keeps its turns from clients without credentials."""
        import redis.asyncio as redis

        self.url, self.options = url, dict(options or {})
        # bounded waits: a Redis that hangs must cost a request an error, not forever
        self._r = redis.from_url(url, socket_timeout=REDIS_TIMEOUT_S,
                                 socket_connect_timeout=REDIS_TIMEOUT_S,
                                 redis_connect_func=None if allow_open else self._connected,
                                 **self.options)
        self._errors = (redis.RedisError, OSError)
        self.ttl_ms = int(ttl_s * 1000)

    async def _connected(self, conn: Any) -> None:
        """Each new connection, before any command goes over it: whether the
        Redis is open is asked again, since the one that answers now may not
        be the one checked at start (unreachable then, or restarted since)."""
        import redis.asyncio as redis

        await conn.on_connect()  # what redis-py does without this hook: AUTH, SELECT
        url, anonymous = _anonymous(self.url, self.options)
        probe = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_S,
                                     socket_connect_timeout=REDIS_TIMEOUT_S, **anonymous)
        err: Exception | None = None
        try:
            await probe.get(PROBE_KEY)
        except (redis.RedisError, OSError) as e:
            err = e
        finally:
            await probe.aclose()
        found = _open(err)
        if found is True:
            # a RedisError, not a ConnectionError: redis-py does not retry it
            raise redis.RedisError(_open_message(self.url) + "; nothing is stored in it")
        if isinstance(found, Exception):
            raise redis.RedisError(f"cannot check that Redis needs a password: {found}")

    def _unavailable(self, err: Exception) -> ApiError:
        log.warning("responses store unavailable", error=str(err))
        return ApiError(503, "The Responses store is unavailable; retry shortly.")

    def _keys(self, rid: str) -> tuple[str, str]:
        return self.PREFIX + rid, self.PREFIX + rid + RESPONSE_SUFFIX

    async def get(self, rid: str, tenant: str) -> dict[str, Any] | None:
        try:
            raw = await self._r.get(self.PREFIX + rid)
        except self._errors as err:
            raise self._unavailable(err) from err
        record = None if raw is None else _owned(orjson.loads(raw), tenant)
        if record is not None:
            record.pop("response", None)  # one stored whole, before the two were apart
        return record

    async def response(self, rid: str, tenant: str) -> Any:
        try:
            raw, response = await self._r.mget(self._keys(rid))
        except self._errors as err:
            raise self._unavailable(err) from err
        record = None if raw is None else _owned(orjson.loads(raw), tenant)
        if record is None:
            return None
        return record.get("response") if response is None else orjson.loads(response)

    async def put(self, rid: str, record: dict[str, Any], tenant: str,
                  earlier: Sequence[str] = ()) -> None:
        link, response = _split(record, tenant)
        key, response_key = self._keys(rid)
        try:
            async with self._r.pipeline(transaction=False) as pipe:
                pipe.set(key, link, px=self.ttl_ms, nx=True)  # never over another turn
                pipe.set(response_key, response, px=self.ttl_ms, nx=True)
                for e in earlier:
                    for k in self._keys(e):
                        pipe.pexpire(k, self.ttl_ms)
                done = await pipe.execute()
        except self._errors as err:
            raise self._unavailable(err) from err
        if not done[0]:
            raise _taken(rid)

    async def delete(self, rid: str, tenant: str) -> bool:
        if await self.get(rid, tenant) is None:
            return False
        try:
            # ids are minted and written once, so the turn read is the one deleted
            await self._r.delete(*self._keys(rid))
        except self._errors as err:
            raise self._unavailable(err) from err
        return True

    async def run(self) -> None:
        """Redis expires turns itself."""

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


# a key of the store's, read without credentials: if that works, anyone who
# reaches the Redis reads every tenant's turns
PROBE_KEY = RedisStore.PREFIX + "probe"


def _anonymous(url: str, options: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The URL and options of a client of the same Redis without credentials."""
    return _without_credentials(url), {k: v for k, v in options.items()
                                       if k not in ("username", "password")}


def _open(err: Exception | None) -> bool | Exception:
    """Whether a read sent without credentials was answered (``err`` None:
    the Redis is open), refused (False: it needs a password, or its default
    user is off or may not read the store's keys, as with ACL users), or
    could not be made (the error: nothing known)."""
    import redis

    if err is None:
        return True
    if isinstance(err, (redis.AuthenticationError, redis.exceptions.NoPermissionError)):
        return False  # NOAUTH, NOPERM, or HELLO refused to a default user that is off
    return err


def _open_message(url: str) -> str:
    return (f"responses.redisUrl {_without_credentials(url)}: this Redis answers without a "
            "password, so whoever reaches it reads every tenant's stored turns; give it one "
            "(requirepass, or an ACL user for the router and a default user that may not "
            "read) and the router responses.redisPasswordFile, or set "
            "responses.allowUnauthenticated: true")


def refuse_open_redis(cfg: ResponsesStoreConfig, options: Mapping[str, Any]) -> None:
    """Stops the start (ConfigError) when the Redis answers a read of the
    store's keys sent without credentials, unless ``allowUnauthenticated``:
    such a Redis gives every pod that reaches it every tenant's stored
    turns. A Redis that cannot be reached now is checked when the store
    first connects to it (``RedisStore``): a router may start before its
    Redis."""
    import redis

    assert cfg.redis_url is not None  # the config model guarantees it
    url, anonymous = _anonymous(cfg.redis_url, options)
    probe = redis.Redis.from_url(url, socket_timeout=REDIS_TIMEOUT_S,
                                 socket_connect_timeout=REDIS_TIMEOUT_S, **anonymous)
    err: Exception | None = None
    try:
        probe.get(PROBE_KEY)
    except (redis.RedisError, OSError) as e:
        err = e
    finally:
        probe.close()
    found = _open(err)
    if isinstance(found, Exception):
        log.warning("cannot check that Redis needs a password; checked again when the store "
                    "connects", error=str(found))
    elif found and not cfg.allow_unauthenticated:
        raise ConfigError(_open_message(cfg.redis_url))


def make_store(cfg: ResponsesStoreConfig) -> ResponsesStore:
    if cfg.backend == "redis":
        assert cfg.redis_url is not None  # the config model guarantees it
        try:
            options = cfg.redis_options()
        except OSError as err:
            raise ConfigError(f"responses.redisPasswordFile: cannot read "
                              f"{cfg.redis_password_file}: {err.strerror}") from None
        refuse_open_redis(cfg, options)
        return RedisStore(cfg.redis_url, cfg.ttl_s, options, cfg.allow_unauthenticated)
    return MemoryStore(cfg)
