"""The simulator held to vLLM: what both answer, reduced to the shape the
router and its users depend on, and every difference between the two that
is known and why. ``tests/engine/test_sim_vs_engine.py`` finds the
differences on a running vLLM and the simulator; any not listed in
``DIFFERENCES``, or listed and no longer there, fails it.
docs/simulator.md's table is ``table()`` (a unit test holds them equal).

A JSON answer is flattened to ``{path: leaf}``: a path names keys with dots
and list items with ``[]`` (the items of a list merged), a leaf is its JSON
type, and for fields whose value is the same on any server given the same
request (counts, ids of objects, finish reasons) the value too."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any, NamedTuple

# the values both servers must agree on, given the same request: the
# generated text, ids and times are each server's own
VALUED = {"object", "model", "finish_reason", "role", "type", "status", "index",
          "output_index", "content_index", "prompt_tokens", "completion_tokens",
          "total_tokens", "cached_tokens", "input_tokens", "output_tokens",
          "reasoning_tokens", "count", "max_model_len", "code", "param", "owned_by",
          "block_size", "lora_id", "medium", "group_idx", "stop_reason", "status_code",
          "content_type", "num_gpu_blocks", "frames", "events", "topic"}


class Difference(NamedTuple):
    where: str  # the request or answer compared
    field: str  # the path in it
    vllm: str  # its leaf at vLLM ("absent": none)
    sim: str  # at the simulator
    why: str = ""

    @property
    def key(self) -> tuple[str, str, str, str]:
        return self.where, self.field, self.vllm, self.sim

    def allows(self, found: tuple[str, ...]) -> bool:
        """Whether ``found`` (where, field, vLLM's, the simulator's) is this
        difference; each of the four is a shell-style pattern here (``*``),
        so one entry covers a field in every answer that has it."""
        return all(fnmatch.fnmatchcase(f, p) for f, p in zip(found, self.key, strict=True))


def leaf(key: str, value: Any) -> str:
    """A value's JSON type, with the value itself for a VALUED key."""
    if value is None:
        return "null"
    kind = {bool: "bool", int: "int", float: "float", str: "str", bytes: "bytes"}.get(
        type(value), type(value).__name__)
    if key in VALUED and not isinstance(value, float | bytes):
        return f"{kind} {value}"
    return kind


def flatten(value: Any, path: str = "", key: str = "") -> dict[str, str]:
    """``{path: leaf}`` of a decoded JSON (or msgpack) value; the items of a
    list are merged, differing leaves joined with ``|``."""
    if isinstance(value, dict):
        if not value:
            return {path: "{}"}
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{path}.{k}" if path else str(k), str(k)))
        return out
    if isinstance(value, list | tuple):
        if not value:
            return {path: "[]"}
        merged: dict[str, set[str]] = {}
        for item in value:
            for p, leaf_ in flatten(item, path + "[]", key).items():
                merged.setdefault(p, set()).add(leaf_)
        return {p: "|".join(sorted(leaves)) for p, leaves in merged.items()}
    return {path: leaf(key, value)}


def differences(where: str, vllm: dict[str, str], sim: dict[str, str]) -> set[tuple[str, ...]]:
    """Every path whose leaf differs between the two flattenings. A field
    one writes as null and the other leaves out is no difference: every
    OpenAI client reads the two alike (an optional field defaults to None),
    and vLLM writes dozens of its own that way."""
    def at(flat: dict[str, str], p: str) -> str:
        return flat.get(p, "null")

    return {(where, p, vllm.get(p, "absent"), sim.get(p, "absent"))
            for p in vllm.keys() | sim.keys() if at(vllm, p) != at(sim, p)}


def table(diffs: Iterable[Difference]) -> str:
    """docs/simulator.md's table of ``diffs``."""
    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    rows = ["| where | field | vLLM | simulator | why |", "|---|---|---|---|---|"]
    rows += [f"| {cell(d.where)} | `{cell(d.field)}` | `{cell(d.vllm)}` | `{cell(d.sim)}` | "
             f"{cell(d.why)} |" for d in diffs]
    return "\n".join(rows) + "\n"


