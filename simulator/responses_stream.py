"""The Responses API's event stream, as vLLM and OpenAI send it for
``stream: true``: created, in_progress, the message item and its text part
opened, text deltas, then everything closed and ``response.completed``
carrying the whole response. Each event is ``event: TYPE`` + ``data: JSON``."""

from __future__ import annotations

from typing import Any

import orjson


class ResponseEvents:
    """Numbers events in order (``sequence_number``) and formats them."""

    def __init__(self, response: dict[str, Any], item_id: str) -> None:
        self.response, self.item_id = response, item_id
        self.seq = 0

    def event(self, type_: str, **fields: Any) -> bytes:
        data = {"type": type_, "sequence_number": self.seq, **fields}
        self.seq += 1
        return b"event: " + type_.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _where(self) -> dict[str, Any]:
        return {"item_id": self.item_id, "output_index": 0, "content_index": 0}

    def opening(self) -> bytes:
        item = {"type": "message", "id": self.item_id, "status": "in_progress",
                "role": "assistant", "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return b"".join((
            self.event("response.created", response={**self.response, "status": "in_progress"}),
            self.event("response.in_progress",
                       response={**self.response, "status": "in_progress"}),
            self.event("response.output_item.added", output_index=0, item=item),
            self.event("response.content_part.added", part=part, **self._where())))

    def delta(self, text: str) -> bytes:
        return self.event("response.output_text.delta", delta=text, logprobs=[],
                          **self._where())

    def closing(self, final: dict[str, Any]) -> bytes:
        """``final`` is the completed response, with its one message item."""
        item = final["output"][0]
        part = item["content"][0]
        return b"".join((
            self.event("response.output_text.done", text=part["text"], logprobs=[],
                       **self._where()),
            self.event("response.content_part.done", part=part, **self._where()),
            self.event("response.output_item.done", output_index=0, item=item),
            self.event("response.completed", response=final)))

