"""The flow controller's queues and its dispatch order, as plain data with
no clock or I/O of its own (time comes in as arguments).

Strict priority bands, highest first; with turn priority a band's warm
turns (an agent session's next turn, its cache still warm) go before its
cold requests. Inside a band (and tier) a fairness policy picks the flow
(tenant): round-robin, or least attained service in weighted tokens.
Inside a flow, with program-aware fairness, the program (agent session)
served least goes first; then first come first served or earliest
deadline. Each band has caps on queued requests and bytes, and all bands
together a cap on requests, so no flow's backlog grows without bound at
another's expense.

A band holds only its busy flows: a flow leaves as soon as nothing of it
waits, not when the whole band empties, so flow ids a client makes up (one
per request) leave no state behind, and a push or pop costs O(1) (round-
robin) or O(log n) (least-attained) in the busy flows, not in every flow
seen. The busy flows need no cap of their own: each has a waiting request,
and those are capped (``bands[].maxRequests``, ``maxQueued``). What is kept
of idle flows (least-attained debt, programs' service) is a bounded record
of the most recent ones."""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

T = TypeVar("T")


@dataclass(eq=False)
class Item(Generic[T]):
    """One waiting request: where it queues, when it must go, what it costs."""

    payload: T
    priority: int
    flow: str
    arrived: float
    deadline: float
    size_bytes: int = 0
    cost: float = 0.0  # service charged to its flow and program when it goes
    program: str = ""  # agent session, with program-aware fairness
    warm: bool = False  # its session's cache is warm (turn priority)
    seq: int = 0
    gone: bool = False  # taken out of the queue (went, expired, cancelled)
    charged_in: object = None  # the band that charged its cost when it went


@dataclass
class BandCaps:
    max_requests: int
    max_bytes: int


class LeastServed:
    """Service attained per key (a flow, or a program in a flow), and the
    busy keys least served first (ties: the key that woke first).

    A key that was idle comes back level with the least served busy key:
    being idle banks no credit, so a returning tenant cannot take the band
    for a while. A key that went idle owing service (served more than the
    others) keeps that debt when it comes back, but only the ``keep`` keys
    idle most recently are remembered; an older one comes back level, as a
    new key does. The busy keys sit in a heap: a change costs O(log n) in the
    busy keys, whatever number of keys came and went before."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self._busy: dict[str, tuple[float, int, int]] = {}  # key -> (served, rank, entry)
        self._heap: list[tuple[float, int, int, str]] = []  # (served, rank, entry, key)
        self._idle: OrderedDict[str, float] = OrderedDict()  # key -> served, oldest first
        self._ids = itertools.count()

    def __len__(self) -> int:
        return len(self._busy)

    def served(self, key: str) -> float:
        busy = self._busy.get(key)
        return busy[0] if busy is not None else self._idle.get(key, 0.0)

    def remembered(self) -> int:
        """Keys known, busy or idle (the state this keeps)."""
        return len(self._busy) + len(self._idle)

    def _set(self, key: str, served: float, rank: int) -> None:
        entry = next(self._ids)
        self._busy[key] = (served, rank, entry)
        heapq.heappush(self._heap, (served, rank, entry, key))
        if len(self._heap) > 2 * len(self._busy) + 16:  # outdated entries: drop them
            self._heap = [e for e in self._heap if self._current(e)]
            heapq.heapify(self._heap)

    def _current(self, e: tuple[float, int, int, str]) -> bool:
        busy = self._busy.get(e[3])
        return busy is not None and busy[2] == e[2]

    def _top(self) -> tuple[float, int, int, str] | None:
        while self._heap and not self._current(self._heap[0]):
            heapq.heappop(self._heap)
        return self._heap[0] if self._heap else None

    def wake(self, key: str) -> None:
        served = self._idle.pop(key, 0.0)
        floor = self._top()
        if floor is not None:
            served = max(served, floor[0])
        self._set(key, served, next(self._ids))

    def idle(self, key: str) -> None:
        self._idle[key] = self._busy.pop(key)[0]
        while len(self._idle) > self.keep:
            self._idle.popitem(last=False)

    def charge(self, key: str, cost: float) -> None:
        busy = self._busy.get(key)
        if busy is not None:
            if cost:
                self._set(key, busy[0] + cost, busy[1])
        elif key in self._idle:
            self._idle[key] += cost
        # else forgotten: it comes back level, like a new key

    def first(self) -> str | None:
        top = self._top()
        return top[3] if top is not None else None

    def pick(self, ok: Callable[[str], bool]) -> str | None:
        """The least served busy key that is ``ok``; O(log n) for each key
        passed over."""
        passed: list[tuple[float, int, int, str]] = []
        found = None
        while self._top() is not None:
            e = heapq.heappop(self._heap)
            passed.append(e)
            if ok(e[3]):
                found = e[3]
                break
        for e in passed:
            heapq.heappush(self._heap, e)
        return found


# idle keys whose attained service is remembered, per band (flows) and per
# flow (programs); past these the oldest come back level, like new ones
KEEP_IDLE_FLOWS = 256
KEEP_IDLE_PROGRAMS = 32


class Fairness(Protocol):
    """Orders the busy flows of one band (and tier) for the next pick. A
    flow is busy from its first waiting item (``woke``) until it has none
    (``idle``)."""

    def __len__(self) -> int:
        """Busy flows: all this keeps, but for a bounded record of idle ones."""

    def woke(self, flow: str) -> None: ...

    def idle(self, flow: str) -> None: ...

    def pick(self, ok: Callable[[str], bool]) -> str | None:
        """The first busy flow, in this policy's order, that is ``ok``."""

    def went(self, flow: str, cost: float) -> None: ...

    def settle(self, flow: str, delta: float) -> None:
        """A request of ``flow`` that went cost ``delta`` more than charged."""


