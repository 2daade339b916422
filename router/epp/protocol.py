"""The endpoint-picker protocol over Envoy's external processing messages
(the Gateway API Inference Extension's proposal 004): what the picker reads
of a proxy's ``ProcessingRequest`` and the ``ProcessingResponse``s it
answers with. Pure functions over the protos (PyPI ``xds-protos``).

The proxy streams a request's headers and body, and later its answer's
headers and body, in ``FULL_DUPLEX_STREAMED`` mode: it forwards nothing
until the picker hands each piece back, so the picker answers the request
headers (with the picked endpoint) once the body is read, then hands the
body back, and hands each piece of the answer back as it sees it."""

from __future__ import annotations

from collections.abc import Iterable
from functools import lru_cache
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

# the picked endpoint(s): a request header the proxy's ORIGINAL_DST cluster
# reads, and the same value in the dynamic metadata of namespace LB
DESTINATION = "x-gateway-destination-endpoint"
LB = "envoy.lb"
# the endpoints the proxy allows (filter metadata it forwards), and the one
# that answered (filter metadata on the answer, where the proxy says)
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET = "x-gateway-destination-endpoint-subset"
SERVED = "x-gateway-destination-endpoint-served"
# a body handed back goes in pieces of at most this: some proxies take at
# most 64 KiB a streamed message
PIECE_BYTES = 62_000
STREAMED = processing_mode_pb2.ProcessingMode.FULL_DUPLEX_STREAMED
_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def headers_of(headers: Any) -> dict[str, str]:
    """An ``HttpHeaders`` message's headers by (lowercase) name, pseudo
    headers (``:path``, ``:status``) included; Envoy sends a value as
    ``raw_value`` bytes."""
    return {h.key: h.raw_value.decode("utf-8", "surrogateescape") if h.raw_value else h.value
            for h in headers.headers.headers}


def status_of(headers: Any) -> int:
    """An answer's ``:status`` (0 when it has none), read without taking
    its other headers apart."""
    for h in headers.headers.headers:
        if h.key == ":status":
            return int(h.raw_value or h.value or 0)
    return 0


def _string_values(value: struct_pb2.Value) -> list[str]:
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return [value.string_value]
    if kind == "list_value":
        return [v.string_value for v in value.list_value.values
                if v.WhichOneof("kind") == "string_value"]
    return []


def subset_of(request: Any) -> frozenset[str] | None:
    """The endpoints (``ip:port``) the proxy lets the request go to, or None
    when it names no subset. A proxy's header-to-metadata rule writes one
    string of addresses joined by commas, a control plane a list: both are
    read. An empty subset is a subset: no endpoint is eligible."""
    ns = request.metadata_context.filter_metadata.get(SUBSET_NAMESPACE)
    if ns is None or SUBSET not in ns.fields:
        return None
    return frozenset(a.strip() for s in _string_values(ns.fields[SUBSET])
                     for a in s.split(",") if a.strip())


def served_of(request: Any) -> str | None:
    """The endpoint the proxy says answered (it may have retried down the
    list), if it says."""
    ns = request.metadata_context.filter_metadata.get(LB)
    if ns is None or SERVED not in ns.fields:
        return None
    found = _string_values(ns.fields[SERVED])
    return found[0].split(",")[0].strip() if found else None


def streamed(request: Any) -> bool:
    """Whether the proxy streams the request body full duplex, as the
    picker needs; a proxy that does not say (an older Envoy) is taken at
    its word in the docs."""
    if not request.HasField("protocol_config"):
        return True
    return bool(request.protocol_config.request_body_mode == STREAMED)


def _set(headers: Iterable[tuple[str, str]]) -> list[Any]:
    # overwrite: a client's own x-gateway-destination-endpoint must not
    # steer the request, nor sit beside the picked one
    return [base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, raw_value=v.encode()),
                                       append_action=_OVERWRITE) for k, v in headers]


def picked(endpoints: list[str], body_bytes: int | None, remove: list[str]) -> Any:
    """The answer to the request headers: the endpoints, best first, in the
    header and in ``envoy.lb`` metadata (one value for both, as the protocol
    asks); the body's new length when it was read (it may have been
    rewritten); ``remove``: headers not to forward (a key the router
    checked). The route is computed again, now that the header is there."""
    value = ",".join(endpoints)
    set_headers = [(DESTINATION, value)]
    if body_bytes is not None:
        set_headers.append(("content-length", str(body_bytes)))
    meta = struct_pb2.Struct()
    meta.update({LB: {DESTINATION: value}})
    return ext.ProcessingResponse(
        request_headers=ext.HeadersResponse(response=ext.CommonResponse(
            header_mutation=ext.HeaderMutation(set_headers=_set(set_headers),
                                               remove_headers=remove),
            clear_route_cache=True)),
        dynamic_metadata=meta)


@lru_cache(maxsize=4096)
def answer_headers(set_headers: tuple[tuple[str, str], ...]) -> Any:
    """The answer to the response headers: they go on, with ``set_headers``.
    One message per value, built once (an endpoint's name, each answer):
    the caller sends it, never changes it."""
    return ext.ProcessingResponse(response_headers=ext.HeadersResponse(
        response=ext.CommonResponse(header_mutation=ext.HeaderMutation(
            set_headers=_set(set_headers)))))


def _piece(which: str, body: bytes, end: bool) -> Any:
    piece = ext.StreamedBodyResponse(body=body, end_of_stream=end)
    mutation = ext.CommonResponse(body_mutation=ext.BodyMutation(streamed_response=piece))
    return ext.ProcessingResponse(**{which: ext.BodyResponse(response=mutation)})


# what is sent often and always the same, built once (never changed):
# a body's empty last piece (Envoy ends most bodies with an empty chunk),
# and trailers handed back as they are
_ENDS = {which: _piece(which, b"", True) for which in ("request_body", "response_body")}
_TRAILERS = {which: ext.ProcessingResponse(**{which: ext.TrailersResponse()})
             for which in ("request_trailers", "response_trailers")}


def body_pieces(which: str, body: bytes, end: bool) -> list[Any]:
    """``body`` handed back (``which``: ``request_body`` or
    ``response_body``) in pieces of at most PIECE_BYTES; the last ends the
    stream when ``end``. An empty body is one empty piece (an end of stream
    must still be said)."""
    if len(body) <= PIECE_BYTES:  # most chunks: one piece
        return [_ENDS[which] if end and not body else _piece(which, body, end)]
    return [_piece(which, body[start:start + PIECE_BYTES], end and start + PIECE_BYTES >= len(body))
            for start in range(0, len(body), PIECE_BYTES)]


def trailers(which: str) -> Any:
    """Trailers (``request_trailers`` or ``response_trailers``) go on as
    they are."""
    return _TRAILERS[which]


def immediate(status: int, body: bytes, headers: list[tuple[str, str]]) -> Any:
    """The proxy answers the client itself with ``status`` and ``body``,
    sending nothing upstream."""
    return ext.ProcessingResponse(immediate_response=ext.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status), body=body,
        headers=ext.HeaderMutation(set_headers=_set(headers)),
        details=f"toposerve_endpoint_picker_{status}"))
