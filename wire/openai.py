"""The parts of OpenAI request bodies the router and the simulator read,
validated alike on both sides; every other field passes through (the
router hands it to the model server untouched).

Every list stops at its first invalid item (``fail_fast``): only the first
error is ever reported (``wire.errors.from_validation``), and a union tries
each of its lists in turn, so collecting every item's error cost a list of
n token ids the errors of n strings before it was read as ids (a 65,536
one-token prompt batch spent 22 ms of its 30 ms validation on errors no one
reads)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

# a list read up to its first invalid item (see the module's docstring)
FAIL_FAST = Field(fail_fast=True)


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
    content: StrictStr | Annotated[list[dict[str, Any]], FAIL_FAST] | None = None


class ChatRequest(_Req):
    messages: list[Message] = Field(min_length=1, fail_fast=True)
    max_tokens: StrictInt | None = Field(default=None, ge=0)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=0)


class CompletionRequest(_Req):
    prompt: (StrictStr | Annotated[list[StrictStr], FAIL_FAST]
             | Annotated[list[StrictInt], FAIL_FAST]
             | Annotated[list[Annotated[list[StrictInt], FAIL_FAST]], FAIL_FAST])
    max_tokens: StrictInt | None = Field(default=None, ge=0)


class ResponsesRequest(_Req):
    input: StrictStr | Annotated[list[dict[str, Any]], FAIL_FAST]
    previous_response_id: StrictStr | None = None
    instructions: StrictStr | None = None
    max_output_tokens: StrictInt | None = Field(default=None, ge=0)
    store: StrictBool | None = None


class TokenizeRequest(BaseModel):
    """vLLM's /tokenize: a completion prompt or chat messages, one of them."""

    model_config = ConfigDict(extra="allow")

    model: StrictStr | None = None
    prompt: StrictStr | None = None
    messages: list[Message] | None = Field(default=None, min_length=1, fail_fast=True)

    @model_validator(mode="after")
    def one_input(self) -> TokenizeRequest:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give either prompt or messages")
        return self


class DetokenizeRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: StrictStr | None = None
    tokens: list[StrictInt] = Field(fail_fast=True)
