"""A Responses turn as both edges begin and keep it
(``toposerve.router.responses.turn``), over the in-memory store, without
sockets: what the model server is sent, what the next turn reads back."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest

from toposerve.router.admission.flow_control import Classified
from toposerve.router.admission.usage import Answered
from toposerve.router.config import ResponsesStoreConfig
from toposerve.router.pool.endpoints import Endpoint
from toposerve.router.request import RequestContext
from toposerve.router.responses.store import MemoryStore
from toposerve.router.responses.turn import Turn, begin
from toposerve.wire.errors import ApiError
from toposerve.wire.openai import ResponsesRequest

pytestmark = pytest.mark.unit


@dataclass
class _Asked:
    tenant: str = "t"
    ctx: RequestContext | None = None
    max_tokens: int | None = None
    charges: list[Classified] = field(default_factory=list)
    answered: Answered | None = None
    output_tokens: int | None = None
    client_headers: dict[str, str] = field(default_factory=dict)
    body_size: int = 0


def _begin(store: MemoryStore, doc: dict[str, Any], tenant: str = "t", **cfg: Any) -> Turn:
    return asyncio.run(begin(store, ResponsesStoreConfig.model_validate(cfg),
                             ResponsesRequest.model_validate(doc), doc, tenant))


def _answer(text: str, output_tokens: int) -> dict[str, Any]:
    return {"id": "resp_upstream", "output": [{"type": "message", "content": [
        {"type": "output_text", "text": text}]}], "usage": {"output_tokens": output_tokens}}


def test_a_chain_is_sent_whole_and_linked() -> None:
    store = MemoryStore(ResponsesStoreConfig())
    ep = Endpoint("http://10.0.0.1:8000", revision="r1")
    first = _begin(store, {"model": "m", "input": "hello", "instructions": "be brief"})
    sent = orjson.loads(first.body)
    assert sent == first.doc and sent["store"] is False and "previous_response_id" not in sent
    assert sent["input"] == [{"type": "message", "role": "user", "content": "hello"}]
    assert first.prompt == "<|system|>be brief\n<|user|>hello\n"
    resp = first.whole(orjson.dumps(_answer("hi there", 2)), ep)
    assert resp["id"] == first.rid != "resp_upstream" and resp["previous_response_id"] is None
    asked = _Asked()
    asyncio.run(first.keep(store, asked, ep, ep, resp, "hi there"))
    assert asked.output_tokens == 2  # flow control settles on the answer's usage

    second = _begin(store, {"model": "m", "input": "and then?",
                            "previous_response_id": first.rid})
    assert [m["content"] for m in orjson.loads(second.body)["input"]] == [
        "hello", "hi there", "and then?"]
    assert (second.affinity, second.revision, second.earlier) == (ep.url, "r1", [first.rid])
    with pytest.raises(ApiError) as other:  # another tenant's turn does not exist
        _begin(store, {"model": "m", "input": "x", "previous_response_id": first.rid}, "u")
    assert other.value.status == 404


def test_unkept_turns_and_bad_answers() -> None:
    store = MemoryStore(ResponsesStoreConfig())
    ep = Endpoint("http://10.0.0.1:8000")
    turn = _begin(store, {"model": "m", "input": "x", "store": False})
    asyncio.run(turn.keep(store, _Asked(), ep, ep, _answer("y", 1), "y"))
    assert asyncio.run(store.get(turn.rid, "t")) is None
    for body in (b"[1]", b"not json"):
        with pytest.raises(ApiError) as bad:
            turn.whole(body, ep)
        assert (bad.value.status, bad.value.message) == (
            502, "upstream 10.0.0.1:8000 answered 200 with a body that is not a JSON object")


def test_a_long_chain_is_refused_before_it_is_assembled() -> None:
    store = MemoryStore(ResponsesStoreConfig())
    ep = Endpoint("http://10.0.0.1:8000")
    turn = _begin(store, {"model": "m", "input": "x" * 3000})
    asyncio.run(turn.keep(store, _Asked(), ep, ep, _answer("y", 1), "y"))
    with pytest.raises(ApiError) as long:
        _begin(store, {"model": "m", "input": "z", "previous_response_id": turn.rid},
               maxChainBytes=2000)
    assert long.value.status == 413 and "responses.maxChainBytes" in long.value.message
