"""Every HTTP edge of a real router process (and of the simulator behind
it) given hostile input: random JSON shapes on every OpenAI route, odd
methods, ids and query strings, bodies that broke parsers before, and
oversized headers. Each gets a 4xx with a JSON error (a 200 where the
mutation happened to be valid), never a 5xx or a hang; a credential in an
oversized header never reaches the router's log."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from urllib.parse import quote

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.procs import MODEL, Proc, Procs
from tests.fuzz.strategies import FUZZ, NASTY, json_values, methods, queries
from tests.router.hangup import connect

BODY_LIMIT = 300_000
POSTS = {
    "/v1/chat/completions": {"model": MODEL, "max_tokens": 1,
                             "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 1},
    "/v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 1},
}
ID_ROUTES = ["/v1/responses/{}", "/v1/responses/{}/input_items", "/v1/models/{}"]
GETS = ["/v1/models", "/health", "/ready", "/metrics"]
FIELDS = ["model", "messages", "prompt", "input", "max_tokens", "stream", "stream_options",
          "previous_response_id", "max_output_tokens", "kv_transfer_params", "instructions",
          "store", "n", "temperature", "tools", "logprobs", "seed", "user"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, Proc]]:
    procs = Procs(tmp_path_factory.mktemp("fuzz-router"))
    sim = procs.sim(time_scale=0.001, max_model_len=131_072)
    router = procs.router({"server": {"maxBodyBytes": BODY_LIMIT}}, endpoints=[sim.url])
    try:
        yield router, sim
    finally:
        procs.close()


@pytest.fixture(scope="module")
def router(stack: tuple[Proc, Proc]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack[0].url, timeout=10) as c:
        yield c


def _check(r: httpx.Response, json_error: bool = True) -> None:
    assert r.status_code < 500, (r.request.method, r.request.url, r.status_code, r.text[:300])
    if json_error and r.status_code >= 400 and r.request.method != "HEAD":
        err = r.json()["error"]
        assert err["code"] == r.status_code and err["message"], r.text[:300]


@st.composite
def post_bodies(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from(sorted(POSTS)))
    body = json.loads(json.dumps(POSTS[path]))
    kind = draw(st.integers(0, 4))
    if kind == 0:
        return path, draw(st.binary(max_size=200))
    if kind == 1:
        return path, json.dumps(draw(json_values)).encode()
    if kind == 2:  # fields replaced with anything: wrong types, huge numbers, nesting
        for f in draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=4)):
            body[f] = draw(json_values)
    elif kind == 3:  # inside a message
        msg = body.get("messages", [{}])[0]
        msg[draw(st.sampled_from(["role", "content", "name", "tool_calls"]))] = draw(json_values)
        body["messages"] = [msg]
    else:  # a value near the body limit
        body[draw(st.sampled_from(FIELDS))] = "x" * draw(st.integers(1, BODY_LIMIT + 1000))
    return path, json.dumps(body).encode()


@FUZZ
@given(post_bodies())
def test_openai_posts_get_4xx_json(router: httpx.Client, case: tuple[str, bytes]) -> None:
    path, body = case
    _check(router.post(path, content=body, headers={"Content-Type": "application/json"}))


ids = st.text(max_size=60) | st.sampled_from(["", "resp_", "resp_" + "0" * 4000, "..", "%00",
                                              "%ff%fe", MODEL, MODEL + "/x/y"])


@FUZZ
@given(st.sampled_from(ID_ROUTES + GETS + sorted(POSTS)), ids, methods, queries,
       st.binary(max_size=100) | st.sampled_from([b"", b"{}"]))
def test_every_route_method_id_and_query(router: httpx.Client, route: str, rid: str,
                                         method: str, query: str, body: bytes) -> None:
    path = route.format(quote(rid, safe="%")) if "{}" in route else route
    _check(router.request(method, path + query, content=body))


@pytest.mark.parametrize("path", sorted(POSTS))
def test_nasty_bodies(router: httpx.Client, path: str) -> None:
    for body in NASTY:
        for ctype in ("application/json", "text/plain", "application/json; charset=latin-1"):
            _check(router.post(path, content=body, headers={"Content-Type": ctype}))


def test_simulator_edges(stack: tuple[Proc, Proc]) -> None:
    """The model server's own edges (the router's upstream, a pod of its own
    in the local install): odd methods, queries and bodies, never a 5xx."""
    with httpx.Client(base_url=stack[1].url, timeout=10) as c:
        for path in ["/health", "/ready", "/metrics", "/v1/models", *POSTS]:
            for method in ("GET", "POST", "PUT", "DELETE", "OPTIONS", "HEAD"):
                for body in (b"", b"{}", NASTY[7], NASTY[-3]):
                    _check(c.request(method, path + "?a=%ff", content=body), json_error=False)


def _raw(url: str, request: bytes) -> bytes:
    """``request`` sent as is; the whole answer (it asks the server to close)."""
    s = connect(url, 10)
    try:
        s.sendall(request)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
        return out
    finally:
        s.close()


@pytest.mark.parametrize("size", [9_000, 70_000, 200_000])
def test_an_oversized_credential_stays_out_of_the_log(stack: tuple[Proc, Proc],
                                                      size: int) -> None:
    """A header line over maxHeaderBytes (8 KiB) gets the router's JSON 431;
    one over 64 KiB aiohttp's own plain-text 400, which may quote it back to
    the client that sent it. Neither the header nor a request line holding a
    key ever reaches the log."""
    proc = stack[0]
    secret = secrets.token_urlsafe(size)[:size]
    for req in (f"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                f"Authorization: Bearer {secret}\r\n\r\n",
                f"GET /v1/models?api_key={secret} HTTP/1.1\r\nHost: x\r\n"
                "Connection: close\r\n\r\n"):
        answer = _raw(proc.url, req.encode())
        status = int(answer.split(b" ", 2)[1])
        assert 400 <= status < 500, answer[:300]
    assert httpx.get(proc.url + "/health", timeout=10).status_code == 200
    log = proc.log.read_text(errors="replace")
    pieces = [secret[i:i + 12] for i in range(0, size - 12, 997)]
    leaked = [p for p in pieces if p in log]
    assert not leaked, f"{len(leaked)} pieces of the credential in the log"
    assert proc.popen.poll() is None
