"""Output tokens are charged at max_tokens when a request is admitted and
settled with the answer's real count when it ends: in the tenant's token
bucket and in least-attained fairness (injected clock), and through a real
router and simulator, where a stream its client leaves after a few tokens
gives the rest of its charge back."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import yaml
from multidict import CIMultiDict, CIMultiDictProxy

from harness.procs import MODEL, Procs
from harness.waiting import wait_for
from toposerve.router.admission.flow_control import Admission, Classified
from toposerve.router.admission.ratelimit import Bucket
from toposerve.router.admission.usage import Answered, output_tokens
from toposerve.router.config import RouterConfig
from toposerve.router.metrics import RouterMetrics
from toposerve.router.pool.endpoints import Endpoint, LoadSample
from toposerve.router.state import RouterState


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _admission(clock: Clock, **flow: Any) -> tuple[Admission, Endpoint]:
    cfg = RouterConfig.model_validate({
        "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
        "discovery": {"static": [{"url": "http://127.0.0.1:9"}]},
        "flowControl": {"enabled": True, "queueTTLSeconds": 5.0, **flow}})
    state = RouterState(cfg)
    ep = state.pool.upsert(Endpoint("http://127.0.0.1:9", healthy=True))
    return Admission(cfg.flow_control, state, RouterMetrics(state), clock=clock,
                     chance=lambda: 0.5), ep


def _headers(flow: str) -> CIMultiDictProxy[str]:
    return CIMultiDictProxy(CIMultiDict({"x-llm-d-inference-fairness-id": flow}))


def test_bucket_settles_either_way() -> None:
    b = Bucket(rate=10, burst=10)
    assert b.take(8, 0.0) and b.level == 2
    b.settle(-6, 0.0)  # took 8, cost 2
    assert b.level == 8
    b.settle(20, 0.5)  # cost 20 more than taken: debt, after half a second's refill
    assert b.level == -7
    b.settle(-100, 0.5)  # never above the burst
    assert b.level == 10


def test_output_counted_from_usage_or_events() -> None:
    body = b'{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":7}}'
    whole = Answered()
    whole.saw(body)
    assert output_tokens(whole) == 7
    stream = Answered()
    for chunk in [b'data: {"delta":{"role":"assistant","content":""}}\n\ndata: {"a":1}\n\n',
                  b'data: {"b":2}\n\n', b'data: {"c":3,"finish_reason":"length"}\n\n',
                  b"data: [DONE]\n\n"]:
        stream.saw(chunk)
    assert output_tokens(stream) == 3  # five events less chat's role chunk and [DONE]
    usage = Answered()
    for chunk in [b'data: {"a":1}\n\n', b'data: {"choices":[],"usage":{"completion_tokens":'
                                        b'41}}\n\n', b"data: [DONE]\n\n"]:
        usage.saw(chunk)
    assert output_tokens(usage) == 41  # the usage chunk just before [DONE]


def test_token_rate_settles_with_the_real_count() -> None:
    """20 tokens a second: a request charged 5 + 400 leaves a debt of 385;
    settled at 3 real tokens, the next one may go at once."""
    async def go() -> None:
        clock = Clock()
        adm, ep = _admission(clock, enabled=False,
                             tenants={"tenants": [{"name": "t", "tokensPerSecond": 20}]})
        first = adm.classify(_headers("x"), tenant="t", tokens=5, max_tokens=400)
        await adm.admit(first, lambda: [ep])
        second = adm.classify(_headers("x"), tenant="t", tokens=5, max_tokens=400)
        clock.t += 0.5
        try:
            await adm.admit(second, lambda: [ep])
            raise AssertionError("admitted in debt")
        except Exception as err:
            assert getattr(err, "status", None) == 429, err
        adm.settle(first, 3)
        await adm.admit(second, lambda: [ep])
        adm.settle(first, 3)  # settled once only
        bucket = adm.tenants._limits["t"].tokens
        assert bucket is not None
        # a split request's decode half: its prefill half was charged (the
        # bucket in debt now), so the tenant's limit neither refuses nor charges it
        level = bucket.level
        assert level < 0
        decode = adm.classify(_headers("x"), tenant="t", tokens=5, max_tokens=400)
        decode.follow_up = True
        await adm.admit(decode, lambda: [ep])
        adm.settle(decode, 3)
        assert bucket.level == level

    asyncio.run(go())


def _queue_and_release(adm: Admission, ep: Endpoint, reqs: list[Classified],
                       between: Any = None) -> list[str]:
    """Queues ``reqs`` on a full endpoint and lets them go one at a time;
    ``between(n)`` runs after the n-th went. Returns their flows in order."""
    async def go() -> list[str]:
        ep.load = LoadSample(waiting=100, at=time.monotonic())
        order: list[str] = []

        async def one(c: Classified) -> None:
            await adm.admit(c, lambda: [ep])
            order.append(c.flow)

        tasks = []
        for c in reqs:
            tasks.append(asyncio.create_task(one(c)))
            await asyncio.sleep(0)
        ep.load = LoadSample(waiting=0, at=time.monotonic())
        for n in range(len(reqs)):
            assert adm.release(1) == 1
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            if between is not None:
                between(n)
        await asyncio.gather(*tasks)
        return order

    return asyncio.run(go())


def test_least_attained_settles_the_output_estimate() -> None:
    """Flow a asks max_tokens 100 and flow b 50. Charged at the estimate,
    b goes twice in a row after a's first; once a's first answer is known
    to have had 10 tokens, a is the less served and goes next."""
    def run(settle: bool) -> list[str]:
        adm, ep = _admission(Clock(), fairness={"policy": "least-attained",
                                                "inputTokenWeight": 0})
        reqs = [adm.classify(_headers("a"), max_tokens=100),
                adm.classify(_headers("a"), max_tokens=100),
                adm.classify(_headers("b"), max_tokens=50),
                adm.classify(_headers("b"), max_tokens=50)]

        def between(n: int) -> None:
            if settle and n == 1:  # a1 and b1 have gone; a1's answer ends
                adm.settle(reqs[0], 10)

        return _queue_and_release(adm, ep, reqs, between)

    assert run(settle=False) == ["a", "b", "b", "a"]
    assert run(settle=True) == ["a", "b", "a", "b"]


def _keys(path: Path) -> None:
    path.write_text(yaml.safe_dump({"apiVersion": "toposerve.io/v1", "kind": "APIKeys",
                                    "tenants": {"t": ["sk-t"]}}))


def test_a_stream_left_early_gives_back_its_unused_tokens(procs: Procs,
                                                          tmp_path: Path) -> None:
    """A tenant at 20 tokens a second streams a 400-token answer and leaves
    after a few events. Charged at max_tokens it would be in debt for about
    20 s; settled with the events relayed, its next request goes at once."""
    keys = tmp_path / "keys.yaml"
    _keys(keys)
    sim = procs.sim(time_scale=1.0)  # slow tokens: the client leaves mid-answer
    router = procs.router({"flowControl": {"tenants": {
        "keys": {"file": str(keys)}, "tenants": [{"name": "t", "tokensPerSecond": 20}]}}},
        endpoints=[sim.url])
    auth = {"Authorization": "Bearer sk-t"}
    body = {"model": MODEL, "input": "hi", "max_output_tokens": 400, "stream": True}
    with httpx.Client(timeout=30) as c, c.stream("POST", router.url + "/v1/responses",
                                                 headers=auth, json=body) as r:
        assert r.status_code == 200
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("event: response.output_text.delta")
            if seen >= 3:
                break
    # charged 400 at admission, so without settling this is 429 for ~20 s
    after = time.monotonic()

    def admitted() -> bool:
        r = httpx.post(router.url + "/v1/responses", headers=auth, timeout=30,
                       json={"model": MODEL, "input": "hi", "max_output_tokens": 1})
        assert r.status_code in (200, 429), r.text
        return r.status_code == 200

    wait_for("the next request admitted", admitted, timeout=5, interval=0.2)
    assert time.monotonic() - after < 5
