"""Chat requests tokenized as the engine does: toposerve.wire.chat_template against
transformers' apply_chat_template (what vLLM calls) on tokenizer files the
test writes, a Llama-3-shaped and a ChatML (Qwen) shaped template."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from toposerve.router.prefix.index import PrefixIndex
from toposerve.router.prefix.kv_index import KVIndex
from toposerve.router.request import RequestContext
from toposerve.wire.chat_template import (
    NO_TEMPLATE,
    RENDER_ERROR,
    ChatTemplate,
    chat_text,
    convert_messages,
    load_chat_template,
)
from toposerve.wire.hashing import token_block_hashes
from toposerve.wire.kv_events import BlockStored
from toposerve.wire.tokens import HFTokenizer

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

BLOCK = 4

LLAMA3 = """{{- bos_token }}
{%- if custom_tools is defined %}{%- set tools = custom_tools %}{%- endif %}
{%- if not date_string is defined %}{%- set date_string = "26 Jul 2024" %}{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\\n\\n" }}
{%- if tools is not none %}{{- "Environment: ipython\\n" }}{%- endif %}
{{- "Today Date: " + date_string + "\\n\\n" }}
{%- if tools is not none %}
    {{- "You have access to the following functions.\\n\\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\\n\\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'
            + message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\\n\\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

CHATML = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\\n\\n' }}
    {%- endif %}
    {{- "# Tools\\n\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if content %}
            {{- '\\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '\\n<tool_call>\\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {{- tool_call.arguments | tojson }}
                {{- '}\\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
            "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
CORPUS = ["You are a helpful assistant.", "What is the weather in Paris today?",
          "Call get_weather with the city.", '{"name": "get_weather", "arguments": {}}',
          "The KV cache holds prefix blocks of the prompt.", "tool_response tools system user"]


def write_model(tmp: Path, template: str | list[dict[str, str]], bos: str | None) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(
        vocab_size=400, special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tmp.mkdir(parents=True, exist_ok=True)
    tok.save(str(tmp / "tokenizer.json"))
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast",
                              "eos_token": {"__type": "AddedToken", "content": "<|eot_id|>",
                                            "special": True},
                              "chat_template": template}
    if bos is not None:
        config["bos_token"] = bos
    (tmp / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp / "tokenizer.json"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {"llama3": write_model(root / "llama3", LLAMA3, "<|begin_of_text|>"),
            "chatml": write_model(root / "chatml", [{"name": "default", "template": CHATML}],
                                  None)}


def oracle(tokenizer_json: Path, request: dict[str, Any]) -> list[int]:
    """transformers on the messages as vLLM hands them over (string
    content, tool-call arguments as objects)."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast.from_pretrained(str(tokenizer_json.parent))
    out = hf.apply_chat_template(convert_messages(request["messages"], False),
                                 tools=request.get("tools"), add_generation_prompt=True,
                                 tokenize=True, return_dict=False)
    return list(out)


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather <in> a city & more",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
text = st.text(st.characters(codec="utf-8"), max_size=40)
user = st.builds(lambda c: {"role": "user", "content": c}, text)
parts = st.builds(lambda a, b: {"role": "user", "content": [{"type": "text", "text": a},
                                                           {"type": "text", "text": b}]},
                  text, text)
assistant = st.builds(lambda c: {"role": "assistant", "content": c}, text)
call = st.builds(lambda city: {"role": "assistant", "content": None, "tool_calls": [
    {"id": "c1", "type": "function",
     "function": {"name": "get_weather", "arguments": json.dumps({"city": city})}}]}, text)
tool = st.builds(lambda c: {"role": "tool", "tool_call_id": "c1", "content": c}, text)
conversation = st.builds(
    lambda system, turns, tools: {
        "messages": ([{"role": "system", "content": system}] if system is not None else [])
        + [m for t in turns for m in t], **({"tools": [WEATHER]} if tools else {})},
    st.none() | text,
    st.lists(st.tuples(user | parts, assistant) | st.tuples(user, call, tool), min_size=1,
             max_size=4).map(lambda ts: [*ts[:-1], ts[-1][:1]]),
    st.booleans())


@pytest.mark.parametrize("name", ["llama3", "chatml"])
@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=conversation)
def test_tokens_and_keys_equal_transformers(models: dict[str, Path], name: str,
                                            request: dict[str, Any]) -> None:
    path = models[name]
    template = load_chat_template(str(path))
    rendered, reason = chat_text(template, request)
    assert reason is None
    ours = HFTokenizer(str(path)).encode(rendered)
    theirs = oracle(path, request)
    assert ours == theirs
    assert token_block_hashes(ours, BLOCK) == token_block_hashes(theirs, BLOCK)


def test_template_errors_and_absence_fall_back(models: dict[str, Path], tmp_path: Path) -> None:
    two_calls = {"messages": [{"role": "user", "content": "hi"}, {
        "role": "assistant", "tool_calls": [
            {"type": "function", "function": {"name": "a", "arguments": "{}"}}] * 2}]}
    template = load_chat_template(str(models["llama3"]))
    assert chat_text(template, two_calls)[1] == RENDER_ERROR  # the template's raise_exception
    assert load_chat_template(str(tmp_path / "tokenizer.json")) is None
    assert chat_text(None, two_calls)[1] == NO_TEMPLATE


def test_jinja_file_wins_and_special_tokens(tmp_path: Path) -> None:
    path = write_model(tmp_path, "unused", "<|begin_of_text|>")
    (tmp_path / "chat_template.jinja").write_text(
        "{{ bos_token }}{{ eos_token }}{% for m in messages %}{{ m.content }}{% endfor %}")
    template = load_chat_template(str(path))
    assert isinstance(template, ChatTemplate)
    assert template.render({"messages": [{"role": "user", "content": "x"}]}) == (
        "<|begin_of_text|><|eot_id|>x")


def test_content_parts_kept_for_templates_that_loop_over_them() -> None:
    loops = ChatTemplate("{% for m in messages %}{% for p in m.content %}[{{ p.type }}]"
                         "{% endfor %}{% endfor %}", {})
    request = {"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "u"}}]}]}
    assert loops.render(request) == "[text][image]"
    flat = ChatTemplate("{% for m in messages %}{{ m.content }}{% endfor %}", {})
    assert flat.render(request) == "<##IMAGE##>\na"


@pytest.mark.parametrize("name", ["llama3", "chatml"])
def test_precise_index_hits_the_second_turn(models: dict[str, Path], name: str) -> None:
    """The engine stored turn one's blocks (KV events of its tokens); the
    router's keys for turn two start with them."""
    path = models[name]
    first = {"messages": [{"role": "system", "content": "You are a helpful assistant."},
                          {"role": "user", "content": "What is the weather in Paris today?"}]}
    engine = oracle(path, first)
    second = {"messages": [*first["messages"],
                           {"role": "assistant", "content": "Call get_weather with the city."},
                           {"role": "user", "content": "And the KV cache?"}]}
    fallbacks: list[str] = []
    kv = KVIndex(PrefixIndex(), HFTokenizer(str(path)), BLOCK, load_chat_template(str(path)),
                 fallbacks.append)
    full = len(engine) // BLOCK * BLOCK
    kv.apply("http://e", [BlockStored(block_hashes=list(range(full // BLOCK)),
                                      parent_block_hash=None, token_ids=engine[:full],
                                      block_size=BLOCK)])
    ctx = RequestContext(model=None, prompt=b"", chat=second)
    matched = kv.index.match(kv.request_keys(ctx), ["http://e"])["http://e"]
    # the generation prompt of turn one is not turn two's: all but its last block
    assert matched >= (full - BLOCK) // BLOCK > 0
    assert not fallbacks
    approx = KVIndex(PrefixIndex(), HFTokenizer(str(path)), BLOCK, None, fallbacks.append)
    approx.request_keys(RequestContext(model=None, prompt=b"x", chat=second))
    assert fallbacks == [NO_TEMPLATE]
