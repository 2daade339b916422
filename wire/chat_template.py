"""A chat request's prompt as the engine renders it: the model's own chat
template, with the semantics vLLM uses for /v1/chat/completions.

vLLM converts the OpenAI messages (``parse_chat_messages``: content parts
flattened to text, or kept as ``{"type": ...}`` parts for templates that
loop over them; tool-call arguments parsed to objects), then renders with
Hugging Face's ``apply_chat_template`` (a sandboxed jinja2 environment
with trim_blocks and lstrip_blocks, ``raise_exception``, HF's ``tojson``,
``strftime_now``, the special tokens as variables) and encodes the text
without adding special tokens again. Both the router's precise prefix
index and the simulator render here, so their token ids (and so their
block keys) are the engine's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

from toposerve.wire.prompt import chat_prompt

# Hugging Face's named special tokens, each a template variable
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                  "mask_token")
TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text", "refusal", "thinking"})
# vLLM's placeholders for media parts when the template takes strings
MEDIA_PLACEHOLDERS = {"image": "<##IMAGE##>", "audio": "<##AUDIO##>", "video": "<##VIDEO##>"}
MEDIA_PART_TYPES = {"image_url": "image", "input_image": "image", "image_embeds": "image",
                    "audio_url": "audio", "input_audio": "audio", "audio_embeds": "audio",
                    "video_url": "video", "video_embeds": "video"}
# the keyword arguments apply_chat_template takes itself; a request's
# chat_template_kwargs may not override the template's inputs with them
RESERVED_KWARGS = frozenset({"chat_template", "tokenize", "messages", "conversation", "tools",
                             "documents", "add_generation_prompt"})

# Why a chat request's tokens came from the approximate prompt instead
NO_TEMPLATE = "no_template"
RENDER_ERROR = "render_error"
UNSUPPORTED = "unsupported"


class ChatTemplateError(Exception):
    """The template could not be loaded, or refused (or failed on) a request."""


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # HF's: no HTML escaping (jinja's own tojson escapes <, >, &, ')
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class _Generation(jinja2.ext.Extension):
    """``{% generation %}`` (HF's assistant-mask marker) renders its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja reads it off the class)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Callable[[], str]) -> str:
        return caller()


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _loops_over_content(ast: jinja2.nodes.Template) -> bool:
    """Whether the template iterates a message's content (vLLM's "openai"
    content format: parts stay dicts) rather than printing it as a string."""
    message_vars = {loop.target.name for loop in ast.find_all(jinja2.nodes.For)
                    if isinstance(loop.target, jinja2.nodes.Name)
                    and any(n.name == "messages"
                            for n in [loop.iter, *loop.iter.find_all(jinja2.nodes.Name)]
                            if isinstance(n, jinja2.nodes.Name))}
    for loop in ast.find_all(jinja2.nodes.For):
        it = loop.iter
        if isinstance(it, jinja2.nodes.Name) and it.name == "content":
            return True
        if (isinstance(it, jinja2.nodes.Getattr) and it.attr == "content") or (
                isinstance(it, jinja2.nodes.Getitem) and isinstance(it.arg, jinja2.nodes.Const)
                and it.arg.value == "content"):
            node = it.node
            if isinstance(node, jinja2.nodes.Name) and node.name in message_vars:
                return True
    return False


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):  # an AddedToken written out: {"content": ..., ...}
        value = value.get("content")
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    special_tokens: Mapping[str, str]
    tool_source: str | None = None  # a "tool_use" template, for requests with tools

    def __post_init__(self) -> None:
        env = _environment()
        compiled = {}
        for src in {self.source, self.tool_source} - {None}:
            assert src is not None
            try:
                ast = env.parse(src)
                compiled[src] = (env.from_string(src), _loops_over_content(ast),
                                 frozenset(jinja2.meta.find_undeclared_variables(ast)),
                                 '"developer"' in src or "'developer'" in src)
            except jinja2.TemplateError as err:
                raise ChatTemplateError(f"chat template does not compile: {err}") from err
        object.__setattr__(self, "_compiled", compiled)

    def render(self, request: Mapping[str, Any]) -> str:
        """The prompt text of a chat request (its ``messages``, ``tools``,
        ``documents``, ``add_generation_prompt``, ``chat_template_kwargs``)."""
        if request.get("continue_final_message"):
            raise ChatTemplateError("continue_final_message is not rendered here")
        tools = request.get("tools")
        src = self.tool_source if tools and self.tool_source is not None else self.source
        template, openai_format, variables, developer = self._compiled[src]  # type: ignore[attr-defined]
        messages = convert_messages(request.get("messages") or [], openai_format)
        if not developer:
            messages = _developer_as_system(messages)
        extra = {k: v for k, v in (request.get("chat_template_kwargs") or {}).items()
                 if k in variables and k not in RESERVED_KWARGS}
        try:
            return str(template.render(
                **{**self.special_tokens, **extra}, messages=_alias_reasoning(messages),
                tools=tools or None, documents=request.get("documents"),
                add_generation_prompt=request.get("add_generation_prompt", True)))
        except Exception as err:  # a template's raise_exception, or its own bug
            raise ChatTemplateError(f"chat template failed: {err}") from err


def _text_of_part(part: Any) -> tuple[str, str | None]:
    """(kind, text): kind "text" or a media modality, "" to skip."""
    if isinstance(part, str):
        return "text", part
    if not isinstance(part, dict):
        return "", None
    kind = part.get("type", "text")
    if kind in TEXT_PART_TYPES:
        text = part.get(kind) if kind != "text" and kind in part else part.get("text")
        return ("text", text) if isinstance(text, str) else ("", None)
    return MEDIA_PART_TYPES.get(kind, ""), None


