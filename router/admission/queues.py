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
another's expense."""

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


class Attained:
    """Service attained per key (a flow or a program), where a key that was
    idle comes back level with the least served busy key: being idle banks
    no credit, so a returning tenant cannot take the band for a while."""

    def __init__(self) -> None:
        self.served: dict[str, float] = {}

    def wake(self, key: str, busy: list[str]) -> None:
        floor = min((self.served.get(k, 0.0) for k in busy if k != key), default=None)
        if floor is not None:
            self.served[key] = max(self.served.get(key, 0.0), floor)

    def charge(self, key: str, cost: float) -> None:
        self.served[key] = self.served.get(key, 0.0) + cost

    def least_first(self, keys: list[str]) -> list[str]:
        # stable: ties keep their arrival order
        return sorted(keys, key=lambda k: self.served.get(k, 0.0))


class Fairness(Protocol):
    """Orders the busy flows of one band (and tier) for the next pick."""

    def order(self, flows: list[str]) -> list[str]: ...

    def woke(self, flow: str, busy: list[str]) -> None: ...

    def went(self, flow: str, cost: float) -> None: ...

    def settle(self, flow: str, delta: float) -> None:
        """A request of ``flow`` that went cost ``delta`` more than charged."""


class RoundRobin:
    def __init__(self) -> None:
        self._turn: OrderedDict[str, None] = OrderedDict()

    def order(self, flows: list[str]) -> list[str]:
        for f in flows:
            self._turn.setdefault(f)
        busy = set(flows)
        return [f for f in self._turn if f in busy]

    def woke(self, flow: str, busy: list[str]) -> None:
        self._turn.setdefault(flow)

    def went(self, flow: str, cost: float) -> None:
        self._turn.move_to_end(flow)  # the next flow goes next

    def settle(self, flow: str, delta: float) -> None:
        pass  # turns do not depend on cost


class LeastAttained:
    def __init__(self) -> None:
        self.attained = Attained()

    def order(self, flows: list[str]) -> list[str]:
        return self.attained.least_first(flows)

    def woke(self, flow: str, busy: list[str]) -> None:
        self.attained.wake(flow, busy)

    def went(self, flow: str, cost: float) -> None:
        self.attained.charge(flow, cost)

    def settle(self, flow: str, delta: float) -> None:
        self.attained.charge(flow, delta)


Ordering = Literal["fcfs", "edf"]


class _Flow(Generic[T]):
    """One flow's waiting items, in heaps per program (one program, "",
    unless program-aware); gone items are dropped lazily when they surface."""

    def __init__(self, ordering: Ordering, program_aware: bool) -> None:
        self.ordering, self.program_aware = ordering, program_aware
        self.programs: dict[str, list[tuple[float, int, Item[T]]]] = {}
        self.attained = Attained()
        self.live = 0

    def push(self, item: Item[T]) -> None:
        key = item.deadline if self.ordering == "edf" else item.arrived
        prog = item.program if self.program_aware else ""
        heap = self.programs.get(prog)
        if heap is None:
            self.attained.wake(prog, list(self.programs))
            heap = self.programs[prog] = []
        heapq.heappush(heap, (key, item.seq, item))
        self.live += 1

    def head(self) -> Item[T] | None:
        """The item this flow sends next."""
        for prog in self.attained.least_first(list(self.programs)):
            heap = self.programs[prog]
            while heap and heap[0][2].gone:
                heapq.heappop(heap)
            if heap:
                return heap[0][2]
            del self.programs[prog]
        return None

    def pop_head(self, item: Item[T]) -> None:
        prog = item.program if self.program_aware else ""
        heapq.heappop(self.programs[prog])
        if not self.programs[prog]:
            del self.programs[prog]
        self.attained.charge(prog, item.cost)


@dataclass
class _Band(Generic[T]):
    flows: dict[str, _Flow[T]] = field(default_factory=dict)
    fairness: Fairness = field(default_factory=RoundRobin)


class FlowQueues(Generic[T]):
    def __init__(self, caps: Callable[[int], BandCaps], max_total: int,
                 ordering: Ordering = "fcfs", fairness: Callable[[], Fairness] = RoundRobin,
                 program_aware: bool = False) -> None:
        self.caps, self.max_total = caps, max_total
        self.ordering, self.program_aware = ordering, program_aware
        self._fairness = fairness
        # (priority, warm) -> band; read highest first
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
        if flow is None or not flow.live:
            band.fairness.woke(item.flow, [f for f, q in band.flows.items() if q.live])
            if flow is None:
                flow = band.flows[item.flow] = _Flow(self.ordering, self.program_aware)
        flow.push(item)
        self._account(item, 1)

    def remove(self, item: Item[T]) -> bool:
        """Takes a waiting item out (it expired or its client left)."""
        if item.gone:
            return False
        item.gone = True
        key = (item.priority, item.warm)
        self._bands[key].flows[item.flow].live -= 1
        self._account(item, -1)
        self._tidy(key, self._bands[key])
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
            busy = [f for f, q in band.flows.items() if q.live]
            for name in band.fairness.order(busy):
                flow = band.flows[name]
                head = flow.head()
                if head is None or not can_go(head):
                    continue
                flow.pop_head(head)
                band.fairness.went(name, head.cost)
                head.gone, head.charged_in = True, band
                flow.live -= 1
                self._account(head, -1)
                self._tidy(key, band)
                return head
            self._tidy(key, band)
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
        if flow is not None:
            flow.attained.charge(item.program if self.program_aware else "", delta)

    def _tidy(self, key: tuple[int, bool], band: _Band[T]) -> None:
        # a band with nothing waiting starts afresh: when no one waits, no one
        # is owed service
        if not any(q.live for q in band.flows.values()):
            del self._bands[key]
