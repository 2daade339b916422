"""What a client sends is the client's word, never the router's: keys that
are not UTF-8, ids in headers past their bound, fields that would tell a
model server where to pull KV from. The router's HTTP app in this process,
in front of simulators in this process."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from tests.router.test_router_app import MODEL, completion, run, stack
from toposerve.router.config import FlowControlConfig

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


def _keys(tmp_path: Path, tenants: dict[str, list[str]]) -> dict[str, object]:
    """The flowControl section of a router whose keys name ``tenants``."""
    path = tmp_path / "keys.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "toposerve.io/v1", "kind": "APIKeys",
                                    "tenants": tenants}))
    return {"keys": {"file": str(path)}}


async def _raw(port: int, head: bytes, body: bytes) -> tuple[int, dict[str, object]]:
    """One request sent as bytes (what an HTTP client would refuse to
    send); its status and JSON body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                     + body)
        answer = await reader.read()
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), json.loads(rest.partition(b"\r\n\r\n")[2])


def test_a_key_that_is_not_utf8_is_a_401(tmp_path: Path) -> None:
    """Bytes that are no UTF-8 in the bearer token: the usual 401, and no
    traceback (it was a 500, logged, per request, before any key)."""
    async def go() -> None:
        async with stack([{}], {"flowControl": {"tenants": _keys(tmp_path, {"a": ["sk-a"]})}}
                         ) as s:
            port = s.client.server.port
            assert port is not None
            for key in (b"\xff\xfe", b"sk-\xc3", b"\xed\xa0\x80"):  # bad, cut, a surrogate
                status, body = await _raw(
                    port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                          b"Content-Type: application/json\r\nAuthorization: Bearer " + key
                          + b"\r\n", json.dumps(completion("hi")).encode())
                assert status == 401, body
                assert body["error"] == {"message": "Incorrect API key provided.",
                                         "type": "invalid_request_error", "param": None,
                                         "code": "invalid_api_key"}
            assert not [e for e in s.logs if e["log_level"] == "error"], s.logs
            ok = await s.client.post("/v1/completions", json=completion("hi"),
                                     headers={"Authorization": "Bearer sk-a"})
            assert ok.status == 200, await ok.text()

    run(go)


ID_HEADERS = ("x-llm-d-inference-fairness-id", "x-llm-d-inference-objective", "x-session-id",
              "x-llm-d-session-id")


def test_headers_that_name_flows_objectives_and_sessions_are_bounded() -> None:
    """A flow, objective or session id is a client's choice the router keeps
    (queues, tables): over 256 bytes, or not printable ASCII, it is a 400
    naming the header; at the bound it goes through."""
    async def go() -> None:
        async with stack([{}], {}) as s:
            port = s.client.server.port
            assert port is not None
            for name in ID_HEADERS:
                ok = await s.client.post("/v1/completions", json=completion("hi"),
                                         headers={name: "a" * 256})
                assert ok.status == 200, (name, await ok.text())
                for value in (b"a" * 257, b"caf\xc3\xa9", b"a\tb", b"\xff"):
                    status, body = await _raw(
                        port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                              b"Content-Type: application/json\r\n" + name.encode() + b": "
                              + value + b"\r\n", json.dumps(completion("hi")).encode())
                    assert status == 400, (name, value, body)
                    err = body["error"]
                    assert isinstance(err, dict)
                    assert err["param"] == name and name in err["message"], err
                    assert "256" in err["message"], err
            assert not [e for e in s.logs if e["log_level"] == "error"], s.logs

    run(go)


# a decode server told to take its KV from a remote prefill: the sim refuses
# these (no such KV), as a real engine would try to pull it from the host named
PULL = {"kv_transfer_params": {"do_remote_prefill": True, "remote_host": "10.0.0.66"}}
BOOTSTRAP = {"bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": 7}
BODIES = {"/v1/chat/completions": {"model": MODEL, "max_tokens": 2,
                                   "messages": [{"role": "user", "content": "hi"}]},
          "/v1/completions": completion("hi"),
          "/v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 2}}


def test_clients_do_not_choose_where_kv_comes_from(tmp_path: Path) -> None:
    """kv_transfer_params and SGLang's bootstrap_* fields are the router's to
    set: a client's never reach a model server, on a request the router does
    not split too, unless its tenant has passTransferFields."""
    tenants = {**_keys(tmp_path, {"plain": ["sk-plain"], "trusted": ["sk-trusted"]}),
               "tenants": [{"name": "trusted", "passTransferFields": True}]}

    async def go() -> None:
        async with stack([{"disaggregation_mode": "decode"}],
                         {"flowControl": {"tenants": tenants}}) as s:
            for path, body in BODIES.items():
                for fields in (PULL, BOOTSTRAP):
                    if fields is BOOTSTRAP and path == "/v1/responses":
                        continue  # SGLang's hand-over is for its chat and completions
                    asked = {**body, **fields}
                    r = await s.client.post(path, json=asked,
                                            headers={"Authorization": "Bearer sk-plain"})
                    assert r.status == 200, (path, fields, await r.text())
                    # the trusted tenant's reach the model server as sent: it refuses
                    # them (400), or fails to pull (500, a 502 from the router)
                    r = await s.client.post(path, json=asked,
                                            headers={"Authorization": "Bearer sk-trusted"})
                    assert r.status in (400, 502), (path, fields, await r.text())

    run(go)


def test_trusting_a_tenant_with_the_hand_over_needs_keys() -> None:
    """Without keys every client is the same nobody: none can be trusted."""
    with pytest.raises(ValidationError, match="passTransferFields needs keys"):
        FlowControlConfig.model_validate({"tenants": {"tenants": [
            {"name": "t", "passTransferFields": True}]}})
