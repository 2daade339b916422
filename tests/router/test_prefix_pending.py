"""The precise index between routing and the engine's events: a prompt
counts as held where it went until the engine's own events can say (they
come only after its prefill), so requests that arrive together with a new
shared prefix follow the first; and once the events speak, they alone
do."""

from __future__ import annotations

import pytest

from tests.router.pipeline import LONG, ctx, make_state
from tests.router.test_prefix_sent import Clock
from toposerve.router.prefix.index import PrefixIndex
from toposerve.router.prefix.kv_index import KVIndex
from toposerve.router.scheduling.profile import Scheduler
from toposerve.wire.hashing import token_block_hashes
from toposerve.wire.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from toposerve.wire.tokens import ByteTokenizer

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`
BLOCK = 16


def test_a_hold_ends_when_the_index_learns_the_prompt_whole() -> None:
    idx = PrefixIndex()
    idx.send("a", [1, 2, 3], hold_s=60)
    idx.add("a", [1, 2])  # stored in part: still on its way
    assert idx.match([1, 2, 3], ["a"]) == {"a": 3}
    idx.add("a", [3])
    assert not idx._sent and not idx._sent_to and not idx._sent_new
    assert idx.send("a", [1, 2, 3]) is None  # held whole already: nothing to hold
    idx.remove("a", [3])  # the index alone says what is left
    assert idx.match([1, 2, 3], ["a"]) == {"a": 2}


def test_a_hold_ends_when_the_endpoint_drops_a_block_of_it_or_everything() -> None:
    idx = PrefixIndex()
    idx.send("a", [1, 2, 3], hold_s=60)
    idx.send("a", [7, 8], hold_s=60)
    idx.send("b", [1, 2, 3], hold_s=60)
    idx.remove("a", [2])
    assert idx.match([1, 2, 3], ["a", "b"]) == {"a": 0, "b": 3}
    assert idx.match([7, 8], ["a"]) == {"a": 2}  # another prompt's hold stays
    idx.clear("a")
    assert idx.match([7, 8], ["a"]) == {"a": 0}
    assert set(idx._sent_to) == set(idx._sent_new) == {"b"}
    idx.remove("b", [99])  # a block of no hold's: they stay
    assert idx.match([1, 2, 3], ["b"]) == {"b": 3}


def test_a_timed_hold_lapses() -> None:
    clock = Clock()
    idx = PrefixIndex(clock=clock)
    idx.send("a", [1, 2], hold_s=1.0)
    clock.now += 1.5
    assert idx.match([1, 2], ["a"]) == {"a": 0}


def _precise(pending_s: float | None = None) -> tuple[Scheduler, KVIndex]:
    params = {} if pending_s is None else {"pendingSeconds": pending_s}
    state = make_state([{"type": "prefix-precise", "weight": 4, "params": params},
                        {"type": "conversations", "weight": 2}])
    kv = KVIndex(state.precise, ByteTokenizer(), BLOCK)
    return Scheduler(state, state.config.profile, kv), kv


def test_requests_in_flight_together_follow_the_first_on_the_precise_index() -> None:
    """An agent's first turn and its sub-agents: the engine has told
    nothing of their shared prefix yet. Before the first is answered, and
    after (its events not yet come), the others go where it went; without
    the hold each of the 4 endpoints would tie and 6 would scatter."""
    sched, kv = _precise()
    first = sched.schedule(ctx(LONG + "the turn"))
    home = first.ranked[0]
    subs = [sched.schedule(ctx(LONG + f"sub-agent {k}")) for k in range(3)]
    first.answered(home)  # answering: its prefill's events are still to come
    subs += [sched.schedule(ctx(LONG + f"sub-agent {k}")) for k in range(3, 6)]
    assert [d.ranked[0] for d in subs] == [home] * 6
    # the engine stores the first prompt: its hold gives way to the events
    tokens = ByteTokenizer().encode(LONG + "the turn")
    whole = len(tokens) // BLOCK * BLOCK
    kv.apply(home.url, [BlockStored(list(range(1, whole // BLOCK + 1)), None,
                                    tokens[:whole], BLOCK)])
    held = sched.state.precise._sent_to.get(home.url, {})
    assert all(s.keys != token_block_hashes(tokens, BLOCK) for ss in held.values() for s in ss)


def test_the_events_overrule_a_hold() -> None:
    """Evicted or cleared after it was routed: the next request is
    predicted what the engine holds, not what the hold said."""
    sched, kv = _precise()
    prompt = LONG + "evicted soon"
    d = sched.schedule(ctx(prompt))
    home = d.ranked[0]
    d.answered(home)
    tokens = ByteTokenizer().encode(prompt)
    whole = len(tokens) // BLOCK * BLOCK
    hashes = list(range(1, whole // BLOCK + 1))
    kv.apply(home.url, [BlockStored(hashes, None, tokens[:whole], BLOCK),
                        BlockRemoved(hashes[-5:])])
    again = sched.schedule(ctx(prompt))
    assert again.cycle.prefix is not None
    assert again.cycle.prefix.matched[home.url] == len(hashes) - 5
    again.answered(home)  # sent again: held whole until the engine says
    kv.apply(home.url, [AllBlocksCleared()])
    third = sched.schedule(ctx(prompt))
    assert third.cycle.prefix is not None and third.cycle.prefix.matched == {}


def test_pending_seconds_zero_holds_only_until_the_answer() -> None:
    sched, _ = _precise(pending_s=0)
    first = sched.schedule(ctx(LONG + "the turn"))
    first.answered(first.ranked[0])
    assert not sched.state.precise._sent
