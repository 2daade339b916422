"""SGLang's prefill/decode hand-over, modelled. A request carries
``bootstrap_host``, ``bootstrap_port`` and ``bootstrap_room`` and goes to a
prefill server and a decode server at once. The prefill server computes the
prompt and marks the room's KV ready; the decode server waits for that at
the prefill server's bootstrap port before it decodes. Real SGLang moves the
KV with a transfer engine after a bootstrap handshake; here the handshake
is an HTTP long poll (the simulator's own route) whose answer says where the
prefill server runs, so the decode server can price the move by topology
tier as in vLLM's flow."""

from __future__ import annotations

import asyncio
from collections import OrderedDict

import aiohttp
import orjson
from aiohttp import web
from pydantic import ValidationError

from toposerve.topology.model import DomainPath

MAX_ROOMS = 100_000  # rooms remembered per prefill server, so memory stays bounded
ROUTE = "/sim/kv/{room}"


class Rooms:
    """A prefill server's rooms: which have their KV ready."""

    def __init__(self, timeout_s: float, place: DomainPath | None) -> None:
        self.timeout_s, self.place = timeout_s, place
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
        place = self.place.model_dump() if self.place is not None else None
        return web.json_response({"room": room, "place": place},
                                 dumps=lambda o: orjson.dumps(o).decode())


async def pull(session: aiohttp.ClientSession, host: str, port: int, room: int,
               timeout_s: float) -> str | DomainPath | None:
    """Wait for the room's KV at the prefill server. When it is ready: where
    that server runs (None if it does not say); else why not, as a string."""
    url = f"http://{host}:{port}{ROUTE.format(room=room)}"
    try:
        async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s + 5)) as r:
            if r.status != 200:
                return f"HTTP {r.status} from {host}:{port}"
            place = orjson.loads(await r.read()).get("place")
    except (aiohttp.ClientError, TimeoutError) as err:
        return f"{type(err).__name__} from {host}:{port}"
    except (orjson.JSONDecodeError, AttributeError):
        return f"an answer from {host}:{port} that is not a room's JSON"
    try:
        return None if place is None else DomainPath.model_validate(place)
    except ValidationError:
        return f"a place from {host}:{port} that is not one"
