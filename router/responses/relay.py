"""Relaying a streamed Responses-API answer while keeping the turn: events
pass through as they complete; those carrying the whole response get the
router's id for the turn and the chain's ``previous_response_id`` back (the
model server saw the full conversation, not the chain), and
``response.completed`` is stored before the client sees it, so the next
turn can name it at once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson

from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.relay.upstream import UpstreamError
from toposerve.router.responses.store import KeepOrFail, failed_event

_WHOLE = (b"response.created", b"response.in_progress", b"response.completed",
          b"response.failed", b"response.incomplete")


def output_text(resp: dict[str, Any]) -> str:
    """The answer's text, from whatever shape the upstream sent: parts that
    are not what the Responses API says are skipped, never a fault."""
    output = resp.get("output")
    return "".join(
        c["text"] for item in (output if isinstance(output, list) else ())
        if isinstance(item, dict) and item.get("type") == "message"
        and isinstance(content := item.get("content"), list)
        for c in content if isinstance(c, dict) and isinstance(c.get("text"), str))


class ResponsesTap:
    def __init__(self, rid: str, previous_response_id: str | None, keep: KeepOrFail,
                 max_event_bytes: int, hold: Callable[[int], None]) -> None:
        """``hold(n)`` counts ``n`` more bytes of the unfinished event
        against the router's byte budget (negative: given back), raising
        when the router may hold no more."""
        self.rid, self.previous, self.keep = rid, previous_response_id, keep
        self.max_event_bytes, self._hold = max_event_bytes, hold
        # the unfinished event's pieces, as they came: joined once it ends,
        # never copied while it grows (a stream that never ends one would
        # otherwise be copied again and again as its buffer grew)
        self._parts: list[bytes] = []
        self._size = 0

    async def feed(self, ep: Endpoint, chunk: bytes) -> bytes:
        """The bytes to send on: every event completed by ``chunk``. An
        event longer than ``max_event_bytes`` breaks the stream's framing
        (UpstreamError: the client gets an SSE error)."""
        try:
            self._hold(len(chunk))
        except Exception as err:  # the budget is spent: this stream cannot go on
            raise UpstreamError(str(err)) from None
        # only the new bytes (and the one before them) can end an event
        cut = chunk.rfind(b"\n\n") + 2
        if cut < 2:
            cut = 1 if self._parts and self._parts[-1].endswith(b"\n") and chunk[:1] == b"\n" \
                else 0
        if not cut:
            self._parts.append(chunk)
            self._size += len(chunk)
            if self._size > self.max_event_bytes:
                raise UpstreamError(f"an event over {self.max_event_bytes} bytes without an "
                                    "end (server.maxAnswerBytes)")
            return b""
        ready = b"".join([*self._parts, chunk[:cut]])
        rest = chunk[cut:]
        self._parts, self._size = ([rest], len(rest)) if rest else ([], 0)
        self._hold(-len(ready))
        if not any(t in ready for t in _WHOLE):
            return ready  # text deltas: as they are
        return b"".join([await self._event(ep, ev) + b"\n\n"
                         for ev in ready.split(b"\n\n") if ev])

    def tail(self) -> bytes:
        rest = b"".join(self._parts)
        self._parts, self._size = [], 0
        self._hold(-len(rest))
        return rest

    async def _event(self, ep: Endpoint, ev: bytes) -> bytes:
        lines = ev.split(b"\n")
        for i, line in enumerate(lines):
            if not line.startswith(b"data:"):
                continue
            try:
                data = orjson.loads(line[5:])
            except orjson.JSONDecodeError:
                return ev
            resp = data.get("response") if isinstance(data, dict) else None
            if not isinstance(resp, dict):
                return ev
            resp["id"], resp["previous_response_id"] = self.rid, self.previous
            if data.get("type") == "response.completed" and (
                    err := await self.keep(ep, resp, output_text(resp))) is not None:
                return failed_event(data, err)  # not stored: the stream ends failed
            lines[i] = b"data: " + orjson.dumps(data)
        return b"\n".join(lines)
