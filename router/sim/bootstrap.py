"""SGLang's prefill/decode hand-over, modelled. A request carries
``bootstrap_host``, ``bootstrap_port`` and ``bootstrap_room`` and goes to a
prefill server and a decode server at once. The prefill server computes the
prompt and marks the room's KV ready; the decode server waits for that at
the prefill server's bootstrap port before it decodes. Real SGLang moves the
KV with a transfer engine after a bootstrap handshake; here the handshake
is an HTTP long poll (the simulator's own route) and the move costs nothing."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import aiohttp
from aiohttp import web

MAX_ROOMS = 100_000  # rooms remembered per prefill server, so memory stays bounded
ROUTE = "/sim/kv/{room}"


class Rooms:
    """A prefill server's rooms: which have their KV ready."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._rooms: OrderedDict[int, asyncio.Event] = OrderedDict()

    def _event(self, room: int) -> asyncio.Event:
        ev = self._rooms.get(room)
        if ev is None:
            ev = self._rooms[room] = asyncio.Event()
            while len(self._rooms) > MAX_ROOMS:
                self._rooms.popitem(last=False)
        return ev

    def ready(self, room: int) -> None:
        self._event(room).set()

    async def handle(self, request: web.Request) -> web.Response:
        """Answers when the room's KV is ready; 404 if it is not in time."""
        try:
            room = int(request.match_info["room"])
        except ValueError:
            return web.Response(status=400, text="room must be an integer")
        try:
            await asyncio.wait_for(self._event(room).wait(), self.timeout_s)
        except TimeoutError:
            return web.Response(status=404, text=f"no KV for room {room}")
        return web.Response(text="ready")


async def pull(session: aiohttp.ClientSession, host: str, port: int, room: int,
               timeout_s: float) -> str | None:
    """Wait for the room's KV at the prefill server; None when it arrived,
    else why not."""
    url = f"http://{host}:{port}{ROUTE.format(room=room)}"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s + 5)) as r:
            return None if r.status == 200 else f"HTTP {r.status} from {host}:{port}"
    except (aiohttp.ClientError, TimeoutError) as err:
        return f"{type(err).__name__} from {host}:{port}"
