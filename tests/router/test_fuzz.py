"""Thousands of malformed and hostile requests: the router answers each with
a 4xx (or a 200 when the mutation happened to be valid), never a 5xx, a
hang or a crash, and good traffic flowing beside them never fails."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.procs import MODEL, Proc, Procs

PATHS = ["/v1/chat/completions", "/v1/completions", "/v1/responses"]
VALID = {
    "/v1/chat/completions": {"model": MODEL, "max_tokens": 1,
                             "messages": [{"role": "user", "content": "hi"}]},
    "/v1/completions": {"model": MODEL, "prompt": "hi", "max_tokens": 1},
    "/v1/responses": {"model": MODEL, "input": "hi", "max_output_tokens": 1},
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False) | st.text(max_size=50),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner,
                                                                max_size=4),
    max_leaves=12)
fields = st.sampled_from(["model", "messages", "prompt", "input", "max_tokens", "stream",
                          "stream_options", "previous_response_id", "max_output_tokens",
                          "kv_transfer_params", "instructions", "store"])


@st.composite
def hostile(draw: st.DrawFn) -> tuple[str, bytes]:
    path = draw(st.sampled_from(PATHS))
    kind = draw(st.integers(0, 5))
    if kind == 0:
        return path, draw(st.binary(max_size=300))  # anything, broken UTF-8 included
    if kind == 1:
        return path, json.dumps(draw(json_values)).encode()
    base = dict(VALID[path])
    if kind == 2:  # one field replaced with anything
        base[draw(fields)] = draw(json_values)
    elif kind == 3:  # a field removed
        base.pop(draw(st.sampled_from(sorted(base))), None)
    elif kind == 4:  # a huge value
        base[draw(fields)] = "x" * draw(st.integers(10_000, 300_000))
    data = json.dumps(base).encode()
    if kind == 5:  # truncated valid JSON
        data = data[: draw(st.integers(0, len(data) - 1))]
    return path, data


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    procs = Procs(tmp_path_factory.mktemp("fuzz"))
    sims = [procs.sim(time_scale=0.001, max_model_len=131_072) for _ in range(2)]
    router = procs.router({"server": {"maxBodyBytes": 200_000}},
                          endpoints=[s.url for s in sims])
    try:
        yield router
    finally:
        procs.close()


@pytest.fixture(scope="module")
def good_traffic(target: Proc) -> Iterator[list[int]]:
    """Valid requests sent the whole time the fuzzing runs."""
    statuses: list[int] = []
    stop = threading.Event()

    def run() -> None:
        with httpx.Client(base_url=target.url, timeout=30) as c:
            i = 0
            while not stop.is_set():
                body = {**VALID["/v1/chat/completions"],
                        "messages": [{"role": "user", "content": f"good {i}"}]}
                statuses.append(c.post("/v1/chat/completions", json=body).status_code)
                i += 1

    t = threading.Thread(target=run, daemon=True)
    t.start()
    yield statuses
    stop.set()
    t.join(30)


@pytest.fixture(scope="module")
def http(target: Proc) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=target.url, timeout=10) as c:
        yield c


@settings(max_examples=2000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(hostile())
def test_hostile_requests_get_4xx(http: httpx.Client, good_traffic: list[int],
                                  case: tuple[str, bytes]) -> None:
    path, body = case
    r = http.post(path, content=body, headers={"Content-Type": "application/json"})
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        err = r.json()["error"]
        assert err["code"] == r.status_code and err["message"]


def test_good_traffic_never_failed(target: Proc, good_traffic: list[int]) -> None:
    assert good_traffic, "no good request was sent"
    assert set(good_traffic) == {200}
    assert target.popen.poll() is None  # the router is still up