# Every difference the comparison finds, and why it is allowed. Found on
# vLLM 0.32.0's CPU build with the tier's flags (harness.vllm.serve_args).
DIFFERENCES: list[Difference] = [
    Difference("*", "content_type", "application/json", "application/json; charset=utf-8",
               "aiohttp names the charset of JSON, FastAPI does not; both are UTF-8, and the "
               "router passes the header on as it is"),
    Difference("*", "content_type", "text/event-stream; charset=utf-8", "text/event-stream",
               "the same for SSE, the other way round"),
    Difference("*", "*system_fingerprint", "str", "absent",
               "vLLM 0.32 names its build in the last chunk and whole answers; no client "
               "or router reads it"),
    Difference("chat*", "*usage.prompt_tokens_details.created_cache_tokens", "int", "absent",
               "vLLM 0.32's count of the prompt tokens it wrote to its cache; the router and "
               "the tier read cached_tokens"),
    Difference("chat", "body.choices[].message.tool_calls", "absent", "[]",
               "vLLM 0.32 leaves an empty tool_calls out (v0.33, the simulator's fixtures, "
               "writes []); clients read both as no tool calls"),
    Difference("responses*", "*status", "str incomplete", "str completed",
               "vLLM says incomplete when max_output_tokens ends the answer; the simulator "
               "always stops there and still says completed, which tests through the router "
               "rely on (tests/router/test_openai_client.py, test_epp_responses.py)"),
    Difference("responses*", "*incomplete_details.reason", "str", "absent",
               "the same: vLLM's reason max_output_tokens"),
    Difference("n 2", "body.choices[].index", "int 0|int 1", "int 0",
               "the simulator answers one choice whatever n asks (it models a server's time, "
               "not sampling)"),
    Difference("n 2", "body.usage.completion_tokens", "int 4", "int 2",
               "the same: one choice's tokens"),
    Difference("n 2", "body.usage.total_tokens", "int 41", "int 39",
               "the same: one choice's tokens"),
    Difference("n 2", "body.usage.prompt_tokens_details.cached_tokens", "int 32", "int 0",
               "vLLM prefills the prompt once per choice, the second finding the first's "
               "full block cached"),
    Difference("prompt batch", "body.choices[].index", "int 0|int 1", "int 0",
               "the simulator answers a batch of prompts as one prompt, their texts joined: "
               "one choice"),
    Difference("prompt batch", "body.usage.completion_tokens", "int 4", "int 2",
               "the same: one choice's tokens"),
    Difference("prompt batch", "body.usage.total_tokens", "int 12", "int 10",
               "the same: one choice's tokens"),
    Difference("temperature a string", "body.error.param", "str body.temperature",
               "str temperature",
               "vLLM's own validation errors name the field by FastAPI's location; the "
               "simulator names it as the router's validation does (wire.errors)"),
    Difference("temperature a string", "body.error.type", "str Bad Request",
               "str BadRequestError",
               "the same: FastAPI's phrase there, OpenAI's error type in every other error "
               "of both"),
    Difference("metrics", "the router's name[] query", "every series*", "the named series",
               "vLLM 0.32's /metrics ignores name[] and sends every series (the router "
               "reads its few either way); the simulator filters as prometheus_client's "
               "app does"),
    Difference("metrics", "vllm:cache_config_info", "gauge {*block_size*num_gpu_blocks*}",
               "gauge {block_size,cache_dtype,enable_prefix_caching,engine,num_gpu_blocks}",
               "vLLM writes its whole cache config as labels; the simulator the ones the "
               "router reads (block_size, num_gpu_blocks, equal on both) and a few more"),
    Difference("metrics", "vllm:request_success", "counter {engine,finished_reason,model_name}",
               "counter {engine,model_name}",
               "the simulator's requests all finish by length; the tier and benchmarks sum "
               "over the label"),
    Difference("kv events", "BlockStored.kv_cache_spec_kind", "str", "absent",
               "vLLM 0.32's kind of KV-cache group; the simulator writes v0.33's fields "
               "(tests/wire/fixtures), and the router reads neither"),
]
