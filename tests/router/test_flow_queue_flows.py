"""Flows that come and go in a busy band: a flow leaves the band as soon as
nothing of it waits, so a client that makes up a new fairness id (or
session id) per request leaves no state behind and slows nothing down,
and the turns stay fair as flows come and go (checked against a plain
reference model)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from toposerve.router.admission.queues import (
    KEEP_IDLE_FLOWS,
    KEEP_IDLE_PROGRAMS,
    BandCaps,
    Fairness,
    FlowQueues,
    Item,
    LeastAttained,
    RoundRobin,
)

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`

CAPS = BandCaps(max_requests=100_000, max_bytes=2**40)
POLICIES: list[Callable[[], Fairness]] = [RoundRobin, LeastAttained]


def _queues(fairness: Callable[[], Fairness], program_aware: bool = False) -> FlowQueues[str]:
    return FlowQueues(lambda p: CAPS, 100_000, "fcfs", fairness, program_aware)


def _item(tag: str, flow: str, at: float = 0.0, program: str = "", cost: float = 1.0) -> Item[str]:
    return Item(tag, 0, flow, at, at + 100.0, cost=cost, program=program)


def _churn(q: FlowQueues[str], n: int, start: int = 0) -> None:
    """``n`` flows, each seen once: one request queues, then goes."""
    for k in range(start, start + n):
        q.push(_item(f"x{k}", f"flow-{k}", at=k))
        went = q.pop(lambda i: i.flow != "keep")
        assert went is not None and went.payload == f"x{k}"


@pytest.mark.parametrize("fairness", POLICIES, ids=["round-robin", "least-attained"])
def test_finished_flows_leave_a_busy_band(fairness: Callable[[], Fairness]) -> None:
    q = _queues(fairness, program_aware=True)
    q.push(_item("held", "keep"))  # its endpoints stay full: the band never empties
    _churn(q, 3 * KEEP_IDLE_FLOWS)
    band = q._bands[(0, False)]
    assert list(band.flows) == ["keep"] and q.flows(0) == 1 and len(q) == 1
    assert len(band.fairness) == 1  # the turn holds busy flows only
    # what is kept of idle flows (least-attained debt, programs' service) is bounded
    assert len(band.idle) <= KEEP_IDLE_FLOWS
    if isinstance(band.fairness, LeastAttained):
        assert band.fairness.attained.remembered() <= 1 + KEEP_IDLE_FLOWS
    # the held request still goes, and then the band is gone
    assert q.pop(lambda i: True).payload == "held"  # type: ignore[union-attr]
    assert q._bands == {} and q.flows(0) == 0


def test_a_busy_flow_keeps_no_finished_programs() -> None:
    q = _queues(LeastAttained, program_aware=True)
    q.push(_item("first", "f", program="long"))
    for k in range(3 * KEEP_IDLE_PROGRAMS):  # one waits all along: the flow stays busy
        q.push(_item(f"s{k}", "f", at=k, program=f"session-{k}"))
        assert q.pop(lambda i: True) is not None and len(q) == 1
    flow = q._bands[(0, False)].flows["f"]
    assert len(flow.programs) == 1 and flow.live == 1
    assert flow.attained.remembered() <= 1 + KEEP_IDLE_PROGRAMS


def test_expired_items_leave_nothing_behind() -> None:
    q = _queues(RoundRobin)
    q.push(_item("held", "keep"))
    for k in range(500):
        it = _item(f"x{k}", f"flow-{k}")
        q.push(it)
        assert q.remove(it)
    band = q._bands[(0, False)]
    assert list(band.flows) == ["keep"] and len(band.fairness) == 1
    # in one busy flow, items taken out while others wait are dropped too
    for k in range(500):
        it = _item(f"y{k}", "keep", at=k + 1)
        q.push(it)
        q.remove(it)
    assert len(band.flows["keep"].programs[""]) < 100


# --- fairness as flows come and go, against a reference model --------------------

@dataclass
class _Model:
    """The dispatch order written plainly: a list of busy flows and their
    waiting items (FIFO). Round-robin: the first busy flow that can go, which
    then goes to the back (or leaves, with nothing left); a flow that wakes
    joins at the back. Least-attained: the least served busy flow that can
    go (ties: the one that woke first); a waking flow comes back level with
    the least served busy one, keeping any lead it had; the band that
    empties forgets everything."""

    least_attained: bool
    waiting: dict[str, list[str]] = field(default_factory=dict)  # busy flows, woke order
    served: dict[str, float] = field(default_factory=dict)
    woke: dict[str, int] = field(default_factory=dict)
    epoch: int = 0  # the band emptied this many times
    clock: int = 0

    def push(self, flow: str, tag: str) -> None:
        if flow not in self.waiting:
            others = [self.served.get(f, 0.0) for f in self.waiting]
            if others:
                self.served[flow] = max(self.served.get(flow, 0.0), min(others))
            self.clock += 1
            self.woke[flow] = self.clock
            self.waiting[flow] = []
        self.waiting[flow].append(tag)

    def _order(self) -> list[str]:
        busy = list(self.waiting)
        if self.least_attained:
            return sorted(busy, key=lambda f: (self.served.get(f, 0.0), self.woke[f]))
        return busy

    def pop(self, blocked: set[str], cost: dict[str, float]) -> str | None:
        for f in self._order():
            if f in blocked:
                continue
            tag = self.waiting[f].pop(0)
            self.served[f] = self.served.get(f, 0.0) + cost[tag]
            rest = self.waiting.pop(f)
            if rest:  # to the back
                self.waiting[f] = rest
            self._tidy()
            return tag
        return None

    def remove(self, flow: str, tag: str) -> None:
        self.waiting[flow].remove(tag)
        if not self.waiting[flow]:
            del self.waiting[flow]
        self._tidy()

    def settle(self, flow: str, epoch: int, delta: float) -> None:
        if self.waiting and epoch == self.epoch:
            self.served[flow] = self.served.get(flow, 0.0) + delta

    def _tidy(self) -> None:
        if not self.waiting:
            self.served.clear()
            self.epoch += 1


FLOWS = [f"f{i}" for i in range(6)]
_op = st.one_of(
    st.tuples(st.just("push"), st.sampled_from(FLOWS), st.integers(0, 4)),
    st.tuples(st.just("pop"), st.sets(st.sampled_from(FLOWS), max_size=3)),
    st.tuples(st.just("remove"), st.integers(0, 10_000)),
    st.tuples(st.just("settle"), st.integers(0, 10_000), st.integers(-3, 3)),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.booleans(), st.lists(_op, max_size=80))
def test_turns_match_the_reference_model(least_attained: bool, ops: list[tuple]) -> None:  # type: ignore[type-arg]
    fairness: Callable[[], Fairness] = LeastAttained if least_attained else RoundRobin
    q = _queues(fairness)
    model = _Model(least_attained)
    items: dict[str, Item[str]] = {}
    cost: dict[str, float] = {}
    went: list[tuple[Item[str], int]] = []  # and the model's epoch when it went
    for n, op in enumerate(ops):
        if op[0] == "push":
            tag = f"t{n}"
            items[tag] = it = _item(tag, op[1], at=n, cost=float(op[2]))
            cost[tag] = float(op[2])
            q.push(it)
            model.push(op[1], tag)
        elif op[0] == "pop":
            blocked: set[str] = op[1]

            def can_go(i: Item[str], blocked: set[str] = blocked) -> bool:
                return i.flow not in blocked

            epoch = model.epoch  # the band it goes from; settling after it empties is void
            got = q.pop(can_go)
            want = model.pop(blocked, cost)
            assert (got.payload if got is not None else None) == want
            if got is not None:
                went.append((got, epoch))
                del items[got.payload]
        elif op[0] == "remove" and items:
            it = list(items.values())[op[1] % len(items)]
            assert q.remove(it)
            del items[it.payload]
            model.remove(it.flow, it.payload)
        elif op[0] == "settle" and went:
            it, epoch = went[op[1] % len(went)]
            q.settle(it, float(op[2]))
            model.settle(it.flow, epoch, float(op[2]))
        assert len(q) == len(items) == sum(map(len, model.waiting.values()))
        assert q.flows(0) == len(model.waiting)
    # drain: the rest goes in the model's order too
    while (got := q.pop(lambda i: True)) is not None:
        assert got.payload == model.pop(set(), cost)
    assert not model.waiting and q._bands == {}
