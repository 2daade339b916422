"""A Responses turn's 200 answer as it goes by the picker. The proxy
streams the answer through the picker (``FULL_DUPLEX_STREAMED``), so what
the picker hands back is what the client gets: as the standalone router's
relay does, the answer gets the router's id for the turn and the turn is
stored. A stream goes through the relay's own ``ResponsesTap`` (events
handed on as they complete, ``response.completed`` stored before the
client sees it); a whole answer is held to its end, stamped, stored, then
handed on (the proxy drops its content-length: the new length is
another)."""

from __future__ import annotations

from collections.abc import Callable

import orjson

from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.relay.proxy import broke
from toposerve.router.relay.upstream import UpstreamError
from toposerve.router.responses.relay import ResponsesTap, output_text
from toposerve.router.responses.store import Keep, keep_or_fail
from toposerve.router.responses.turn import Turn
from toposerve.wire.errors import ApiError, sse_error


class TurnAnswer:
    def __init__(self, turn: Turn, streamed: bool, keep: Keep, unstored: Callable[[], None],
                 max_bytes: int, hold: Callable[[int], None]) -> None:
        """``keep`` stores the turn (``unstored`` counts a stream's turn it
        could not), ``max_bytes`` bounds what is held (a whole answer, an
        unfinished event), ``hold(n)`` counts ``n`` more bytes held against
        the router's byte budget (negative: given back), raising when it
        may hold no more."""
        self.turn, self.keep, self.max_bytes, self._hold = turn, keep, max_bytes, hold
        self.tap = ResponsesTap(turn.rid, turn.previous, keep_or_fail(keep, unstored),
                                max_bytes, hold) if streamed else None
        self._parts: list[bytes] = []
        self._size = 0
        self._broken = False

    async def feed(self, ep: Endpoint, chunk: bytes, end: bool) -> bytes | None:
        """What to hand on for ``chunk`` of ``ep``'s answer (``end``: its
        last); None while a whole answer is held. A whole answer that
        cannot be kept raises the ApiError its client gets instead."""
        if self.tap is None:
            return await self._whole(ep, chunk, end)
        if self._broken:
            return b""  # the client has its error event: the rest is dropped
        try:
            out = await self.tap.feed(ep, chunk) if chunk else b""
            return out + self.tap.tail() if end else out
        except UpstreamError as err:  # an event too long, or the byte budget spent
            self._broken = True
            return sse_error(502, broke(ep, err))

    async def _whole(self, ep: Endpoint, chunk: bytes, end: bool) -> bytes | None:
        self._size += len(chunk)
        if self._size > self.max_bytes:
            raise ApiError(502, broke(ep, UpstreamError(
                f"answer over {self.max_bytes} bytes (server.maxAnswerBytes)")))
        self._hold(len(chunk))
        self._parts.append(chunk)
        if not end:
            return None
        resp = self.turn.whole(b"".join(self._parts), ep)
        await self.keep(ep, resp, output_text(resp))
        return orjson.dumps(resp)
