"""What routing costs as the fleet grows, counted rather than timed: the
scheduling path (admission's candidate check, filters, the default
profile's scorers, the picker, the answer) makes the same number of Python
calls a request at 64 endpoints as at 4; what is left an endpoint is a
few passes of C (``map``, ``zip``, ``dict``) and comprehensions, which the
scoring needs. And the scores are the ones the plain formulas give, so the
decisions are the same as before the work an endpoint was taken out."""

from __future__ import annotations

import random
import sys
import time
from collections import Counter
from types import FrameType
from typing import Any

import pytest

from toposerve.router.config import RouterConfig
from toposerve.router.pool.endpoints import Endpoint, LoadSample
from toposerve.router.pool.saturation import pool_saturation, saturated
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.profile import Decision, Scheduler
from toposerve.router.scheduling.scorers.prefill import PREFILL_SLACK_TOKENS
from toposerve.router.state import RouterState

pytestmark = pytest.mark.unit

# two long system prompts (their conversations share a first block) and two
# short ones (each question its own conversation)
SYSTEMS = [f"system prompt {k}: " + "you are a helpful assistant. " * (70 if k < 2 else 30)
           for k in range(4)]


def fleet(n: int, seed: int = 0) -> tuple[RouterState, Scheduler]:
    state = RouterState(RouterConfig.model_validate({
        "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
        "discovery": {"static": [{"url": "http://e:1"}]},
        "profile": {"picker": {"type": "max-score", "params": {"seed": seed}}}}))
    for i in range(n):
        ep = state.pool.upsert(Endpoint(url=f"http://e{i}:8000", models=frozenset({"m"})))
        ep.healthy = True
        ep.load = LoadSample(at=time.monotonic() + 3600)  # fresh for the test's life
    return state, Scheduler(state, state.config.profile, None)


def request(i: int) -> RequestContext:
    """64 conversations over four system prompts (bench.router_overhead's
    mix); every third has a session id."""
    prompt = (SYSTEMS[i % 4] + f"question {i % 64}: what is {i % 64} squared? "
              + "show the working. " * 12 + f"turn {i // 64}")
    return RequestContext(model="m", prompt=prompt.encode(),
                          session=f"s{i % 64}" if i % 3 == 0 else None)


def route(state: RouterState, sched: Scheduler, i: int) -> Decision:
    """One request as the router handles it: admission's look at the
    candidates, the profile run, the request weighed on its endpoint,
    answered there."""
    c = request(i)
    eps = sched.candidates(c)
    pool_saturation(eps, state.config)
    any(not saturated(e, state.config) for e in eps)
    d = sched.schedule(c)
    ep = d.ranked[0]
    work = d.work()
    ep.begin(work.tokens, work.prefill(ep))
    ep.end(work.tokens, work.prefill(ep))
    d.answered(ep)
    return d


def calls_a_request(n: int, warm: int = 200, counted: int = 50) -> tuple[float, Counter[str]]:
    """Python calls (functions, comprehensions, generator steps) a request
    makes on the scheduling path with ``n`` endpoints, after ``warm``
    requests have filled the prefix index and the conversations."""
    state, sched = fleet(n)
    for i in range(warm):
        route(state, sched, i)
    calls: Counter[str] = Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            calls[frame.f_code.co_qualname] += 1

    sys.setprofile(profile)
    try:
        for i in range(warm, warm + counted):
            route(state, sched, i)
    finally:
        sys.setprofile(None)
    return sum(calls.values()) / counted, calls


def test_calls_a_request_do_not_grow_with_the_fleet() -> None:
    small, at4 = calls_a_request(4)
    large, at64 = calls_a_request(64)
    grew = {q: (at4[q], at64[q]) for q in at64 if at64[q] > at4[q] + 50}
    # 16 times the endpoints; a call an endpoint anywhere on the path would
    # add 60 a request. Allowed: the odd min-max comprehension a scorer
    # skips when all endpoints score alike (more likely with 4)
    assert large <= small + 2, f"{small:.1f} -> {large:.1f} calls a request; grew: {grew}"


def reference_scores(state: RouterState, c: RequestContext, eps: list[Endpoint],
                     live: dict[str, int], live_here: bool) -> dict[str, dict[Endpoint, float]]:
    """The default profile's scorers as plain formulas over every endpoint
    (what the scorers computed before their per-endpoint work was taken
    out): the decisions must not change."""
    keys = c.byte_blocks(1024)
    matched = state.approx.match(keys, [e.url for e in eps])
    frac = {e: matched[e.url] / len(keys) for e in eps}
    cost = {e: e.prefill_tokens + c.token_estimate * (1 - frac[e]) for e in eps}
    best = min(cost.values())
    held = {e: float(state.approx.held(e.url)) for e in eps}
    lo, hi = min(held.values()), max(held.values())
    room = {e: 1.0 if hi == lo else (hi - v) / (hi - lo) for e, v in held.items()}
    least = min(live.get(e.url, 0) for e in eps)
    convs = {e: 1.0 if live_here else (least + 1) / (live.get(e.url, 0) + 1) for e in eps}
    url = state.sessions.get(c.session) if c.session else None
    return {"prefix-approx": frac,
            "prefill-cost": {e: (best + PREFILL_SLACK_TOKENS) / (x + PREFILL_SLACK_TOKENS)
                             for e, x in cost.items()},
            "cache-room": room, "conversations": convs,
            "session": {e: float(e.url == url and not state.saturated(e)) for e in eps}}


@pytest.mark.parametrize("n", [4, 64])
def test_scores_are_the_plain_formulas(n: int) -> None:
    """Every scorer's score for every endpoint, request after request (the
    index filling, prefill backlogs uneven, sessions returning), equals the
    plain formula's; so the ranking does."""
    state, sched = fleet(n)
    rng = random.Random(n)
    where: dict[int, str] = {}  # conversation (first block) -> where it went
    for i in range(300):
        for e in state.pool:
            e.prefill_tokens = rng.choice([0, 0, 500, 3000])
        c = request(i)
        eps = sched.candidates(c)
        first = c.byte_blocks(1024)[0]
        live = Counter(where.values())
        ref = reference_scores(state, c, eps, live, first in where)
        d = sched.schedule(c)
        # a scorer may leave out the endpoints it scores 0 (the prefix's
        # non-holders, all but the session's endpoint)
        assert {s: {e: d.scores[s].get(e, 0.0) for e in eps} for s in d.scores} == ref, \
            f"request {i}"
        totals = {e: sum(sched.weights[s] * ref[s][e] for s in ref) for e in eps}
        assert totals[d.ranked[0]] == pytest.approx(max(totals.values()), abs=1e-9)
        d.answered(d.ranked[0])
        where[first] = d.ranked[0].url
