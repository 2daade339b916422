"""What a generation request asks, read from the body a proxy streamed to
the picker: its model, prompt, session and output limit. The body is read
by the router's own HTTP handlers (``Handlers.read_json``: the body worker
for wide bodies, the same refusals in the same order, a client's KV
hand-over fields dropped), and a Responses turn is begun as the handlers
begin one (its chain read from the router's store, the whole conversation
sent on), so a request is routed the same whichever edge took it."""

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
from toposerve.router.responses.turn import Turn, begin
from toposerve.wire.openai import ChatRequest, CompletionRequest, ResponsesRequest
from toposerve.wire.prompt import chat_prompt, completion_prompt


@dataclass(frozen=True)
class Generation:
    """A generation route: its request model and how to read its prompt
    from the validated document (None: a Responses turn, whose prompt is
    the conversation its chain assembles); ``chat``: the precise index
    renders it through the chat template."""

    model: type[BaseModel]
    prompt_of: Callable[[dict[str, Any]], str] | None
    chat: bool = False


ROUTES = {
    "/v1/chat/completions": Generation(ChatRequest, lambda d: chat_prompt(d["messages"]), True),
    "/v1/completions": Generation(CompletionRequest, lambda d: completion_prompt(d["prompt"])),
    RESPONSES_PATH: Generation(ResponsesRequest, None),
}


@dataclass
class Read:
    ctx: RequestContext
    body: bytes  # what goes upstream: the body, or it rewritten
    max_tokens: int | None
    turn: Turn | None = None  # a Responses turn's, to stamp and store its answer


async def read(route: Generation, body: bytes, headers: Mapping[str, str],
               handlers: Handlers, tenant: str) -> Read:
    """The request ``body`` of ``route`` as the scheduler will know it;
    raises the ApiError its client gets instead."""
    body, doc, parsed = await handlers.read_json(body, route.model, tenant)
    turn = None
    if route.prompt_of is None:
        turn = await begin(handlers.store, handlers.cfg.responses, parsed, doc, tenant)
        prompt, body = turn.prompt, turn.body
    else:
        prompt = route.prompt_of(doc)
    raw = client_id(headers, *SESSION_HEADERS)
    ctx = RequestContext(model=getattr(parsed, "model", None),
                         prompt=prompt.encode("utf-8", "surrogatepass"),
                         session=None if raw is None else session_key(raw),
                         chat=doc if route.chat else None)
    if turn is not None:  # the chain's endpoint and revision preferred, as standalone
        ctx.affinity_url, ctx.revision = turn.affinity, turn.revision
    return Read(ctx, body, requested_output(parsed), turn)