def _content(content: Any, openai_format: bool) -> Any:
    parts = [] if content is None else (
        [content] if isinstance(content, str) else list(content))
    parsed = [_text_of_part(p) for p in parts]
    if openai_format:
        return [{"type": "text", "text": t} if k == "text" else {"type": k}
                for k, t in parsed if k]
    texts = "\n".join(t for k, t in parsed if k == "text" and t is not None)
    media = [MEDIA_PLACEHOLDERS[k] for k, _ in parsed if k in MEDIA_PLACEHOLDERS]
    # vLLM puts a media part's placeholder before the text
    return "\n".join(media + ([texts] if texts else []))


def _arguments(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    if not raw:
        return {}
    try:
        parsed = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError:
        return {}  # vLLM coerces malformed arguments to {} so the chat goes on
    return parsed if isinstance(parsed, dict) else {}


def convert_messages(messages: list[dict[str, Any]], openai_format: bool
                     ) -> list[dict[str, Any]]:
    """OpenAI messages as vLLM hands them to the template."""
    out = []
    for m in messages:
        role = m.get("role", "user")
        msg: dict[str, Any] = {"role": role, "content": _content(m.get("content"),
                                                                 openai_format)}
        if role == "assistant":
            calls = m.get("tool_calls")
            if calls:
                msg["tool_calls"] = [
                    {**c, "function": {**c["function"],
                                       "arguments": _arguments(c["function"].get("arguments"))}}
                    if isinstance(c, dict) and isinstance(c.get("function"), dict) else c
                    for c in calls]
            if (reasoning := m.get("reasoning")) is not None:
                msg["reasoning"] = msg["reasoning_content"] = reasoning
        elif role == "tool":
            if "tool_call_id" in m:
                msg["tool_call_id"] = m["tool_call_id"]
            if isinstance(msg["content"], list) and all(p.get("type") == "text"
                                                        for p in msg["content"]):
                msg["content"] = "\n".join(p["text"] for p in msg["content"])
        if isinstance(m.get("name"), str):
            msg["name"] = m["name"]
        if role == "developer":
            msg["tools"] = m.get("tools")
        out.append(msg)
    return out


def _developer_as_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's rewrite for templates that know no "developer" role: each
    becomes a system message, all merged into one at the front."""
    if not any(m["role"] == "developer" for m in messages):
        return messages
    msgs = [{k: v for k, v in m.items() if k != "tools"} | {"role": "system"}
            if m["role"] == "developer" else m for m in messages]
    systems = [i for i, m in enumerate(msgs) if m["role"] == "system"]
    if systems == [0]:
        return msgs
    texts = []
    for i in systems:
        c = msgs[i]["content"]
        if isinstance(c, list):
            c = "\n".join(p["text"] for p in c if isinstance(p, dict) and "text" in p)
        if c:
            texts.append(c)
    return [{"role": "system", "content": "\n\n".join(texts)},
            *(m for m in msgs if m["role"] != "system")]


def _alias_reasoning(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """HF fills ``reasoning_content`` and ``thinking`` from any of the names."""
    out = []
    for m in messages:
        r = next((m[k] for k in ("reasoning_content", "thinking", "reasoning")
                  if m.get(k) is not None), None)
        out.append(m if r is None else {"thinking": r, **m, "reasoning_content": r})
    return out


def load_chat_template(tokenizer: str | None, template: str | None = None
                       ) -> ChatTemplate | None:
    """The chat template of the model whose ``tokenizer.json`` is at
    ``tokenizer``: its directory's ``chat_template.jinja``, else
    ``tokenizer_config.json``'s ``chat_template`` (a string, or a list of
    named templates: "default", and "tool_use" for requests with tools).
    ``template`` (a .jinja file) overrides it, as vLLM's --chat-template.
    None when there is none; special tokens come from the config."""
    if tokenizer is None and template is None:
        return None
    directory = os.path.dirname(os.path.abspath(tokenizer)) if tokenizer else None
    config: dict[str, Any] = {}
    if directory and os.path.isfile(path := os.path.join(directory, "tokenizer_config.json")):
        try:
            with open(path, encoding="utf-8") as f:
                config = json.load(f)
        except (OSError, ValueError) as err:
            raise ChatTemplateError(f"{path}: {err}") from err
    special = {k: t for k in SPECIAL_TOKENS if (t := _token_text(config.get(k))) is not None}
    source: str | None = None
    tool_source = None
    jinja_file = template or (os.path.join(directory, "chat_template.jinja")
                              if directory else None)
    if jinja_file and (template or os.path.isfile(jinja_file)):
        try:
            with open(jinja_file, encoding="utf-8") as f:
                source = f.read()
        except OSError as err:
            raise ChatTemplateError(f"{jinja_file}: {err}") from err
    else:
        named = config.get("chat_template")
        if isinstance(named, list):
            by_name = {t.get("name"): t.get("template") for t in named if isinstance(t, dict)}
            source, tool_source = by_name.get("default"), by_name.get("tool_use")
            if source is None:
                source, tool_source = tool_source, None
        elif isinstance(named, str):
            source = named
    if source is None:
        return None
    return ChatTemplate(source, special, tool_source)


def chat_text(template: ChatTemplate | None, request: Mapping[str, Any]
              ) -> tuple[str, str | None]:
    """The prompt text of a chat request and, when it is not the template's,
    why: then it is the approximate ``toposerve.wire.prompt.chat_prompt``."""
    if template is None:
        return chat_prompt(request.get("messages") or []), NO_TEMPLATE
    try:
        return template.render(request), None
    except ChatTemplateError:
        reason = UNSUPPORTED if request.get("continue_final_message") else RENDER_ERROR
        return chat_prompt(request.get("messages") or []), reason
