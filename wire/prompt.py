"""The canonical prompt of a request: the bytes both the approximate
prefix index and the simulator's tokenizer see.

Chat messages are serialised so that turn N+1's prompt extends turn N's
bytes: each message becomes ``<|role|>content\\n`` and nothing depends on
what comes after it (no closing "assistant" header).
"""

from __future__ import annotations

from typing import Any

import orjson


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join([str(p.get("text") or p.get("input_text") or p.get("output_text") or "")
                        if isinstance(p, dict) else str(p) for p in content])
    return str(content)


def chat_prompt(messages: list[dict[str, Any]]) -> str:
    return "".join(f"<|{m.get('role', 'user')}|>{_content_text(m.get('content'))}\n"
                   for m in messages)


def completion_prompt(prompt: Any) -> str:
    """A prompt's text: token ids joined by spaces, a batch's prompts joined
    by nothing."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        if (text := _ids_text(prompt)) is not None:
            return text
        if all(isinstance(x, int) for x in prompt):
            return " ".join(map(str, prompt))
        if all(isinstance(x, str) for x in prompt):
            return "".join(prompt)
        return "".join(completion_prompt(x) for x in prompt)
    return str(prompt)


def _ids_text(prompt: list[Any]) -> str | None:
    """completion_prompt of a list of token ids or a batch of such lists, at
    C speed (a batch of 65,536 one-token prompts took the loop 38 ms a
    prompt at a time): orjson writes ids as digits and commas, so the text
    is its output with the commas made spaces and, in a batch, the joins
    between lists dropped. None when the prompt is anything else: orjson's
    output then holds other bytes (quotes, letters, a dot, a bracket left)."""
    try:
        raw = orjson.dumps(prompt)
    except orjson.JSONEncodeError:  # an id past 64 bits
        return None
    ids = raw[2:-2].replace(b"],[", b"") if raw.startswith(b"[[") else raw[1:-1]
    if ids.translate(None, b"0123456789-,"):
        return None
    return ids.replace(b",", b" ").decode()


def responses_items(input_: Any) -> list[dict[str, Any]]:
    """Responses API ``input`` (a string or a list of items) as chat messages."""
    if isinstance(input_, str):
        return [{"role": "user", "content": input_}]
    out = []
    for item in input_ or []:
        if isinstance(item, dict):
            if item.get("type") in (None, "message"):
                out.append({"role": item.get("role", "user"), "content": item.get("content")})
            elif item.get("type") == "function_call_output":
                out.append({"role": "tool", "content": item.get("output")})
    return out
