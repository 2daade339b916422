"""The router's global in-flight budget: how many requests it holds at once
and how many bytes of their bodies, counted as they are read. A request
that would pass either gets 429 with a ``Retry-After`` (which the OpenAI
SDKs honour) instead of the router's memory growing with whatever its
clients send at once."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from aiohttp import web

from toposerve.router.config import ServerConfig
from toposerve.wire.errors import ApiError


@dataclass(slots=True)
class Hold:
    """The body bytes one request holds of the budget."""

    bytes: int = 0


class Overloaded(ApiError):
    """429 with the Retry-After the client should wait."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(429, message)
        self.headers = {"Retry-After": str(retry_after_s)}


class Budget:
    def __init__(self, cfg: ServerConfig) -> None:
        self.cfg = cfg
        self.bytes = 0  # body bytes read and held by requests in flight
        self.requests = 0

    def _overloaded(self, what: str) -> Overloaded:
        return Overloaded(f"the router holds too many {what} at once; retry shortly",
                          self.cfg.retry_after_s)

    def enter(self) -> None:
        """Counts a request in flight (the edge calls it for every request
        but probes and scrapes); refuses one over the limit."""
        if self.requests >= self.cfg.max_inflight_requests:
            raise self._overloaded("requests (server.maxInflightRequests)")
        self.requests += 1

    def leave(self, hold: Hold) -> None:
        """The request ended: its slot and its bytes come back."""
        self.requests -= 1
        self.give_back(hold)

    def give_back(self, hold: Hold) -> None:
        """The bytes of ``hold`` are free again (a request's part that
        outlived it, e.g. a prefill answered in the background)."""
        self.bytes -= hold.bytes
        hold.bytes = 0

    def adjust(self, hold: Hold, n: int, what: str) -> None:
        """``n`` more bytes held (``take``), or ``-n`` given back early."""
        if n >= 0:
            self.take(hold, n, what)
        else:
            self.bytes += n
            hold.bytes += n

    def take(self, hold: Hold, n: int, what: str = "request bytes") -> None:
        """``n`` more bytes held for one request (its body as it is read,
        an answer or a chain it assembles); 429 past the budget."""
        if self.bytes + n > self.cfg.max_inflight_bytes:
            raise self._overloaded(f"{what} (server.maxInflightBytes)")
        self.bytes += n
        hold.bytes += n

    async def read_body(self, request: web.Request, hold: Hold) -> bytes:
        """The body, counted against the budget as it arrives: refused
        before a byte is read when its Content-Length is over the body limit
        or over what the budget has left."""
        limit = self.cfg.max_body_bytes
        too_large = ApiError(413, f"request body over {limit} bytes (server.maxBodyBytes)")
        declared = request.content_length
        if declared is not None:
            if declared > limit:
                raise too_large
            if self.bytes + declared > self.cfg.max_inflight_bytes:
                raise self._overloaded("request bytes (server.maxInflightBytes)")
        if request.content.is_eof():  # all of it came with the head: nothing to wait for
            return await self._read(request, hold, limit, too_large)
        # a client trickling its body holds a request slot: bounded in time
        # as a whole, so a byte now and then does not keep it forever
        wait = self.cfg.client_timeout_s
        try:
            async with asyncio.timeout(wait):
                return await self._read(request, hold, limit, too_large)
        except TimeoutError:
            raise ApiError(408, f"the request body did not arrive within {wait:g} s "
                                "(server.clientTimeoutSeconds)") from None

    async def _read(self, request: web.Request, hold: Hold, limit: int,
                    too_large: ApiError) -> bytes:
        chunks: list[bytes] = []
        size = 0
        try:
            async for chunk in request.content.iter_any():
                size += len(chunk)
                if size > limit:
                    raise too_large
                self.take(hold, len(chunk))
                chunks.append(chunk)
        except web.RequestPayloadError as err:
            # a Content-Encoding the body does not follow (aiohttp decodes it as it comes)
            raise ApiError(400, f"the request body could not be read: {err.__cause__ or err}",
                           "Content-Encoding") from None
        return b"".join(chunks)