class RoundRobin:
    """The busy flows take turns: the one that went goes to the back, and a
    flow that wakes joins at the back. An idle flow leaves the ring at once,
    so the flow after it is next, and the ring holds busy flows only."""

    def __init__(self) -> None:
        self._turn: OrderedDict[str, None] = OrderedDict()  # next first

    def __len__(self) -> int:
        return len(self._turn)

    def woke(self, flow: str) -> None:
        self._turn[flow] = None

    def idle(self, flow: str) -> None:
        self._turn.pop(flow, None)

    def pick(self, ok: Callable[[str], bool]) -> str | None:
        return next((f for f in self._turn if ok(f)), None)

    def went(self, flow: str, cost: float) -> None:
        self._turn.move_to_end(flow)  # the next flow goes next

    def settle(self, flow: str, delta: float) -> None:
        pass  # turns do not depend on cost


class LeastAttained:
    def __init__(self) -> None:
        self.attained = LeastServed(KEEP_IDLE_FLOWS)

    def __len__(self) -> int:
        return len(self.attained)

    def woke(self, flow: str) -> None:
        self.attained.wake(flow)

    def idle(self, flow: str) -> None:
        self.attained.idle(flow)

    def pick(self, ok: Callable[[str], bool]) -> str | None:
        return self.attained.pick(ok)

    def went(self, flow: str, cost: float) -> None:
        self.attained.charge(flow, cost)

    def settle(self, flow: str, delta: float) -> None:
        self.attained.charge(flow, delta)


Ordering = Literal["fcfs", "edf"]


