"""Valid request bodies as wide as the router serves: one of each shape a
body's values can take (many messages, one message's many content parts,
a prompt of token ids, a batch of one-token prompts, many Responses input
items), each holding at most server.maxJsonValues values and
server.maxListItems items, and as close to them as its shape allows. What
the router's event loop must still parse and read after the body worker has
vetted them (the abuse bench times it; tests/router/test_wide_bodies.py
checks how it is read)."""

from __future__ import annotations

from typing import Any

import orjson

from harness.procs import MODEL
from toposerve.router.config import RouterConfig, ServerConfig
from toposerve.router.http.app import Router
from toposerve.router.http.bodies import count_values
from toposerve.router.pool.static import load_static

PARTS = 4  # content parts a message (chat) or an input item (Responses)
_TEXT = {"type": "text", "text": "a"}  # 3 values
_ITEM_VALUES = 3 + 3 * PARTS  # the item, its role and content, its parts'
_HEAD_VALUES = 8  # the body, model, max_tokens (and store), the list's own


def at_limit(server: ServerConfig) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each shape's name (what is wide in it): its route and its document."""
    room = server.max_json_values - _HEAD_VALUES
    items = min(server.max_list_items, room // _ITEM_VALUES)
    chat = {"model": MODEL, "max_tokens": 1}
    shapes: dict[str, tuple[str, dict[str, Any]]] = {
        f"{items} messages of {PARTS} parts": ("/v1/chat/completions", {
            **chat, "messages": [{"role": "user", "content": [_TEXT] * PARTS}] * items}),
        f"a message of {room // 3} parts": ("/v1/chat/completions", {
            **chat, "messages": [{"role": "user", "content": [_TEXT] * (room // 3)}]}),
        f"{room} token ids": ("/v1/completions", {
            **chat, "prompt": list(range(room))}),
        f"{room // 2} one-token prompts": ("/v1/completions", {
            **chat, "prompt": [[7]] * (room // 2)}),
        f"{items} Responses items of {PARTS} parts": ("/v1/responses", {
            "model": MODEL, "max_output_tokens": 1, "store": False,
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}] * PARTS}]
            * items}),
    }
    for name, (_, doc) in shapes.items():
        assert count_values(doc, server.max_json_values) <= server.max_json_values, name
    return shapes


def encoded(server: ServerConfig) -> dict[str, tuple[str, bytes]]:
    """``at_limit``'s bodies as sent."""
    return {name: (path, orjson.dumps(doc)) for name, (path, doc) in at_limit(server).items()}


def reading_router() -> Router:
    """A router's parts, not serving, with one model server (never asked):
    its handlers read a body as a serving router's do (``read_json``, a
    real body worker that the caller closes: ``handlers.bodies.close()``)."""
    cfg = RouterConfig.model_validate({
        "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
        "discovery": {"static": [{"url": "http://127.0.0.1:9"}]}})
    router = Router(cfg)
    load_static(router.state.pool, cfg.discovery.static)  # a model it may serve
    return router
