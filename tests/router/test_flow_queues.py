"""The dispatch order as plain data: strict bands, warm turns before cold
ones, round-robin or least attained service between flows, programs
inside a flow, FCFS or earliest deadline, caps per band."""

from __future__ import annotations

import pytest

from toposerve.router.admission.queues import BandCaps, FlowQueues, Item, LeastAttained, Ordering

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`

CAPS = BandCaps(max_requests=100, max_bytes=1000)


def _queues(**kw: object) -> FlowQueues[str]:
    return FlowQueues(lambda p: CAPS, 1000, **kw)  # type: ignore[arg-type]


def _item(tag: str, flow: str = "f", priority: int = 0, at: float = 0.0,
          deadline: float = 100.0, **kw: object) -> Item[str]:
    return Item(tag, priority, flow, at, deadline, **kw)  # type: ignore[arg-type]


def _drain(q: FlowQueues[str]) -> list[str]:
    out = []
    while (i := q.pop(lambda i: True)) is not None:
        out.append(i.payload)
    return out


def test_strict_bands_then_round_robin() -> None:
    q = _queues()
    for it in [_item("a1", "a"), _item("a2", "a"), _item("b1", "b"), _item("lo", "a", -1),
               _item("hi", "c", 5)]:
        q.push(it)
    assert q.ahead(5) and not q.ahead(6)
    assert _drain(q) == ["hi", "a1", "b1", "a2", "lo"] and len(q) == 0


def test_edf_orders_by_deadline_fcfs_by_arrival() -> None:
    for ordering, want in [("fcfs", ["x", "y", "z"]), ("edf", ["z", "x", "y"])]:
        o: Ordering = "fcfs" if ordering == "fcfs" else "edf"
        q = _queues(ordering=o)
        q.push(_item("x", at=1, deadline=10))
        q.push(_item("y", at=2, deadline=20))
        q.push(_item("z", at=3, deadline=5))
        assert _drain(q) == want


def test_least_attained_weighs_tokens_and_banks_no_idle_credit() -> None:
    q = _queues(fairness=LeastAttained)
    # a sends big requests, b small ones: b goes while it has been served less
    for n in range(3):
        q.push(_item(f"a{n}", "a", cost=100))
        q.push(_item(f"b{n}", "b", cost=10))
    assert _drain(q) == ["a0", "b0", "b1", "b2", "a1", "a2"]
    # with a backlog, a flow that shows up late starts level with the least
    # served busy flow, not at zero (it would take the band for a while)
    q = _queues(fairness=LeastAttained)
    for n in range(4):
        q.push(_item(f"a{n}", "a", cost=10))
    assert [q.pop(lambda i: True).payload for _ in range(3)] == ["a0", "a1", "a2"]  # type: ignore[union-attr]
    for n in range(3):
        q.push(_item(f"c{n}", "c", cost=10))
    rest = _drain(q)
    assert rest[:2] in (["a3", "c0"], ["c0", "a3"]) and rest[2:] == ["c1", "c2"]


def test_program_aware_serves_the_short_program_first() -> None:
    q = _queues(fairness=LeastAttained, program_aware=True)
    # a long program has had three turns served; a new one's first turn
    # goes before its fourth, though it came later
    for n in range(3):
        q.push(_item(f"long{n}", program="long", cost=50))
    assert _drain(q) == ["long0", "long1", "long2"]
    q.push(_item("long3", program="long", cost=50, at=1))
    q.push(_item("short0", program="short", cost=50, at=2))
    # the band emptied in between, so both start level: arrival decides
    assert _drain(q) == ["long3", "short0"]
    q.push(_item("long4", program="long", cost=50, at=1))
    q.push(_item("long5", program="long", cost=50, at=2))
    q.push(_item("short1", program="short", cost=50, at=3))
    assert _drain(q) == ["long4", "short1", "long5"]


def test_warm_turns_before_cold_in_one_band_only() -> None:
    q = _queues()
    q.push(_item("cold", "a"))
    q.push(_item("warm", "b", warm=True))
    q.push(_item("hi-cold", "a", 1))
    assert _drain(q) == ["hi-cold", "warm", "cold"]


def test_caps_removal_and_stuck_flows() -> None:
    q: FlowQueues[str] = FlowQueues(lambda p: BandCaps(2, 100), 3)
    a, b = _item("a", "x", size_bytes=60), _item("b", "y", size_bytes=30)
    q.push(a)
    assert q.full(0, 50) is not None and "maxBytes" in (q.full(0, 50) or "")
    q.push(b)
    assert "maxRequests" in (q.full(0, 1) or "")
    q.push(_item("c", "z", 1))
    assert "maxQueued" in (q.full(2, 1) or "")
    assert q.remove(a) and not q.remove(a)
    assert q.queued(0) == (1, 30)
    # a flow whose endpoints are full does not hold up another flow
    q.push(_item("d", "x"))
    assert q.pop(lambda i: i.flow == "x" or i.priority == 1).payload == "c"  # type: ignore[union-attr]
    assert q.pop(lambda i: i.flow == "x").payload == "d"  # type: ignore[union-attr]
    assert q.pop(lambda i: i.flow == "x") is None and len(q) == 1
