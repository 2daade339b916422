"""The scheduling pipeline over plain endpoints: no sockets, no servers."""

from __future__ import annotations

import time

import pytest

from router.config import RouterConfig
from router.endpoints import Endpoint, LoadSample
from router.scheduling.context import RequestContext
from router.scheduling.profile import Scheduler
from router.state import RouterState


def make_state(scorers: list[dict[str, object]] | None = None) -> RouterState:
    doc: dict[str, object] = {"apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
                              "discovery": {"static": [{"url": "http://e:1"}]}}
    if scorers is not None:
        doc["profile"] = {"scorers": scorers}
    state = RouterState(RouterConfig.model_validate(doc))
    for i in range(4):
        ep = state.pool.upsert(Endpoint(url=f"http://e{i}:8000", models=frozenset({"m"})))
        ep.healthy = True
        ep.load = LoadSample(at=time.monotonic())
    return state


def ctx(prompt: str) -> RequestContext:
    return RequestContext(model="m", prompt=prompt.encode())


LONG = "shared system prompt " * 2000


@pytest.mark.parametrize("scorers", [
    None,  # the default profile
    [{"type": "prefix-approx", "weight": 1}],
    [{"type": "prefill-cost", "weight": 1}],
])
def test_same_prefix_same_endpoint(scorers: list[dict[str, object]] | None) -> None:
    state = make_state(scorers)
    sched = Scheduler(state, state.config.profile, None)
    first = sched.schedule(ctx(LONG + "turn 1")).ranked[0]
    for turn in range(2, 6):
        d = sched.schedule(ctx(LONG + f"turn {turn}"))
        assert d.ranked[0] is first
        assert d.reason in ("prefix-approx", "prefill-cost")
    assert state.approx.held(first.url) > 0


def test_new_work_spreads_by_cache_room() -> None:
    state = make_state()
    sched = Scheduler(state, state.config.profile, None)
    chosen = {sched.schedule(ctx(f"session {i} " * 3000)).ranked[0].url for i in range(4)}
    assert len(chosen) == 4  # four unrelated sessions, four endpoints


def test_prefill_backlog_moves_work() -> None:
    state = make_state([{"type": "prefill-cost", "weight": 1}])
    sched = Scheduler(state, state.config.profile, None)
    home = sched.schedule(ctx(LONG + "a")).ranked[0]
    home.prefill_tokens = 10_000_000  # a huge backlog of prefill on the warm endpoint
    assert sched.schedule(ctx(LONG + "b")).ranked[0] is not home


def test_saturated_and_unhealthy_are_filtered() -> None:
    state = make_state()
    sched = Scheduler(state, state.config.profile, None)
    eps = list(state.pool)
    eps[0].healthy = False
    eps[1].load = LoadSample(waiting=50, at=time.monotonic())
    eps[2].load = LoadSample(at=0.0)  # never scraped: stale, counts as saturated
    for i in range(10):
        assert sched.schedule(ctx(f"p{i}")).ranked[0] is eps[3]
    eps[3].draining = True
    # all that is left is saturated: the filter keeps them rather than refuse
    assert sched.schedule(ctx("x")).ranked[0] in (eps[1], eps[2])


def test_conversations_spread_new_ones_and_expire() -> None:
    state = make_state([{"type": "conversations", "weight": 1,
                         "params": {"windowSeconds": 0.3}}])
    sched = Scheduler(state, state.config.profile, None)
    system = [f"system prompt of agent {i} " * 60 for i in range(5)]
    # four new conversations land on four endpoints
    first = [sched.schedule(ctx(system[i] + "task")).ranked[0].url for i in range(4)]
    assert len(set(first)) == 4
    scorer = sched.scorers[0][0]
    e0, e1 = (state.pool.get(u) for u in first[:2])
    assert e0 is not None and e1 is not None
    # more turns (and sub-agents) of one conversation are still one conversation
    for turn in range(5):
        scorer.picked(ctx(system[0] + f"task, turn {turn}"), e0)
    eps = state.pool.routable()
    assert len(set(scorer.score(ctx("y"), eps).values())) == 1
    scorer.picked(ctx(system[4] + "task"), e1)  # a fifth conversation
    assert scorer.score(ctx("y"), eps)[e1] == 2 / 3  # two against one
    # a known conversation is never pulled away from where it lives
    assert set(scorer.score(ctx(system[4] + "next turn"), eps).values()) == {1.0}
    time.sleep(0.35)  # past the window: all forgotten
    scorer.picked(ctx(system[0] + "task, again"), e0)
    # an idle conversation past the window is new again, pruned or not
    assert scorer.score(ctx(system[4] + "next turn"), eps)[e0] == 0.5
    scores = scorer.score(ctx("y"), eps)
    assert scores[e0] == 0.5 and scores[e1] == 1.0  # one against none


def test_near_prefill_scores_by_topology_tier() -> None:
    from router.scheduling.scorers import NearPrefillScorer
    from topology.model import DomainPath

    state = make_state()
    rack = {"zone": "z", "block": "b", "rack": "r"}
    prefill = Endpoint(url="http://p:1", path=DomainPath(**rack, nvlink="n0", host="h0"))
    decode = {
        "same-node": DomainPath(**rack, nvlink="n0", host="h0"),
        "nvlink": DomainPath(**rack, nvlink="n0", host="h1"),
        "rack": DomainPath(**rack, nvlink="n1", host="h2"),
        "other-block": DomainPath(zone="z", block="b2", rack="r", nvlink="n0", host="h3"),
        "unknown": None}
    eps = {name: Endpoint(url=f"http://{name}:1", path=path) for name, path in decode.items()}
    c = ctx("x")
    c.prefill = prefill
    scores = NearPrefillScorer(state).score(c, list(eps.values()))
    assert {n: scores[e] for n, e in eps.items()} == {
        "same-node": 1.0, "nvlink": 0.8, "rack": 0.6, "other-block": 0.2, "unknown": 0.0}
    c.prefill = None  # not a split request: no preference
    assert set(NearPrefillScorer(state).score(c, list(eps.values())).values()) == {0.0}