class _Flow(Generic[T]):
    """One flow's waiting items, in heaps per program (one program, "",
    unless program-aware); a program whose items are all gone goes at once,
    other gone items are dropped when they surface, or all together when
    they outnumber the live ones."""

    def __init__(self, ordering: Ordering, program_aware: bool) -> None:
        self.ordering, self.program_aware = ordering, program_aware
        self.programs: dict[str, list[tuple[float, int, Item[T]]]] = {}  # busy ones
        self.waiting: dict[str, int] = {}  # live items per busy program
        self.attained = LeastServed(KEEP_IDLE_PROGRAMS)
        self.live = 0
        self.stale = 0  # gone items still in the heaps

    def _program(self, item: Item[T]) -> str:
        return item.program if self.program_aware else ""

    def push(self, item: Item[T]) -> None:
        key = item.deadline if self.ordering == "edf" else item.arrived
        prog = self._program(item)
        heap = self.programs.get(prog)
        if heap is None:
            self.attained.wake(prog)
            heap = self.programs[prog] = []
            self.waiting[prog] = 0
        heapq.heappush(heap, (key, item.seq, item))
        self.waiting[prog] += 1
        self.live += 1

    def head(self) -> Item[T] | None:
        """The item this flow sends next."""
        prog = self.attained.first()
        if prog is None:
            return None
        heap = self.programs[prog]  # a busy program has a live item
        while heap[0][2].gone:
            heapq.heappop(heap)
            self.stale -= 1
        return heap[0][2]

    def pop_head(self, item: Item[T]) -> None:
        prog = self._program(item)
        heapq.heappop(self.programs[prog])
        self.attained.charge(prog, item.cost)
        self._left(prog)

    def removed(self, item: Item[T]) -> None:
        """``item`` (now gone) was taken out before it went."""
        self.stale += 1
        self._left(self._program(item))
        if self.stale > self.live + 16:
            for heap in self.programs.values():
                heap[:] = [e for e in heap if not e[2].gone]
                heapq.heapify(heap)
            self.stale = 0

    def _left(self, prog: str) -> None:
        self.live -= 1
        self.waiting[prog] -= 1
        if not self.waiting[prog]:
            self.stale -= len(self.programs.pop(prog))  # gone items only
            del self.waiting[prog]
            self.attained.idle(prog)


@dataclass
class _Band(Generic[T]):
    # busy flows only: a flow leaves as soon as nothing of it waits, so a
    # client that makes up a new flow id per request leaves nothing behind.
    # The busy flows are bounded as the waiting requests are (maxRequests
    # per band, maxQueued in all): each has at least one waiting.
    flows: dict[str, _Flow[T]] = field(default_factory=dict)
    fairness: Fairness = field(default_factory=RoundRobin)
    # program-aware: the programs' attained service of recently idle flows,
    # the KEEP_IDLE_FLOWS latest (oldest first)
    idle: OrderedDict[str, _Flow[T]] = field(default_factory=OrderedDict)


