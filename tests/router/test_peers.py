"""In-flight counts shared between router processes (pure): a process
reports what changed and, every heartbeat, everything; a receiver adds
each peer's latest counts to the endpoints, waits for a full report after
a lost one, and forgets a peer that says goodbye or goes silent."""

from __future__ import annotations

from typing import Any

import pytest

from toposerve.router.admission.tenants import Tenants
from toposerve.router.config import FlowControlConfig, InflightShareConfig
from toposerve.router.ha.peers import Peers, ReportError
from toposerve.router.pool.endpoints import Endpoint, Pool

pytestmark = pytest.mark.unit
URLS = ["http://a:1", "http://b:1"]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _pool() -> Pool:
    pool = Pool()
    for u in URLS:
        pool.upsert(Endpoint(u))
    return pool


def _ep(pool: Pool, i: int) -> Endpoint:
    ep = pool.get(URLS[i])
    assert ep is not None
    return ep


def _pair() -> tuple[Peers, Peers, Clock]:
    clock = Clock()
    cfg = InflightShareConfig(interval_s=0.01, peer_timeout_s=2)
    return Peers("a", _pool(), cfg, clock), Peers("b", _pool(), cfg, clock), clock


def _send(src: Peers, dst: Peers) -> dict[str, Any] | None:
    doc = src.report(decisions=0, started=True)
    if doc is not None:
        dst.heard(doc)
    return doc


def test_a_peers_requests_count_with_the_receivers_own() -> None:
    a, b, _ = _pair()
    _send(a, b)  # the first report is full: b knows a
    _ep(a.pool, 0).begin(100, 80)
    _ep(a.pool, 0).begin(50, 50)
    _ep(b.pool, 0).begin(10, 10)
    doc = _send(a, b)
    assert doc is not None and not doc["full"] and doc["eps"] == {URLS[0]: [2, 150, 130]}
    there = _ep(b.pool, 0)
    assert (there.inflight, there.inflight_tokens, there.prefill_tokens) == (3, 160, 140)
    assert there.own() == (1, 10, 10) and there.peer_inflight == 2
    # nothing changed: nothing sent
    assert a.report(0, True) is None
    _ep(a.pool, 0).first_byte(80)
    _ep(a.pool, 0).end(100, 0)
    _ep(a.pool, 0).end(50, 50)
    doc = _send(a, b)
    assert doc is not None and doc["eps"] == {URLS[0]: [0, 0, 0]}
    assert (there.inflight, there.inflight_tokens, there.prefill_tokens) == (1, 10, 10)


def test_a_lost_report_is_made_good_by_the_next_full_one() -> None:
    a, b, clock = _pair()
    _send(a, b)
    _ep(a.pool, 1).begin(10, 0)
    assert a.report(0, True) is not None  # lost on the way
    _ep(a.pool, 1).begin(10, 0)
    _send(a, b)  # its sequence number skips one: not applied
    assert _ep(b.pool, 1).inflight == 0
    clock.t += a.heartbeat_s
    doc = _send(a, b)
    assert doc is not None and doc["full"]
    assert _ep(b.pool, 1).inflight == 2


def test_a_silent_peer_stops_counting_and_one_that_says_goodbye_at_once() -> None:
    a, b, clock = _pair()
    c = Peers("c", _pool(), a.cfg, clock)
    for src in (a, c):
        _ep(src.pool, 0).begin(1, 0)
        _send(src, b)
    assert _ep(b.pool, 0).inflight == 2 and len(b) == 2
    b.heard(c.goodbye())
    assert _ep(b.pool, 0).inflight == 1 and len(b) == 1
    clock.t += 1.9
    assert b.expire() == []
    clock.t += 0.2
    assert b.expire() == ["a"]
    assert _ep(b.pool, 0).inflight == 0 and _ep(b.pool, 0).peer_inflight == 0


def test_a_new_peer_gets_a_full_report_and_the_fullest_started_one_is_asked() -> None:
    a, b, _ = _pair()
    _send(a, b)
    _ep(a.pool, 0).begin(1, 0)
    b.report(0, True)
    c = Peers("c", _pool(), a.cfg, a.clock)
    _send(c, a)  # a hears a newcomer: its next report holds everything
    doc = a.report(0, True)
    assert doc is not None and doc["full"] and doc["eps"] == {URLS[0]: [1, 1, 0]}
    b.heard({"kind": "load", "from": "x", "seq": 1, "full": True, "eps": {},
             "decisions": 900, "started": False})  # the fullest, but still starting
    b.heard({"kind": "load", "from": "y", "seq": 1, "full": True, "eps": {},
             "decisions": 40, "started": True})
    assert b.source() == "y"


