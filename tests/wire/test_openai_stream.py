"""P/D hand-over fields and SSE framing: the router's handling of what vLLM
and SGLang send, and the simulator's answers, against the same fixtures."""

from __future__ import annotations

import json
from typing import Any

import orjson

from tests.wire.conftest import FIXTURES, fixture_text, sse_events
from toposerve.router.admission.usage import Answered, output_tokens
from toposerve.router.disaggregation.pairing import kv_params_of, prefill_body
from toposerve.simulator.responses_stream import ResponseEvents
from toposerve.wire.errors import sse_error

KV: dict[str, Any] = json.loads((FIXTURES / "kv_transfer.json").read_text())


def test_prefill_request_is_vllms_proxy() -> None:
    body = orjson.loads(prefill_body({"model": "m", "prompt": "hi", "max_tokens": 9,
                                      "stream": True, "stream_options": {}}, "/v1/completions"))
    assert body["kv_transfer_params"] == KV["vllm_prefill_request"]
    assert (body["stream"], body["max_tokens"], "stream_options" in body) == (False, 1, False)


def test_prefill_answers_of_both_vllm_versions_are_handed_on_whole() -> None:
    for key in ("vllm_v0.11.0_prefill_answer", "vllm_v0.33.0_prefill_answer",
                "vllm_v0.33.0_prefill_answer_nothing_to_pull"):
        answer = orjson.dumps({"id": "cmpl-1", "choices": [], "kv_transfer_params": KV[key]})
        assert kv_params_of(answer) == KV[key], key


def test_simulator_prefill_answer_has_vllm_v0_33_keys() -> None:
    from toposerve.simulator.config import SimConfig
    from toposerve.simulator.engine import Job
    from toposerve.simulator.server import SimServer

    sim = SimServer(SimConfig())
    ours = sim._kv_response(Job(tokens=list(range(40)), max_tokens=1), "cmpl-1")
    theirs = KV["vllm_v0.33.0_prefill_answer"]
    assert set(theirs) - {"remote_blocks_expiry_time", "remote_registration_generation",
                          "transfer_mode"} <= set(ours)
    assert ours["remote_block_ids"] == [[0, 1, 2]]  # one list per KV-cache group


def test_a_usage_chunk_gives_the_output_tokens() -> None:
    answered = Answered()
    for ev in sse_events(fixture_text("vllm_v0.33.0_chat_stream.sse")):
        answered.saw(ev)
    assert output_tokens(answered) == 3


def _usage_chunk(events: list[bytes]) -> bytes:
    """A stream's usage chunk as vLLM sends it with include_usage (choices
    [] and usage, the stream's own object)."""
    first = orjson.loads(events[0][6:])
    return b"data: " + orjson.dumps({
        **{k: first[k] for k in ("id", "object", "created", "model")}, "choices": [],
        "usage": {"prompt_tokens": 12, "total_tokens": 15, "completion_tokens": 3}}) + b"\n\n"


def _streams() -> dict[str, list[bytes]]:
    """Each engine's stream of three tokens, with and without a usage chunk."""
    out: dict[str, list[bytes]] = {}
    for name in ("vllm_v0.33.0_chat_stream.sse", "vllm_v0.33.0_completion_stream.sse",
                 "sglang_v0.5.23_chat_stream.sse"):
        events = [e for e in sse_events(fixture_text(name)) if b'"usage"' not in e]
        out[name] = events
        out[name + " +usage"] = [*events[:-1], _usage_chunk(events), events[-1]]
    return out


def test_token_events_are_counted_without_a_usage_chunk() -> None:
    """Every engine's framing (vLLM chat: a role chunk; completions: none;
    SGLang chat: a role chunk and a finish chunk) leaves the token count,
    however the proxy's reads split or join the events."""
    for name, events in _streams().items():
        per_event, whole = Answered(), Answered()
        for ev in events:
            per_event.saw(ev)
        whole.saw(b"".join(events))
        assert (output_tokens(per_event), output_tokens(whole)) == (3, 3), name


