"""One Responses-API turn as the router serves it, whichever edge took the
request (the HTTP handlers, or the endpoint picker behind a proxy): the
chain before it read from the store and the whole conversation assembled
for the model server, which keeps nothing (``begin``); the answer given
the router's id for the turn (``Turn.stamp``, ``Turn.whole``) and stored
so the next turn can name it (``Turn.keep``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from toposerve.router.admission.usage import responses_output
from toposerve.router.config import ResponsesStoreConfig
from toposerve.router.exchange import Asked
from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.responses.store import ResponsesStore, new_id, read_chain
from toposerve.wire.errors import ApiError
from toposerve.wire.openai import ResponsesRequest
from toposerve.wire.prompt import chat_prompt, responses_items


@dataclass
class Turn:
    """A turn on its way: what goes upstream, what the scheduler is told,
    and what is stored once it is answered."""

    previous: str | None  # the client's previous_response_id
    input: Any  # the client's own input: what the turn stores
    stored: bool  # the client did not ask store: false
    earlier: list[str]  # the chain's turns before it, oldest first
    doc: dict[str, Any]  # what the model server gets: the whole conversation
    body: bytes  # the same, serialized
    prompt: str  # what the scheduler knows of it, instructions included
    affinity: str | None  # the endpoint (url) that served the chain's last turn
    revision: str | None  # the revision the chain was served in
    rid: str = field(default_factory=new_id)  # the router's id, whatever the upstream's

    def stamp(self, resp: dict[str, Any]) -> None:
        """The answer as the client must see it: the turn's id and its
        chain's link (the model server saw a conversation, not a chain)."""
        resp["id"], resp["previous_response_id"] = self.rid, self.previous

    def whole(self, body: bytes, served: Endpoint) -> dict[str, Any]:
        """A whole (not streamed) 200 answer of ``served``, stamped; 502 when
        it is not a JSON object (the upstream's fault, not the client's)."""
        try:
            resp = orjson.loads(body)
        except orjson.JSONDecodeError:
            resp = None
        if not isinstance(resp, dict):
            raise ApiError(502, f"upstream {served.name} answered 200 with a body that is not "
                                "a JSON object")
        self.stamp(resp)
        return resp

    async def keep(self, store: ResponsesStore, asked: Asked, home: Endpoint, served: Endpoint,
                   resp: dict[str, Any], text: str) -> None:
        """The answered turn (``resp``, its text ``text``) stored for
        ``asked``'s tenant, unless the client asked not to; ``home``: the
        endpoint the next turn prefers (a split request's prefill endpoint,
        which holds the prefix), ``served``: the one that answered. Flow
        control settles on the answer's own usage."""
        if (n := responses_output(resp)) is not None:
            asked.output_tokens = n
        if self.stored:
            # its own input and output, and a link to the turn before: never the chain
            await store.put(self.rid, {
                "endpoint": home.url, "response": resp, "revision": served.revision or "",
                "previous": self.previous, "input": self.input,
                "output": {"role": "assistant", "content": text}}, asked.tenant, self.earlier)


async def begin(store: ResponsesStore, cfg: ResponsesStoreConfig, req: ResponsesRequest,
                doc: dict[str, Any], tenant: str) -> Turn:
    """The turn that ``req`` (validated from ``doc``) of ``tenant`` asks
    for, its chain read and the conversation assembled; raises the
    ApiError its client gets (an unknown or another tenant's
    ``previous_response_id`` is 404, a chain too long 400 or 413)."""
    history: list[dict[str, Any]] = []
    earlier: list[str] = []
    affinity = revision = None
    if req.previous_response_id is not None:
        chain = await read_chain(store, req.previous_response_id, tenant, cfg.max_chain_turns,
                                 cfg.max_chain_bytes)
        if chain is None:
            raise ApiError(404, f"Response with id '{req.previous_response_id}' not found.",
                           "previous_response_id")
        earlier, turns = chain
        history = [m for t in turns for m in [*responses_items(t["input"]), t["output"]]]
        affinity, revision = turns[-1]["endpoint"], turns[-1].get("revision")
    conversation = history + responses_items(doc["input"])
    upstream = {k: v for k, v in doc.items() if k != "previous_response_id"}
    upstream.update(input=[{"type": "message", "role": m["role"], "content": m["content"]}
                           for m in conversation], store=False)
    msgs = ([{"role": "system", "content": req.instructions}] if req.instructions else []
            ) + conversation
    return Turn(req.previous_response_id, doc["input"], req.store is not False, earlier,
                upstream, orjson.dumps(upstream), chat_prompt(msgs), affinity, revision)
