"""Reading a request body costs what its values cost, no more: every list
of the request models stops at its first invalid item (a union's lists
were each read to the end, an error an item, before the next was tried),
and a prompt's text is made from token ids at C speed, the same text as
before."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from toposerve.wire.errors import from_validation
from toposerve.wire.openai import (
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    ResponsesRequest,
    TokenizeRequest,
)
from toposerve.wire.prompt import completion_prompt

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`

N = 5000  # items after the first bad one: each would have been an error


@pytest.mark.parametrize(("model", "doc", "first"), [
    # a batch whose 1st prompt is bad: list[str] and list[int] stop at item 0
    (CompletionRequest, {"prompt": [["x"]] + [[1]] * N}, "prompt.str"),
    # valid as a batch; the lists of strings and of ids fail at item 0
    (CompletionRequest, {"prompt": [[1]] * N + [[True]]}, "prompt.str"),
    (CompletionRequest, {"prompt": [1] + ["x"] * N}, "prompt.str"),
    (ChatRequest, {"messages": [{"role": "user", "content": [1] * N}]},
     "messages.0.content.str"),
    (ChatRequest, {"messages": [{}] * N}, "messages.0.role"),
    (ResponsesRequest, {"input": [1] * N}, "input.str"),
    (TokenizeRequest, {"messages": [{}] * N}, "messages.0.role"),
    (DetokenizeRequest, {"tokens": ["x"] * N}, "tokens.0"),
])
def test_lists_stop_at_their_first_invalid_item(model: type[BaseModel], doc: dict[str, Any],
                                                first: str) -> None:
    """One error a branch of a union at most, whatever the list's length,
    and the first error (the one a client is told) the same as when every
    item was read."""
    with pytest.raises(ValidationError) as info:
        model.model_validate(doc)
    assert info.value.error_count() <= 4, info.value.error_count()
    assert from_validation(info.value).param == first


def test_a_valid_batch_is_still_read_as_a_batch() -> None:
    prompts: list[Any] = ["hi", ["a", "b"], [1, 2], [[1], [2, 3]], [], [[]]]
    for prompt in prompts:
        assert CompletionRequest.model_validate({"prompt": prompt}).prompt == prompt


@pytest.mark.parametrize(("prompt", "text"), [
    ([1, -2, 30], "1 -2 30"),
    ([[1], [2, 3]], "12 3"),  # a batch's prompts joined by nothing
    ([[], [4]], "4"), ([[4], []], "4"), ([[], []], ""), ([], ""), ([[]], ""),
    ([2**64 - 1, -(2**63)], f"{2**64 - 1} {-(2**63)}"),
    ([2**70, 1], f"{2**70} 1"),  # past what orjson writes: the slow way
    ([True, 1], "True 1"),  # a bool is an int to Python, not to orjson
    (["a", "b"], "ab"), (["],[", "x"], "],[x"),
    ([1.5], "1.5"), ([[[1]]], "1"), ([1, [2]], "12"), ([[1], "x"], "1x"),
    ("plain", "plain"),
])
def test_prompt_text_from_token_ids(prompt: Any, text: str) -> None:
    assert completion_prompt(prompt) == text
