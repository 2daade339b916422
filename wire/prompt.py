"""The canonical prompt of a request: the bytes both the approximate
prefix index and the simulator's tokenizer see.

Chat messages are serialised so that turn N+1's prompt extends turn N's
bytes: each message becomes ``<|role|>content\\n`` and nothing depends on
what comes after it (no closing "assistant" header).
"""

from __future__ import annotations

from typing import Any


def _content_text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        parts = []
        for p in content:
            if isinstance(p, dict):
                parts.append(str(p.get("text") or p.get("input_text") or p.get("output_text")
                                 or ""))
            else:
                parts.append(str(p))
        return "".join(parts)
    return str(content)


def chat_prompt(messages: list[dict[str, Any]]) -> str:
    return "".join(f"<|{m.get('role', 'user')}|>{_content_text(m.get('content'))}\n"
                   for m in messages)


def completion_prompt(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        if all(isinstance(x, int) for x in prompt):
            return " ".join(map(str, prompt))
        return "".join(completion_prompt(x) for x in prompt)
    return str(prompt)


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