def _framing(events: list[bytes]) -> list[tuple[str, object, object, bool, frozenset[str]]]:
    """Per event: what it is (its object, or [DONE]), the role it names, its
    finish_reason, whether it has usage, and its keys and its choice's."""
    out: list[tuple[str, object, object, bool, frozenset[str]]] = []
    for ev in events:
        assert ev.startswith(b"data: ") and ev.endswith(b"\n\n")
        if ev == b"data: [DONE]\n\n":
            out.append(("[DONE]", None, None, False, frozenset()))
            continue
        chunk = orjson.loads(ev[6:])
        choice = chunk["choices"][0] if chunk["choices"] else {}
        delta = choice.get("delta", {})
        out.append((chunk["object"], delta.get("role"), choice.get("finish_reason"),
                    "usage" in chunk, frozenset(chunk) | {f"choice.{k}" for k in choice}
                    | {f"delta.{k}" for k in delta}))
    return out


def _simulated(path: str, body: dict[str, Any]) -> list[bytes]:
    """The simulator's SSE events for one streamed request."""
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from toposerve.simulator.config import SimConfig
    from toposerve.simulator.server import build_app

    async def go() -> bytes:
        async with TestClient(TestServer(build_app(SimConfig(time_scale=0.01)),
                                         host="127.0.0.1")) as client:
            resp = await client.post(path, json={"model": SimConfig().names[0], **body})
            assert resp.status == 200, await resp.text()
            return await resp.read()

    raw = asyncio.run(go())
    return [e + b"\n\n" for e in raw.split(b"\n\n") if e]


def test_simulator_streams_frame_as_vllms() -> None:
    """Chat and completions, with and without include_usage: the same events
    in the same order as vLLM v0.33's, the role only on chat's first chunk,
    finish_reason only on the last token's, usage only on its own chunk; and
    the router counts the simulator's tokens right either way."""
    for name, path, body in (
            ("vllm_v0.33.0_chat_stream.sse", "/v1/chat/completions",
             {"messages": [{"role": "user", "content": "hi"}]}),
            ("vllm_v0.33.0_completion_stream.sse", "/v1/completions", {"prompt": "hi"})):
        for usage in (False, True):
            theirs = _streams()[name + (" +usage" if usage else "")]
            ours = _simulated(path, {**body, "max_tokens": 3, "stream": True,
                                     "stream_options": {"include_usage": usage}})
            assert _framing(ours) == _framing(theirs), (name, usage)
            answered = Answered()
            for ev in ours:
                answered.saw(ev)
            assert output_tokens(answered) == 3, (name, usage)


def test_error_mid_stream_is_vllms() -> None:
    stream = sse_events(fixture_text("vllm_v0.33.0_error_stream.sse"))
    theirs = next(orjson.loads(e[6:]) for e in stream if b'"error"' in e)
    assert stream[-1] == b"data: [DONE]\n\n"  # the stream still ends as usual
    ours = orjson.loads(sse_error(500, "Internal server error")[6:])
    assert ours == theirs


def test_simulator_responses_events_are_vllms() -> None:
    theirs = [orjson.loads(e.split(b"data: ", 1)[1])
              for e in sse_events(fixture_text("vllm_v0.33.0_responses_stream.sse"))]
    final = theirs[-1]["response"]
    ev = ResponseEvents({k: v for k, v in final.items() if k not in ("output", "usage")},
                        "msg_3c4d")
    raw = ev.opening() + ev.delta("Hi") + ev.delta("!") + ev.closing(final)
    ours = [orjson.loads(e.split(b"data: ", 1)[1]) for e in raw.split(b"\n\n") if e]
    assert [e["type"] for e in ours] == [e["type"] for e in theirs]
    assert [e["sequence_number"] for e in ours] == list(range(len(theirs)))
    for a, b in zip(ours, theirs, strict=True):
        assert set(a) == set(b), a["type"]
    assert all(e.startswith(b"event: ") for e in raw.split(b"\n\n") if e)
