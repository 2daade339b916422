"""The sharing-cost benchmark times real replays: every decision is
applied at the peer, whose prefix index then holds the prompt where the
first router sent it."""

from __future__ import annotations

import pytest

from bench.share_cost import _prompts, _router, measure
from harness.router_state import MODEL
from toposerve.router.request import RequestContext

pytestmark = pytest.mark.unit


def test_each_part_is_timed_and_every_decision_replayed() -> None:
    got = measure(50, 0)
    assert set(got) == {"schedule", "publish", "replay"} and all(v > 0 for v in got.values())


def test_a_replayed_decision_lands_in_the_peers_prefix_index() -> None:
    import orjson

    from toposerve.router.ha.replication import message, replay

    _, sched = _router()
    peer_state, peer = _router()
    prompt, session = _prompts(1, 0)[0]
    ctx = RequestContext(model=MODEL, prompt=prompt, session=session)
    d = sched.schedule(ctx)
    d.answered(d.ranked[0])
    urls = [d.ranked[0].url]
    assert peer_state.approx.held_of(urls) == [0]
    doc = orjson.loads(orjson.dumps(message("a", 1, "profile", ctx, d.ranked[0])))
    assert replay(doc, {"profile": peer}, peer_state.pool)
    assert peer_state.approx.held_of(urls)[0] > 0
