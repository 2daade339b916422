"""What a generation request asks, read from the body a proxy streamed to
the picker: its model, prompt, session and output limit. The body is read
by the router's own HTTP handlers (``Handlers.read_json``: the body worker
for wide bodies, the same refusals in the same order, a client's KV
hand-over fields dropped), so a request is routed the same whichever edge
took it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from toposerve.router.admission.flow_control import client_id
from toposerve.router.admission.usage import requested_output
from toposerve.router.disaggregation.pairing import RESPONSES_PATH
from toposerve.router.http.handlers import SESSION_HEADERS, Handlers, session_key
from toposerve.router.request import RequestContext
from toposerve.wire.errors import ApiError
from toposerve.wire.openai import ChatRequest, CompletionRequest, ResponsesRequest
from toposerve.wire.prompt import chat_prompt, completion_prompt, responses_items


def _responses_prompt(doc: dict[str, Any]) -> str:
    system = doc.get("instructions")
    return chat_prompt(([{"role": "system", "content": system}] if system else [])
                       + responses_items(doc["input"]))


@dataclass(frozen=True)
class Generation:
    """A generation route: its request model and how to read its prompt
    from the validated document; ``chat``: the precise index renders it
    through the chat template."""

    model: type[BaseModel]
    prompt_of: Callable[[dict[str, Any]], str]
    chat: bool = False


ROUTES = {
    "/v1/chat/completions": Generation(ChatRequest, lambda d: chat_prompt(d["messages"]), True),
    "/v1/completions": Generation(CompletionRequest, lambda d: completion_prompt(d["prompt"])),
    RESPONSES_PATH: Generation(ResponsesRequest, _responses_prompt),
}


@dataclass
class Read:
    ctx: RequestContext
    body: bytes  # what goes upstream: the body, or it rewritten
    max_tokens: int | None


async def read(route: Generation, body: bytes, headers: Mapping[str, str],
               handlers: Handlers, tenant: str) -> Read:
    """The request ``body`` of ``route`` as the scheduler will know it;
    raises the ApiError its client gets instead."""
    body, doc, parsed = await handlers.read_json(body, route.model, tenant)
    if getattr(parsed, "previous_response_id", None) is not None:
        # the standalone router keeps Responses chains itself; here the
        # model server would have to, and the picker cannot yet send a
        # turn to the one that holds its chain
        raise ApiError(400, "previous_response_id is not served by the endpoint picker yet; "
                            "send the conversation in input", "previous_response_id")
    raw = client_id(headers, *SESSION_HEADERS)
    ctx = RequestContext(model=getattr(parsed, "model", None),
                         prompt=route.prompt_of(doc).encode("utf-8", "surrogatepass"),
                         session=None if raw is None else session_key(raw),
                         chat=doc if route.chat else None)
    return Read(ctx, body, requested_output(parsed))
