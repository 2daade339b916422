"""Prompts on their way to an endpoint count as held there: requests that
share a prefix and arrive before the first is answered follow it."""

from __future__ import annotations

import pytest

from tests.router.pipeline import LONG, ctx, make_state
from toposerve.router.prefix.index import SENT_HOLD_S, PrefixIndex, common_prefix
from toposerve.router.scheduling.profile import Scheduler

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_common_prefix_of_chains() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert common_prefix([9], [1, 2]) == 0
    assert common_prefix([], [1]) == 0


def test_sent_prompt_is_held_until_settled() -> None:
    clock = Clock()
    idx = PrefixIndex(clock=clock)
    sent = idx.send("a", [1, 2, 3])
    assert sent is not None
    assert idx.match([1, 2, 9], ["a", "b"]) == {"a": 2, "b": 0}
    assert idx.held("a") == 0  # not cached yet: cache-room counts what is
    sent.settle()
    sent.settle()  # a second settle (failover, then the answer) is a no-op
    assert idx.match([1, 2, 9], ["a", "b"]) == {"a": 0, "b": 0}


def test_sent_and_cached_take_the_longer_match() -> None:
    idx = PrefixIndex()
    idx.add("a", [1, 2, 3, 4])
    idx.send("a", [1, 2])
    idx.send("b", [1, 2, 3])
    assert idx.match([1, 2, 3, 4, 5], ["a", "b"]) == {"a": 4, "b": 3}


def test_an_unanswered_prompt_is_forgotten_after_the_hold() -> None:
    clock = Clock()
    idx = PrefixIndex(clock=clock)
    idx.send("a", [1, 2])
    clock.now += SENT_HOLD_S + 1
    assert idx.match([1, 2], ["a"]) == {"a": 0}
    idx.send("b", [7])  # the next send sweeps it out
    assert list(idx._sent) == [7]


def test_requests_in_flight_together_follow_the_first() -> None:
    """An agent's turn and its sub-agents arrive at once: before the first
    is answered the others go where it went (the conversations and
    cache-room scorers would spread them, each prefilling the prefix cold)."""
    state = make_state()
    sched = Scheduler(state, state.config.profile, None)
    first = sched.schedule(ctx(LONG + "the turn"))
    # without the hold every endpoint would score alike: 6 random ties
    subs = [sched.schedule(ctx(LONG + f"sub-agent {k}")) for k in range(6)]
    assert all(d.ranked[0] is first.ranked[0] for d in subs)
    for d in (first, *subs):
        d.answered(d.ranked[0])
    assert not state.approx._sent  # every hold settled by its answer


def test_failover_answer_settles_the_hold_where_it_was_sent() -> None:
    state = make_state([{"type": "prefix-approx", "weight": 1}])
    sched = Scheduler(state, state.config.profile, None)
    d = sched.schedule(ctx(LONG))
    sent_to, answered_by = d.ranked[0], d.ranked[1]
    d.answered(answered_by)  # the first failed; the next answered
    keys = ctx(LONG).byte_blocks(1024)
    m = state.approx.match(keys, [sent_to.url, answered_by.url])
    assert m == {sent_to.url: 0, answered_by.url: len(keys)}


def test_a_burst_of_new_conversations_is_not_herded() -> None:
    """Eight new conversations routed before any is answered, one endpoint
    holding a little more than another (the other two far more): each
    counts the prompts already on their way to an endpoint as held there
    (cache-room), so they share the two roomiest between them instead of
    all going to the one that held less when the burst began."""
    state = make_state()
    e = sorted(state.pool.routable(), key=lambda ep: ep.url)
    state.approx.add(e[0].url, list(range(1, 101)))
    for far in e[2:]:
        state.approx.add(far.url, list(range(10_000, 20_000)))
    sched = Scheduler(state, state.config.profile, None)
    burst = [sched.schedule(ctx(f"conversation {k}: " + "its own words " * 3000))
             for k in range(8)]
    firsts = [d.ranked[0].url for d in burst]
    assert min(firsts.count(e[0].url), firsts.count(e[1].url)) >= 3, firsts
    for d in burst:
        d.answered(d.ranked[0])
    assert state.approx.held_of([e[1].url]) == [state.approx.held(e[1].url)]  # none on its way
