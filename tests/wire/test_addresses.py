"""The address checks refuse only what cannot be dialled: every form a
model server, its KV events or a Redis is really reached at passes
(tests/cli/test_bad_environment.py has the refusals, through the command)."""

from __future__ import annotations

import pytest

from toposerve.router.config import ResponsesStoreConfig, StaticEndpoint
from toposerve.wire.addresses import dialable, zmq_endpoint

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8000", "http://[::1]:8000", "https://vllm.ns.svc.cluster.local",
    "http://pod-1:8000", "http://user:pw@10.0.0.5:8000", "http://localhost.",
    "http://vllm_0.internal:80",
])
def test_model_server_urls_that_pass(url: str) -> None:
    assert StaticEndpoint(url=url).url == url


@pytest.mark.parametrize("address", [
    "tcp://10.0.0.5:5557", "tcp://[fd00::5]:5557", "tcp://vllm-0.vllm.ns:5557",
    "ipc:///tmp/kv-events.sock",
])
def test_kv_event_endpoints_that_pass(address: str) -> None:
    assert zmq_endpoint(address) == address
    ep = StaticEndpoint.model_validate({"url": "http://h:1", "kvEvents": address,
                                        "kvEventsReplay": address})
    assert (ep.kv_events, ep.kv_events_replay) == (address, address)


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:6379/0", "redis://router:pw@redis.ns:6379/1", "rediss://redis:6380",
    "redis://redis", "unix:///var/run/redis.sock", "redis://[::1]:6379/",
])
def test_redis_urls_that_pass(url: str) -> None:
    store = ResponsesStoreConfig.model_validate({"backend": "redis", "redisUrl": url})
    assert store.redis_url == url


@pytest.mark.parametrize("url, why", [
    ("tcp://h", "no port"), ("tcp://999.1.1.1:5", "'999.1.1.1' is not a host name"),
    ("tcp://-h:5", "'-h' is not a host name"), ("tcp://h:65536", "the port is not a number"),
])
def test_what_dialable_says(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        dialable(url, port_required=True)
