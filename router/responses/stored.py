"""The Responses API's routes over stored turns (``GET`` and ``DELETE
/v1/responses/{id}``, ``GET /v1/responses/{id}/input_items``), answered
from the router's store whichever edge took the request: the HTTP
handlers, or the endpoint picker, which answers them itself instead of
letting the proxy send them to a model server that never kept them. Each
is the JSON body of a 200, or the ApiError its client gets; a turn of
another tenant is not found, as one never stored."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson

from toposerve.router.responses.store import ResponsesStore
from toposerve.wire.errors import ApiError

RESPONSE_PATH = re.compile(r"/v1/responses/([^/]+)(/input_items)?")


def _not_found(rid: str) -> ApiError:
    return ApiError(404, f"Response with id '{rid}' not found.")


async def _turn(store: ResponsesStore, rid: str, tenant: str) -> dict[str, Any]:
    rec = await store.get(rid, tenant)
    if rec is None:
        raise _not_found(rid)
    return rec


async def retrieve(store: ResponsesStore, rid: str, tenant: str,
                   query: Mapping[str, str]) -> bytes:
    """The turn's answer, as it was given."""
    response = await store.response(rid, tenant)
    if response is None:
        raise _not_found(rid)
    return orjson.dumps(response)


async def delete(store: ResponsesStore, rid: str, tenant: str,
                 query: Mapping[str, str]) -> bytes:
    if not await store.delete(rid, tenant):
        raise _not_found(rid)
    return orjson.dumps({"id": rid, "object": "response", "deleted": True})


async def input_items(store: ResponsesStore, rid: str, tenant: str,
                      query: Mapping[str, str]) -> bytes:
    """The turn's own input items, as OpenAI lists them (newest first
    unless ``order=asc``; ``limit``, ``after``)."""
    raw = (await _turn(store, rid, tenant))["input"]
    items = [{"type": "message", "role": "user", "content": raw}] if isinstance(
        raw, str) else [i for i in raw if isinstance(i, dict)]
    listed = [{**item, "id": item.get("id") or f"msg_{rid[5:]}_{n}",
               **({"type": "message", "status": "completed",
                   "content": _input_content(item.get("content"))}
                  if item.get("type", "message") == "message" else {})}
              for n, item in enumerate(items)]
    if query.get("order", "desc") == "desc":
        listed.reverse()
    if (after := query.get("after")) is not None:
        ids = [i["id"] for i in listed]
        listed = listed[ids.index(after) + 1:] if after in ids else []
    try:
        limit = min(max(int(query.get("limit", "20")), 1), 100)
    except ValueError:
        raise ApiError(400, "limit must be an integer", "limit") from None
    page = listed[:limit]
    return orjson.dumps({
        "object": "list", "data": page, "has_more": len(listed) > limit,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None})


def _input_content(content: Any) -> Any:
    """A message's content as OpenAI lists an input item's: parts."""
    return [{"type": "input_text", "text": content}] if isinstance(content, str) else content


Route = Callable[[ResponsesStore, str, str, Mapping[str, str]], Awaitable[bytes]]


def route_of(method: str, path: str) -> tuple[Route, str] | None:
    """The stored-turn route of ``method`` and ``path`` (its query apart),
    and the turn's id; None when it is none of them."""
    m = RESPONSE_PATH.fullmatch(path)
    if m is None:
        return None
    rid, items = m.group(1), m.group(2) is not None
    found = {("GET", False): retrieve, ("DELETE", False): delete,
             ("GET", True): input_items}.get((method, items))
    return None if found is None else (found, rid)
