"""The candidate lists the pool and the filters reuse between requests
(``toposerve.router.pool.endpoints.CHANGES``): a change to the pool or to an
endpoint is seen by the very next request, a load sample that ages past
``stale_after_s`` counts as saturated with no new scrape, and the
candidates are always those the plain filters give."""

from __future__ import annotations

import asyncio
import random
import time

import pytest

from toposerve.router.config import RouterConfig
from toposerve.router.pool.endpoints import Endpoint, LoadSample
from toposerve.router.pool.saturation import saturated
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.profile import Scheduler
from toposerve.router.state import RouterState

pytestmark = pytest.mark.unit

STALE_AFTER = 30.0


def make(n: int = 4, detector: str = "metrics") -> tuple[RouterState, Scheduler]:
    state = RouterState(RouterConfig.model_validate({
        "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
        "discovery": {"static": [{"url": "http://e:1"}]},
        "scrape": {"intervalSeconds": 1, "timeoutSeconds": 1,
                   "staleAfterSeconds": STALE_AFTER},
        "flowControl": {"saturation": {"detector": detector, "maxConcurrency": 2}}}))
    for i in range(n):
        ep = state.pool.upsert(Endpoint(url=f"http://e{i}:8000", models=frozenset({"m"})))
        ep.healthy = True
        ep.load = LoadSample(at=time.monotonic())
    return state, Scheduler(state, state.config.profile, None)


def ctx(model: str | None = "m") -> RequestContext:
    return RequestContext(model=model, prompt=b"hello")


def urls(eps: list[Endpoint]) -> list[str]:
    return [e.url for e in eps]


def test_the_same_list_while_nothing_changes() -> None:
    state, sched = make()
    first = sched.candidates(ctx())
    assert sched.candidates(ctx()) is first
    assert state.pool.routable() is state.pool.routable()


def test_a_scrape_that_saturates_is_seen_by_the_next_request() -> None:
    state, sched = make()
    e0 = state.pool.get("http://e0:8000")
    assert e0 is not None and e0 in sched.candidates(ctx())
    e0.load = LoadSample(waiting=50, at=time.monotonic())  # what a scrape writes
    assert e0 not in sched.candidates(ctx())
    e0.load = LoadSample(waiting=0, at=time.monotonic())
    assert e0 in sched.candidates(ctx())


def test_a_stale_endpoint_is_dropped_with_no_new_scrape(monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    state, sched = make()
    now = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    eps = list(state.pool)
    for i, e in enumerate(eps):
        e.load = LoadSample(at=1000.0 - 10 * i)  # e3 the oldest
    assert urls(sched.candidates(ctx())) == urls(eps)
    now[0] = 1000.0 - 30 + STALE_AFTER  # e3 at its last fresh instant
    assert urls(sched.candidates(ctx())) == urls(eps)
    now[0] += 0.001  # e3 stale: saturated (fail closed), nothing scraped meanwhile
    assert urls(sched.candidates(ctx())) == urls(eps[:3])
    now[0] = 1000.0 + STALE_AFTER + 1  # all stale: the filter keeps them all
    assert urls(sched.candidates(ctx())) == urls(eps)
    eps[1].load = LoadSample(at=now[0])  # one scrape lands
    assert urls(sched.candidates(ctx())) == [eps[1].url]


def test_health_draining_models_and_membership_are_seen() -> None:
    state, sched = make()
    e0, e1, e2, e3 = list(state.pool)
    e0.healthy = False
    assert e0 not in sched.candidates(ctx())
    e0.healthy = True
    e1.draining = True
    assert urls(sched.candidates(ctx())) == urls([e0, e2, e3])
    assert e1 not in state.pool.routable()
    e2.models = frozenset({"other"})
    assert urls(sched.candidates(ctx())) == urls([e0, e3])
    assert urls(sched.candidates(ctx("other"))) == [e2.url]
    new = state.pool.upsert(Endpoint(url="http://e9:8000", models=frozenset({"m"}),
                                     healthy=True, load=LoadSample(at=time.monotonic())))
    assert new in sched.candidates(ctx())


def test_an_endpoint_drained_away_is_gone() -> None:
    state, sched = make()
    e0 = state.pool.get("http://e0:8000")
    assert e0 is not None and e0 in sched.candidates(ctx())
    asyncio.run(state.pool.drain(e0.url, 1.0))
    assert state.pool.get(e0.url) is None
    assert e0 not in sched.candidates(ctx()) and e0 not in state.pool.routable()


def test_the_concurrency_detector_reads_live_inflight_counts() -> None:
    state, sched = make(detector="concurrency")
    e0 = state.pool.get("http://e0:8000")
    assert e0 is not None and e0 in sched.candidates(ctx())
    e0.inflight = 2  # max concurrency: full, with no write the pool counts
    assert e0 not in sched.candidates(ctx())
    e0.inflight = 0
    assert e0 in sched.candidates(ctx())


def plain(state: RouterState, c: RequestContext) -> list[Endpoint]:
    """The default filters written plainly, asked afresh."""
    eps = [e for e in state.pool if not e.draining]
    eps = [e for e in eps if c.model is None or not e.models or c.model in e.models]
    eps = [e for e in eps if e.healthy and not e.draining]
    return [e for e in eps if not saturated(e, state.config)] or eps


@pytest.mark.parametrize("seed", range(3))
def test_candidates_are_the_plain_filters_answer(seed: int) -> None:
    """Random changes of every kind between requests: the reused lists never
    differ from a fresh look at the pool."""
    state, sched = make(12)
    rng = random.Random(seed)
    for step in range(400):
        e = rng.choice(list(state.pool))
        match rng.randrange(6):
            case 0:
                e.healthy = not e.healthy
            case 1:
                e.load = LoadSample(waiting=rng.choice([0, 0, 200]), at=time.monotonic()
                                    - rng.choice([0.0, 0.0, 2 * STALE_AFTER]))
            case 2:
                e.load = LoadSample(kv_usage=rng.random(), at=time.monotonic())
            case 3:
                e.models = rng.choice([frozenset({"m"}), frozenset({"n"}), frozenset()])
            case 4:
                e.draining = not e.draining
        c = ctx(rng.choice(["m", "n", None]))
        assert urls(sched.candidates(c)) == urls(plain(state, c)), f"step {step}"
