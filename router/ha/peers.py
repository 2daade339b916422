"""The other router processes sharing this one's view (replicas over
Redis, workers of one pod over their local bus), and what each has in
flight to each endpoint, so that N routers do not each take an endpoint
for idle.

Each process reports its own in-flight counts (requests, prompt tokens,
prefill tokens) per endpoint: what changed since its last report, at
most once every ``ha.inflight.intervalSeconds`` and only when something
did, and all of them every quarter of ``peerTimeoutSeconds`` (which also
says it is alive). A receiver adds each peer's latest counts to the
endpoints' ``peer_*`` counts, which the filters, scorers and flow control
read with the process's own. A report that does not follow the peer's
last one (a lost message: its sequence number skips) is not applied
until the peer's next full report. A peer heard nothing from for
``peerTimeoutSeconds``, or that said goodbye, counts no more: a killed
replica's requests stop weighing on its endpoints within that time.

The reports also say how many decisions each process holds and whether
it has done starting, so a starting process knows whom to ask for a
snapshot, and what each tenant with a rate spent there since the last
report (``Spending``), which every receiver charges to its own buckets.
Plain data and the pool; the bus is the caller's."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from toposerve.router.config import InflightShareConfig
from toposerve.router.pool.endpoints import CHANGES, Pool

Counts = tuple[int, int, int]  # requests, prompt tokens, prefill tokens
ZERO: Counts = (0, 0, 0)
MAX_PEERS = 1024  # beyond, a new sender is not heard (what it reports does not count)
MAX_ENDPOINTS = 100_000  # in one report
MAX_TENANTS = 100_000  # in one report
MAX_SPENT = 1e15  # requests or tokens of one tenant in one report


class ReportError(ValueError):
    """A load report that is not one."""


class Spending(Protocol):
    """The tenants' rates shared between the processes (``Tenants``)."""

    def spent(self) -> dict[str, list[float]]: ...

    def charge(self, spent: Mapping[str, tuple[float, float]], now: float) -> None: ...


@dataclass
class Peer:
    heard_at: float  # the receiver's monotonic clock
    seq: int
    counts: dict[str, Counts] = field(default_factory=dict)  # url -> in flight, non-zero
    decisions: int = 0  # how many it holds: the fullest answers a snapshot request
    started: bool = False  # done starting (its snapshot loaded, or none came)
    synced: bool = True  # False after a lost report, until its next full one


def _counts(v: Any) -> Counts:
    if (not isinstance(v, list) or len(v) != 3
            or not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)):
        raise ReportError(f"in-flight counts {v!r} are not three counts")
    return v[0], v[1], v[2]


def parse(doc: Mapping[str, Any]) -> tuple[str, int, bool, dict[str, Counts]]:
    """A load report's sender, sequence number, whether it is full, and
    its counts by endpoint URL; ``ReportError`` when it is not one."""
    sender, seq, eps = doc.get("from"), doc.get("seq"), doc.get("eps")
    if not isinstance(sender, str) or not isinstance(seq, int) or not isinstance(eps, dict):
        raise ReportError("a load report needs from, seq and eps")
    if len(eps) > MAX_ENDPOINTS:
        raise ReportError(f"a load report of {len(eps)} endpoints, over {MAX_ENDPOINTS}")
    out: dict[str, Counts] = {}
    for url, v in eps.items():
        out[url] = _counts(v)
    return sender, seq, bool(doc.get("full")), out


def parse_spent(v: Any) -> dict[str, tuple[float, float]]:
    """A report's ``tenants``: requests and tokens spent by tenant;
    ``ReportError`` when it is not that."""
    if not isinstance(v, dict) or len(v) > MAX_TENANTS:
        raise ReportError(f"tenants spent must be a map of at most {MAX_TENANTS}")
    out: dict[str, tuple[float, float]] = {}
    for tenant, amounts in v.items():
        if (not isinstance(amounts, list) or len(amounts) != 2 or not all(
                isinstance(x, int | float) and not isinstance(x, bool)
                and abs(x) <= MAX_SPENT for x in amounts)):
            raise ReportError(f"tenant {tenant!r} spent {amounts!r}: not [requests, tokens]")
        out[tenant] = (float(amounts[0]), float(amounts[1]))
    return out


