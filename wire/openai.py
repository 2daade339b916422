"""The parts of OpenAI request bodies the router and the simulator read,
validated alike on both sides; every other field passes through (the
router hands it to the model server untouched)."""

from __future__ import annotations

from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")

    include_usage: StrictBool | None = None


class _Req(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr | None = None
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    kv_transfer_params: dict[str, Any] | None = None


class Message(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: StrictStr
    content: StrictStr | list[dict[str, Any]] | None = None


class ChatRequest(_Req):
    messages: list[Message] = Field(min_length=1)
    max_tokens: StrictInt | None = Field(default=None, ge=0)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=0)


class CompletionRequest(_Req):
    prompt: StrictStr | list[StrictStr] | list[StrictInt] | list[list[StrictInt]]
    max_tokens: StrictInt | None = Field(default=None, ge=0)


class ResponsesRequest(_Req):
    input: StrictStr | list[dict[str, Any]]
    previous_response_id: StrictStr | None = None
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=0)
    store: StrictBool | None = None


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: a completion prompt or chat messages, one of them."""

    model_config = ConfigDict(extra="allow")

    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[Message] | None = Field(default=None, min_length=1)

    @model_validator(mode="after")
    def one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr | None = None
    tokens: list[StrictInt]
