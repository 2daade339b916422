"""Request bodies too wide for the event loop. Parsing, validating and
keying a body costs its JSON values (the body itself, every array element,
every object member) a tenth of a microsecond to a few microseconds each
(a validation error the most), and 8 MiB can hold millions of them. A body
that may hold more than ``INLINE_VALUES`` is therefore first read by the
body worker, a process of its own: it parses, counts and validates the body
and answers with what the loop must know to refuse it (its model, its list
lengths, its values, the first validation error). The loop parses only a
body it will not refuse and that holds at most server.maxJsonValues values.

Run as ``python -m toposerve.router.http.bodies``, this module is the
worker: it reads requests on stdin and writes verdicts on stdout."""

from __future__ import annotations

import asyncio
import gc
import struct
import sys
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from pydantic import BaseModel, ValidationError

from toposerve.wire.errors import ApiError, from_validation
from toposerve.wire.openai import ChatRequest, CompletionRequest, ResponsesRequest

log = structlog.get_logger("router")
# the most values a body may hold to be parsed and validated on the loop
# unseen: some 1.6 µs each when every one is a validation error (13 ms for
# 8,192 here, twice that on a loaded machine), under the loop's 50 ms
INLINE_VALUES = 8192
LISTED = ("messages", "input")  # the request lists server.maxListItems bounds
MODELS: dict[str, type[BaseModel]] = {
    m.__name__: m for m in (ChatRequest, CompletionRequest, ResponsesRequest)}
_HEAD = struct.Struct(">II")  # a request: its head's length, the body's length
_SIZE = struct.Struct(">I")  # a verdict's length


def few_values(body: bytes, most: int) -> bool:
    """Whether ``body`` surely holds at most ``most`` JSON values, known
    without parsing it. Each value but the body itself follows a comma or
    opens its container's list of children: at most commas + opening
    brackets + 1 values (commas and brackets inside strings make the count
    high, never low); and as each value takes a byte and each after a
    first child a comma besides, n bytes hold at most (n + 1) // 2 of them
    (no count needed)."""
    if len(body) < 2 * most:
        return True
    n = body.count(b",") + 1
    return n <= most and n + body.count(b"[") + body.count(b"{") <= most


def parse(body: bytes) -> dict[str, Any]:
    """The body as a JSON object, or the 400 saying why not."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as err:
        raise ApiError(400, f"request body is not valid JSON: {err}") from None
    if not isinstance(doc, dict):
        raise ApiError(400, "request body must be a JSON object")
    return doc


def list_sizes(doc: dict[str, Any]) -> list[tuple[str, int]]:
    """The lengths of the lists server.maxListItems bounds, by key."""
    return [(key, len(items)) for key in LISTED if isinstance(items := doc.get(key), list)]


def count_values(doc: Any, most: int) -> int:
    """The JSON values of ``doc``, counted up to the first past ``most``."""
    n, todo = 1, [doc]
    while todo and n <= most:
        children = todo.pop()
        if isinstance(children, dict):
            children = children.values()
        n += len(children)
        todo.extend(c for c in children if isinstance(c, dict | list))
    return n


Refusal = tuple[int, str, str | None]  # an ApiError's status, message and param


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the worker read of a body: ``unreadable``, the 400 for a body
    that is not a JSON object; else its model (when a string), the lengths
    of its bounded lists, its values (counted up to one past
    server.maxJsonValues) and, when no limit refuses it, ``invalid``: the
    400 for its first validation error."""

    unreadable: Refusal | None
    model: str | None = None
    sizes: tuple[tuple[str, int], ...] = ()
    values: int = 0
    invalid: Refusal | None = None


def vet(body: bytes, model: type[BaseModel], max_items: int, max_values: int) -> Verdict:
    """The worker's reading of one body."""
    try:
        doc = parse(body)
    except ApiError as err:
        return Verdict((err.status, err.message, err.param))
    sizes = tuple(list_sizes(doc))
    values = count_values(doc, max_values)
    invalid = None
    if values <= max_values and all(n <= max_items for _, n in sizes):
        try:
            model.model_validate(doc)
        except ValidationError as err:
            e = from_validation(err)
            invalid = (e.status, e.message, e.param)
    name = doc.get("model")
    return Verdict(None, name if isinstance(name, str) else None, sizes, values, invalid)


def _refusal(fields: list[Any] | None) -> Refusal | None:
    return None if fields is None else (fields[0], fields[1], fields[2])


class BodyWorker:
    """The loop's side of the body worker: one process, started when a body
    first needs it (most routers never see one) and again after it dies,
    reading one body at a time. Requests waiting their turn hold their
    bodies, which count against server.maxInflightBytes until they end:
    that budget bounds the queue."""

    def __init__(self) -> None:
        self._proc: asyncio.subprocess.Process | None = None
        self._turn = asyncio.Lock()

    async def vet(self, body: bytes, model: type[BaseModel], max_items: int,
                  max_values: int) -> Verdict:
        # waiting for the turn can be given up (a client gone leaves the
        # queue); an exchange begun is finished, so that the pipe stays in
        # step, and gives the turn on when it ends
        await self._turn.acquire()
        try:
            exchange = asyncio.ensure_future(self._exchange(body, model, max_items, max_values))
        except BaseException:
            self._turn.release()
            raise
        exchange.add_done_callback(lambda _: self._turn.release())
        return await asyncio.shield(exchange)

    async def _exchange(self, body: bytes, model: type[BaseModel], max_items: int,
                        max_values: int) -> Verdict:
        if self._proc is None or self._proc.returncode is not None:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", __name__, stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE)
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        head = orjson.dumps([model.__name__, max_items, max_values])
        try:
            proc.stdin.write(_HEAD.pack(len(head), len(body)) + head)
            proc.stdin.write(body)  # what the pipe does not take at once, it writes as it drains
            await proc.stdin.drain()
            (size,) = _SIZE.unpack(await proc.stdout.readexactly(_SIZE.size))
            unreadable, name, sizes, values, invalid = orjson.loads(
                await proc.stdout.readexactly(size))
        except (ConnectionError, asyncio.IncompleteReadError):
            self._proc = None
            if proc.returncode is None:
                proc.kill()
            log.warning("the body worker stopped; it starts again with the next wide body",
                        exit_code=await proc.wait())
            raise ApiError(503, "the router's body worker stopped while reading this "
                                "request; retry") from None
        return Verdict(_refusal(unreadable), name, tuple((key, n) for key, n in sizes), values,
                       _refusal(invalid))

    async def close(self) -> None:
        """Ends the worker (its stdin closed, it exits; killed if it does not
        within a second)."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 1)
        except TimeoutError:
            proc.kill()
            await proc.wait()


def main() -> None:
    """The worker: a request is its head's and its body's lengths, the head
    ([model name, maxListItems, maxJsonValues]) and the body; the answer is
    the verdict's length and the verdict, as JSON."""
    # collections between bodies, not while one is parsed: a wide body's
    # containers, walked again and again as they are made, cost some 4x its
    # parse; what exists now (modules, models) is never walked again
    gc.disable()
    gc.freeze()
    read, out = sys.stdin.buffer.read, sys.stdout.buffer
    while head := read(_HEAD.size):
        head_size, body_size = _HEAD.unpack(head)
        name, max_items, max_values = orjson.loads(read(head_size))
        v = vet(read(body_size), MODELS[name], max_items, max_values)
        answer = orjson.dumps([v.unreadable, v.model, v.sizes, v.values, v.invalid])
        out.write(_SIZE.pack(len(answer)) + answer)
        out.flush()
        gc.collect()


if __name__ == "__main__":
    main()
