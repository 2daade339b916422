"""The endpoint picker's protocol messages and config checks, without
sockets (the wire itself is tests/router/test_epp.py, behind a real Envoy)."""

from __future__ import annotations

from typing import Any

import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from google.protobuf import struct_pb2

from toposerve.router.config import RouterConfig
from toposerve.router.epp import protocol
from toposerve.router.epp.fit import unfit

pytestmark = pytest.mark.unit


def _with_metadata(namespace: str, fields: dict[str, Any]) -> Any:
    s = struct_pb2.Struct()
    s.update(fields)
    return ext.ProcessingRequest(metadata_context=base_pb2.Metadata(
        filter_metadata={namespace: s}))


def test_subset_hint_as_a_string_or_a_list() -> None:
    key = protocol.SUBSET
    assert protocol.subset_of(ext.ProcessingRequest()) is None
    assert protocol.subset_of(_with_metadata(protocol.SUBSET_NAMESPACE, {"other": "x"})) is None
    assert protocol.subset_of(_with_metadata(protocol.SUBSET_NAMESPACE, {
        key: "10.0.0.1:8000, 10.0.0.2:8000,"})) == frozenset({"10.0.0.1:8000", "10.0.0.2:8000"})
    assert protocol.subset_of(_with_metadata(protocol.SUBSET_NAMESPACE, {
        key: ["10.0.0.1:8000", "[::1]:9000,10.0.0.3:1"]})) == frozenset({
        "10.0.0.1:8000", "[::1]:9000", "10.0.0.3:1"})
    # named but empty: no endpoint may take it (the picker answers 503)
    assert protocol.subset_of(_with_metadata(protocol.SUBSET_NAMESPACE, {key: []})) == (
        frozenset())
    assert protocol.served_of(_with_metadata(protocol.LB, {
        protocol.SERVED: "10.0.0.2:8000"})) == "10.0.0.2:8000"


def test_picked_sets_header_and_metadata_alike() -> None:
    r = protocol.picked(["10.0.0.1:8000", "10.0.0.2:8000"], 42, ["authorization"])
    common = r.request_headers.response
    assert common.clear_route_cache
    headers = {h.header.key: (h.header.raw_value, h.append_action)
               for h in common.header_mutation.set_headers}
    overwrite = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
    assert headers == {protocol.DESTINATION: (b"10.0.0.1:8000,10.0.0.2:8000", overwrite),
                       "content-length": (b"42", overwrite)}
    assert list(common.header_mutation.remove_headers) == ["authorization"]
    lb = r.dynamic_metadata.fields[protocol.LB].struct_value
    assert lb.fields[protocol.DESTINATION].string_value == "10.0.0.1:8000,10.0.0.2:8000"
    assert not protocol.picked(["10.0.0.1:8000"], None, []).request_headers.response \
        .header_mutation.remove_headers


def test_body_handed_back_in_pieces() -> None:
    body = bytes(range(256)) * 500  # 128,000 bytes: three pieces
    pieces = protocol.body_pieces("request_body", body, True)
    streamed = [p.request_body.response.body_mutation.streamed_response for p in pieces]
    assert [len(s.body) for s in streamed] == [62_000, 62_000, 4_000]
    assert b"".join(s.body for s in streamed) == body
    assert [s.end_of_stream for s in streamed] == [False, False, True]
    assert not protocol.body_pieces("response_body", body, False)[-1] \
        .response_body.response.body_mutation.streamed_response.end_of_stream
    (empty,) = protocol.body_pieces("response_body", b"", True)
    assert empty.response_body.response.body_mutation.streamed_response.end_of_stream


def test_answer_status_and_its_headers_answer() -> None:
    def answer(*headers: tuple[str, bytes]) -> Any:
        return ext.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=k, raw_value=v) for k, v in headers]))
    assert protocol.status_of(answer(("content-type", b"text/event-stream"),
                                     (":status", b"429"))) == 429
    assert protocol.status_of(answer(("content-type", b"text/plain"))) == 0
    named = protocol.answer_headers((("x-toposerve-endpoint", "10.0.0.1:8000"),))
    (h,) = named.response_headers.response.header_mutation.set_headers
    assert (h.header.key, h.header.raw_value) == ("x-toposerve-endpoint", b"10.0.0.1:8000")
    # built once a value: the same message each answer from that endpoint
    assert protocol.answer_headers((("x-toposerve-endpoint", "10.0.0.1:8000"),)) is named
    assert not protocol.answer_headers(()).response_headers.response.header_mutation.set_headers


def test_immediate_refusal() -> None:
    r = protocol.immediate(429, b'{"error": {}}', [("content-type", "application/json")])
    assert r.immediate_response.status.code == 429
    assert r.immediate_response.body == b'{"error": {}}'


def test_unfit_configs() -> None:
    def cfg(**doc: Any) -> RouterConfig:
        return RouterConfig.model_validate({"apiVersion": "toposerve.io/v1",
                                            "kind": "RouterConfig", **doc})

    assert unfit(cfg(discovery={"static": [{"url": "http://127.0.0.1:8000"},
                                           {"url": "http://[::1]:8001"}]})) is None
    why = unfit(cfg(discovery={"static": [{"url": "http://127.0.0.1:8000"},
                                          {"url": "http://localhost:8001"}]}))
    assert why is not None and why.startswith("discovery.static[1].url")
    why = unfit(cfg(discovery={"static": [{"url": "http://127.0.0.1:8000"}]},
                    disaggregation={"enabled": True}))
    assert why is not None and why.startswith("disaggregation.enabled")
