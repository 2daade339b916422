"""The simulator's /metrics, as vLLM and SGLang serve theirs (with
prometheus_client's ASGI app): only the series a ``name[]`` query names, and
gzip for a client that accepts it. Routers that scrape must cope with both."""

from __future__ import annotations

import gzip

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.procs import Procs

WAITING = {"vllm": "vllm:num_requests_waiting", "sglang": "sglang:num_queue_reqs"}


def _families(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)}


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_name_query_keeps_only_the_named_series(procs: Procs, dialect: str) -> None:
    sim = procs.sim(dialect=dialect)
    everything = httpx.get(sim.url + "/metrics")
    assert everything.status_code == 200
    assert len(_families(everything.text)) > 5
    names = [WAITING[dialect], "vllm:cache_config_info", "no_such_series"]
    some = httpx.get(sim.url + "/metrics", params=[("name[]", n) for n in names])
    assert some.status_code == 200
    want = {WAITING[dialect]} | ({"vllm:cache_config_info"} if dialect == "vllm" else set())
    assert _families(some.text) == want
    assert len(some.content) < len(everything.content) / 5


def test_gzip_only_when_the_client_accepts_it(procs: Procs) -> None:
    sim = procs.sim()
    plain = httpx.get(sim.url + "/metrics", headers={"Accept-Encoding": "identity"})
    assert "content-encoding" not in plain.headers
    assert "vllm:num_requests_running" in plain.text
    with httpx.stream("GET", sim.url + "/metrics",
                      headers={"Accept-Encoding": "gzip, deflate"}) as r:
        raw = b"".join(r.iter_raw())
    assert r.headers["content-encoding"] == "gzip"
    assert b"vllm:num_requests_running" in gzip.decompress(raw)