class Peers:
    def __init__(self, instance: str, pool: Pool, cfg: InflightShareConfig,
                 clock: Callable[[], float], room: Callable[[], None] = lambda: None,
                 spending: Spending | None = None) -> None:
        """``room`` is told when a peer's requests end somewhere (flow
        control may let a waiting request go there); ``spending`` tells
        what this process's tenants spent and is charged the others'."""
        self.instance, self.pool, self.cfg, self.clock = instance, pool, cfg, clock
        self.room, self.spending = room, spending
        self.heartbeat_s = cfg.peer_timeout_s / 4
        self._peers: dict[str, Peer] = {}
        self._sums: dict[str, list[int]] = {}  # url -> the peers' counts added up
        self._sent: dict[str, Counts] = {}  # what this process last reported, non-zero
        self._seq = 0
        self._last_full = -math.inf
        self._seen = -1  # CHANGES.own at the last report
        self.want_full = True  # a new peer appeared: it must hear everything at once

    def __len__(self) -> int:
        return len(self._peers)

    # --- this process's reports --------------------------------------------------
    def report(self, decisions: int, started: bool) -> dict[str, Any] | None:
        """The report due now, if one is: a full one every heartbeat or when
        a new peer appeared, else what changed, if anything did."""
        now = self.clock()
        full = self.want_full or now - self._last_full >= self.heartbeat_s
        spent = self.spending.spent() if self.spending is not None else {}
        if not full and CHANGES.own == self._seen and not spent:
            return None
        self._seen = CHANGES.own
        # an endpoint with nothing in flight has no tokens in flight either
        cur = {e.url: e.own() for e in self.pool if e.own_inflight}
        if full:
            eps = cur
            self._last_full, self.want_full = now, False
        else:
            eps = {u: c for u, c in cur.items() if self._sent.get(u) != c}
            eps.update({u: ZERO for u in self._sent if u not in cur})
            if not eps and not spent:
                return None
        self._sent = cur
        self._seq += 1
        doc = {"kind": "load", "from": self.instance, "seq": self._seq, "full": full,
               "eps": {u: list(c) for u, c in eps.items()}, "decisions": decisions,
               "started": started}
        if spent:
            doc["tenants"] = spent
        return doc

    def goodbye(self) -> dict[str, Any]:
        return {"kind": "load", "from": self.instance, "seq": self._seq + 1, "full": True,
                "eps": {}, "bye": True}

    # --- the others' -------------------------------------------------------------
    def heard(self, doc: Mapping[str, Any]) -> None:
        """Apply a peer's report (``ReportError`` when it is not one)."""
        sender, seq, full, eps = parse(doc)
        if sender == self.instance:
            return
        if doc.get("bye"):
            self._drop(sender)
            return
        if "tenants" in doc and self.spending is not None:
            # what was spent is spent, whatever became of the peer's other reports
            self.spending.charge(parse_spent(doc["tenants"]), self.clock())
        peer = self._peers.get(sender)
        if peer is None:
            if len(self._peers) >= MAX_PEERS:
                return
            peer = self._peers[sender] = Peer(self.clock(), seq, synced=False)
            self.want_full = True
        peer.heard_at = self.clock()
        decisions = doc.get("decisions")
        peer.decisions = decisions if isinstance(decisions, int) else 0
        peer.started = bool(doc.get("started"))
        if full:
            new = {u: c for u, c in eps.items() if c != ZERO}
            self._apply(peer.counts, new)
            peer.counts, peer.synced = new, True
        elif peer.synced and seq == peer.seq + 1:
            new = dict(peer.counts)
            for u, c in eps.items():
                if c == ZERO:
                    new.pop(u, None)
                else:
                    new[u] = c
            self._apply(peer.counts, new)
            peer.counts = new
        else:
            peer.synced = False  # one went missing: its counts wait for the next full one
        peer.seq = seq

    def expire(self) -> list[str]:
        """Drop the peers heard nothing from for peerTimeoutSeconds."""
        cutoff = self.clock() - self.cfg.peer_timeout_s
        gone = [s for s, p in self._peers.items() if p.heard_at < cutoff]
        for s in gone:
            self._drop(s)
        return gone

    def known(self) -> list[str]:
        return list(self._peers)

    def started(self, since: float = -math.inf) -> list[str]:
        """The peers done starting and heard from at ``since`` or after
        (they may be asked for a snapshot: a peer reports only while it is
        subscribed, so one heard since this process subscribed hears the
        request; one known from before may not be back yet)."""
        return [s for s, p in self._peers.items() if p.started and p.heard_at >= since]

    def source(self, since: float = -math.inf) -> str | None:
        """The peer to ask for a snapshot: of those ``started(since)``,
        the one holding the most decisions."""
        ready = [(self._peers[s].decisions, s) for s in self.started(since)]
        return max(ready)[1] if ready else None

    def _drop(self, sender: str) -> None:
        peer = self._peers.pop(sender, None)
        if peer is not None:
            self._apply(peer.counts, {})

    def _apply(self, old: Mapping[str, Counts], new: Mapping[str, Counts]) -> None:
        freed = False
        for u in old.keys() | new.keys():
            a, b = old.get(u, ZERO), new.get(u, ZERO)
            if a == b:
                continue
            freed = freed or b[0] < a[0]
            s = self._sums.setdefault(u, [0, 0, 0])
            for i in range(3):
                s[i] += b[i] - a[i]
            total = (s[0], s[1], s[2])
            if total == ZERO:
                del self._sums[u]
            if (ep := self.pool.get(u)) is not None:
                ep.shared(*total)
        if freed:
            self.room()

    def reapply(self) -> None:
        """Put the peers' counts on endpoints discovery added since."""
        for u, s in self._sums.items():
            if (ep := self.pool.get(u)) is not None and ep.peer_inflight != s[0]:
                ep.shared(s[0], s[1], s[2])
