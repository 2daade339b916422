"""How many output tokens an answer really had, so the flow controller can
settle what it charged at admission (``max_tokens``, or the configured
expectation) once the answer ends, however it ends.

The proxy records what it relayed on the request's exchange
(``Answered``): the number of SSE ``data:`` events and the last bytes; a stream it did not
see (none recorded) keeps the estimate. The answer's own usage
counts when it is there (a whole JSON body, a stream's usage chunk,
``response.completed``); otherwise a stream's token events are counted
(one event a token, as vLLM and SGLang stream them): its data events less
those that carry none, which are told by their bytes rather than by route,
since chat and completions, vLLM and SGLang frame a stream differently
(tests/wire/fixtures)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

# the limits on output a request may name, in the order they are read:
# chat's max_completion_tokens replaced max_tokens; the Responses API's
_LIMITS = ("max_completion_tokens", "max_tokens", "max_output_tokens")

# chat/completions: completion_tokens; the Responses API: output_tokens
_USAGE = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*(\d+)')
# a chat stream's opening chunk (one a choice) names the role, and no other
# chunk does (a key: a quote inside generated text is escaped)
_ROLE = b'"role":'
# a stream's last events that carry no token: data: [DONE]; SGLang's finish
# chunk (vLLM puts finish_reason on the last token's chunk)
_DONE = b"data: [DONE]"
_SGLANG_FINISH = b'"delta":{"reasoning_content":null},'


@dataclass
class Answered:
    """What the proxy relayed of one answer: ``events`` SSE data events (0
    for a whole body), ``roles`` chat role chunks among them, and its last
    bytes (the whole body, or a stream's last two chunks: a usage chunk or
    SGLang's finish chunk may come just before ``[DONE]``)."""

    events: int = 0
    roles: int = 0
    prev: bytes = b""
    last: bytes = b""

    def saw(self, chunk: bytes) -> None:
        # on the hot path: two scans of the chunk, no parsing
        self.events += chunk.count(b"data:")
        self.roles += chunk.count(_ROLE)
        self.prev, self.last = self.last, chunk


def output_tokens(answered: Answered) -> int:
    """The answer's output tokens: its usage if it says, else its counted
    token events."""
    tail = answered.prev + answered.last
    found = _USAGE.findall(tail)
    if found:
        return int(found[-1])
    framing = answered.roles + tail.count(_DONE) + tail.count(_SGLANG_FINISH)
    return max(0, answered.events - framing)


def responses_output(resp: dict[str, Any]) -> int | None:
    """A Responses-API answer's ``usage.output_tokens``, if it says."""
    usage = resp.get("usage")
    n = usage.get("output_tokens") if isinstance(usage, dict) else None
    return n if isinstance(n, int) else None


def requested_output(parsed: object) -> int | None:
    """The most output tokens a validated request allows, if it names any."""
    for name in _LIMITS:
        n = getattr(parsed, name, None)
        if isinstance(n, int):
            return n
    return None