class FlowQueues(Generic[T]):
    def __init__(self, caps: Callable[[int], BandCaps], max_total: int,
                 ordering: Ordering = "fcfs", fairness: Callable[[], Fairness] = RoundRobin,
                 program_aware: bool = False) -> None:
        self.caps, self.max_total = caps, max_total
        self.ordering, self.program_aware = ordering, program_aware
        self._fairness = fairness
        # (priority, warm) -> band; read highest first. A band is here while
        # something waits in it; priorities come from the config's objectives
        self._bands: dict[tuple[int, bool], _Band[T]] = {}
        self._count: dict[int, int] = {}  # live items per priority
        self._bytes: dict[int, int] = {}
        self.total = 0
        self._seq = itertools.count()

    def __len__(self) -> int:
        return self.total

    def queued(self, priority: int) -> tuple[int, int]:
        """Live items and their bytes in one priority band (both tiers)."""
        return self._count.get(priority, 0), self._bytes.get(priority, 0)

    def flows(self, priority: int, warm: bool = False) -> int:
        """Busy flows (with something waiting) in one band and tier."""
        band = self._bands.get((priority, warm))
        return len(band.flows) if band is not None else 0

    def full(self, priority: int, size_bytes: int) -> str | None:
        """Why one more item of this size cannot queue in this band, or None."""
        if self.total >= self.max_total:
            return f"the router's queue is full ({self.max_total} requests, maxQueued)"
        caps = self.caps(priority)
        n, b = self.queued(priority)
        if n >= caps.max_requests:
            return (f"priority band {priority} is full ({caps.max_requests} requests, "
                    "bands[].maxRequests)")
        if b + size_bytes > caps.max_bytes:
            return (f"priority band {priority} is full ({caps.max_bytes} bytes, "
                    "bands[].maxBytes)")
        return None

    def ahead(self, priority: int) -> bool:
        """Something waits at this priority or above (a newcomer goes behind it)."""
        return any(n and p >= priority for p, n in self._count.items())

    def push(self, item: Item[T]) -> None:
        item.seq = next(self._seq)
        band = self._bands.get((item.priority, item.warm))
        if band is None:
            band = self._bands[(item.priority, item.warm)] = _Band(fairness=self._fairness())
        flow = band.flows.get(item.flow)
        if flow is None:
            band.fairness.woke(item.flow)
            flow = band.idle.pop(item.flow, None)
            if flow is None:
                flow = _Flow(self.ordering, self.program_aware)
            band.flows[item.flow] = flow
        flow.push(item)
        self._account(item, 1)

    def remove(self, item: Item[T]) -> bool:
        """Takes a waiting item out (it expired or its client left)."""
        if item.gone:
            return False
        item.gone = True
        key = (item.priority, item.warm)
        band = self._bands[key]
        flow = band.flows[item.flow]
        flow.removed(item)
        self._account(item, -1)
        self._tidy(key, band, item.flow, flow)
        return True

    def _account(self, item: Item[T], sign: int) -> None:
        self.total += sign
        self._count[item.priority] = self._count.get(item.priority, 0) + sign
        self._bytes[item.priority] = self._bytes.get(item.priority, 0) + sign * item.size_bytes

    def pop(self, can_go: Callable[[Item[T]], bool]) -> Item[T] | None:
        """The next item to send, taken out of the queue: the highest band
        first; in it the fairness policy's first flow whose head ``can_go``
        (a flow whose endpoints are full does not hold up the others)."""
        for key in sorted(self._bands, reverse=True):
            band = self._bands[key]

            def ok(name: str, band: _Band[T] = band) -> bool:
                head = band.flows[name].head()
                return head is not None and can_go(head)

            name = band.fairness.pick(ok)
            if name is None:
                continue
            flow = band.flows[name]
            head = flow.head()
            assert head is not None  # ok() saw it
            flow.pop_head(head)
            band.fairness.went(name, head.cost)
            head.gone, head.charged_in = True, band
            self._account(head, -1)
            self._tidy(key, band, name, flow)
            return head
        return None

    def settle(self, item: Item[T], delta: float) -> None:
        """The request ``item`` cost ``delta`` more than it was charged when
        it went (negative: less), now that its answer has ended. Its flow
        and program are charged the difference, unless its band has emptied
        since: a band that starts afresh owes nobody."""
        band = self._bands.get((item.priority, item.warm))
        if band is None or band is not item.charged_in or not delta:
            return
        band.fairness.settle(item.flow, delta)
        flow = band.flows.get(item.flow)
        if flow is None:
            flow = band.idle.get(item.flow)
        if flow is not None:
            flow.attained.charge(item.program if self.program_aware else "", delta)

    def _tidy(self, key: tuple[int, bool], band: _Band[T], name: str, flow: _Flow[T]) -> None:
        if flow.live:
            return
        # nothing of this flow waits: it leaves the band now (not when the
        # band empties), so flows that came and went cost nothing later
        del band.flows[name]
        band.fairness.idle(name)
        if self.program_aware:
            band.idle[name] = flow
            while len(band.idle) > KEEP_IDLE_FLOWS:
                band.idle.popitem(last=False)
        if not band.flows:
            # a band with nothing waiting starts afresh: when no one waits,
            # no one is owed service
            del self._bands[key]