def test_a_peer_is_asked_only_once_heard_on_this_subscription() -> None:
    """After Redis comes back, a peer known from before may not have
    resubscribed yet (a request sent it then is lost): it is offered only
    once heard since this process subscribed again."""
    a, b, clock = _pair()
    _send(a, b)
    clock.t += 0.5
    since = clock()  # b subscribes again; a (heard 0.5 s ago) not yet
    assert b.started(since) == [] and b.source(since) is None
    assert b.started() == ["a"]  # still known: its counts still weigh
    clock.t += 0.1
    _send(a, b)
    assert b.started(since) == ["a"] and b.source(since) == "a"


def test_an_endpoint_discovery_adds_later_gets_the_peers_counts() -> None:
    a, b, _ = _pair()
    late = Endpoint("http://late:1")
    a.pool.upsert(Endpoint("http://late:1"))
    a.pool.get("http://late:1").begin(5, 5)  # type: ignore[union-attr]
    _send(a, b)
    b.pool.upsert(late)
    assert late.inflight == 0
    b.reapply()
    assert late.inflight == 1


@pytest.mark.parametrize("doc", [
    {"kind": "load", "from": "x", "seq": 1},
    {"kind": "load", "from": "x", "seq": "1", "eps": {}},
    {"kind": "load", "from": "x", "seq": 1, "eps": {"u": [1, 2]}},
    {"kind": "load", "from": "x", "seq": 1, "eps": {"u": [1, -2, 0]}},
    {"kind": "load", "from": "x", "seq": 1, "eps": {"u": [True, 0, 0]}},
])
def test_what_is_not_a_report_is_refused(doc: dict[str, Any]) -> None:
    _, b, _ = _pair()
    with pytest.raises(ReportError):
        b.heard(doc)
    assert len(b) == 0


def _tenants(rps: float) -> Tenants:
    return Tenants(FlowControlConfig.model_validate({"tenants": {
        "tenants": [{"name": "team-a", "requestsPerSecond": rps, "tokensPerSecond": 1000}]}}))


def _sharing_pair(rps: float) -> tuple[Peers, Peers, Tenants, Tenants, Clock]:
    clock = Clock()
    cfg = InflightShareConfig(interval_s=0.01, peer_timeout_s=2)
    ta, tb = _tenants(rps), _tenants(rps)
    return (Peers("a", _pool(), cfg, clock, spending=ta),
            Peers("b", _pool(), cfg, clock, spending=tb), ta, tb, clock)


def test_a_tenants_rate_holds_across_processes_that_tell_each_other() -> None:
    a, b, ta, tb, clock = _sharing_pair(rps=2)
    _send(a, b)
    _send(b, a)
    admitted = 0
    for i in range(40):  # 10 s, a request every 0.25 s, to a and b in turn
        clock.t += 0.25
        here, there = (ta, a), (tb, b)
        (t, p), (_, q) = (here, there) if i % 2 == 0 else (there, here)
        if t.over_limit("team-a", 10, clock.t) is None:
            admitted += 1
        _send(p, q)  # the report after the decision reaches the other
    # one burst each (2 + 2), then 2 a second between them; apart, each would
    # admit all of its 20 (one every 0.5 s, under its own 2/s)
    assert admitted <= 2 * 2 + 2 * 10 + 1, admitted
    assert admitted >= 2 * 10 - 1, admitted


def test_processes_that_do_not_tell_each_other_each_allow_the_rate() -> None:
    ta, tb, clock = _tenants(2), _tenants(2), Clock()
    admitted = 0
    for i in range(40):
        clock.t += 0.25
        admitted += (ta if i % 2 == 0 else tb).over_limit("team-a", 10, clock.t) is None
    assert admitted == 40  # each sees one request every 0.5 s: under its own 2/s


def test_spent_rides_on_a_report_even_with_nothing_in_flight_changed() -> None:
    a, b, ta, tb, clock = _sharing_pair(rps=1)
    _send(a, b)
    assert a.report(decisions=0, started=True) is None  # nothing new
    assert ta.over_limit("team-a", 10, clock.t) is None
    doc = a.report(decisions=0, started=True)
    assert doc is not None and doc["tenants"] == {"team-a": [1.0, 10.0]}
    b.heard(doc)
    assert tb.over_limit("team-a", 10, clock.t) is not None  # its one a second is spent


@pytest.mark.parametrize("tenants", [[], {"t": [1]}, {"t": ["1", 2]}, {"t": [True, 1]},
                                     {"t": [1e16, 0]}])
def test_a_malformed_spent_is_refused(tenants: Any) -> None:
    a, b, _, _, _ = _sharing_pair(rps=1)
    doc = a.report(decisions=0, started=True)
    assert doc is not None
    with pytest.raises(ReportError):
        b.heard({**doc, "tenants": tenants})
