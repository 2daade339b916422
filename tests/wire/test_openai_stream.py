"""P/D hand-over fields and SSE framing: the router's handling of what vLLM
and SGLang send, and the simulator's answers, against the same fixtures."""

from __future__ import annotations

import json
from typing import Any

import orjson

from router.admission.usage import Answered, output_tokens
from router.disaggregation.pairing import kv_params_of, prefill_body
from simulator.responses_stream import ResponseEvents
from tests.wire.conftest import FIXTURES, fixture_text, sse_events
from wire.errors import sse_error

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
    from simulator.config import SimConfig
    from simulator.engine import Job
    from simulator.server import SimServer

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
