"""The routing snapshot a starting replica gets from a running one: the
decision log's bounds and format (pure), and the exchange over a real
redis-server: the new replica holds what it hears, asks the peer its
load reports name, loads the snapshot, then applies only what came after
it; a corrupt snapshot is logged, counted and ignored, and the replica
goes on."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
from collections.abc import Callable, Coroutine
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis

from toposerve.router.config import RouterConfig, SnapshotConfig
from toposerve.router.ha.bus import RedisBus
from toposerve.router.ha.replication import Replication
from toposerve.router.ha.snapshot import VERSION, DecisionLog, SnapshotError, parse
from toposerve.router.pool.endpoints import Endpoint, Pool
from toposerve.router.pool.static import load_static
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.profile import Scheduler
from toposerve.router.state import RouterState

URLS = [f"http://127.0.0.1:{p}" for p in (9001, 9002, 9003)]
CHANNEL = "toposerve:decisions:test/snapshot"


def _doc(session: str | None, seq: int, url: str = URLS[0]) -> dict[str, Any]:
    return {"from": "a#1", "seq": seq, "stage": "profile", "url": url, "session": session,
            "blocks": {"64": [seq, seq + 1]}}


def test_log_keeps_a_sessions_last_decision_within_its_budget() -> None:
    log = DecisionLog(max_bytes=10_000)
    for seq in range(1, 4):
        doc = _doc("s1", seq)
        log.add(doc, orjson.dumps(doc))
    assert len(log) == 1  # the session's last decision holds its prefix
    for seq in range(4, 200):
        doc = _doc(None, seq)
        log.add(doc, orjson.dumps(doc))
    assert log.bytes <= 10_000 and 1 < len(log) < 197  # the oldest went
    snap = parse(log.snapshot({"a#1": 199}), 10_000)
    assert snap.seqs == {"a#1": 199}
    assert snap.entries[-1]["seq"] == 199  # applied order: the latest last


@pytest.mark.parametrize("raw, why", [
    (b"{not json", "not JSON"),
    (orjson.dumps({"version": VERSION + 1, "seqs": {}, "entries": []}), "version"),
    (orjson.dumps({"version": VERSION, "seqs": {"a": "x"}, "entries": []}), "seqs"),
    (orjson.dumps({"version": VERSION, "seqs": {}, "entries": [{"url": 3}]}), "decision"),
    (orjson.dumps({"version": VERSION, "seqs": {}, "entries": [
        {"url": "u", "blocks": {"64": ["x"]}}]}), "block keys"),
    (orjson.dumps({"version": VERSION, "seqs": {}, "entries": [
        {"url": "u" * 2000}]}), "over the limit"),
])
def test_unusable_snapshots_are_refused_whole(raw: bytes, why: str) -> None:
    with pytest.raises(SnapshotError, match=why):
        parse(raw, 1000)


def _replica(url: str, identity: str, counts: dict[str, float], enabled: bool = True,
             wait_s: float = 5) -> Replication:
    cfg = RouterConfig.model_validate({
        "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
        "discovery": {"static": [{"url": u} for u in URLS]}})
    state = RouterState(cfg)
    load_static(state.pool, cfg.discovery.static)

    def count(outcome: str, n: int = 1) -> None:
        counts[outcome] = counts.get(outcome, 0) + n

    return Replication(RedisBus(url, CHANNEL), identity,
                       {"profile": Scheduler(state, cfg.profile, None)}, state.pool, count,
                       SnapshotConfig(enabled=enabled, wait_s=wait_s),
                       lambda outcome: count(f"snapshot-{outcome}"))


def _endpoint(pool: Pool, i: int) -> Endpoint:
    ep = pool.get(URLS[i % len(URLS)])
    assert ep is not None
    return ep


async def _until(what: str, cond: Callable[[], bool], timeout: float = 10) -> None:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not cond():
        assert loop.time() < end, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def _run(body: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(body())


def test_a_late_replica_loads_the_snapshot_then_only_what_follows(redis_url: str) -> None:
    async def go() -> None:
        lc: dict[str, float] = {}
        sc: dict[str, float] = {}
        # alone, it starts once its own (short) wait for a snapshot is over
        leader = _replica(redis_url, "a", lc, wait_s=0.2)
        leader.start()
        await _until("started", lambda: leader.started)
        for i in range(10):
            ctx = RequestContext(model=None, prompt=f"prompt {i}".encode(), session=f"s{i}")
            ctx.byte_blocks(64)
            leader.decided("profile", ctx, _endpoint(leader.pool, i))
        await _until("sent", lambda: lc.get("sent", 0) == 10)
        standby = _replica(redis_url, "b", sc)
        standby.start()
        await _until("loaded", lambda: sc.get("snapshot-loaded", 0) == 1)
        assert lc["snapshot-written"] == 1
        assert len(standby.log) == 10 and standby._applied[leader.instance] == 10
        # one the snapshot held, again (a message still queued when it was
        # written), then a new one: only the new one is applied
        r = aioredis.from_url(redis_url)
        again = orjson.dumps({**_doc("s3", 3, URLS[0]), "from": leader.instance})
        new = orjson.dumps({**_doc("s10", 11, URLS[1]), "from": leader.instance})
        await r.publish(CHANNEL, again)
        await r.publish(CHANNEL, new)
        await _until("the new one", lambda: sc.get("received", 0) == 1)
        assert standby._applied[leader.instance] == 11 and len(standby.log) == 11
        await r.aclose()
        await standby.close()
        await leader.close()

    _run(go)


def test_a_corrupt_snapshot_is_ignored_and_the_replica_goes_on(redis_url: str) -> None:
    async def go() -> None:
        sc: dict[str, float] = {}
        r = aioredis.from_url(redis_url)
        standby = _replica(redis_url, "b", sc)
        async with r.pubsub() as ps:
            await ps.subscribe(CHANNEL)
            standby.start()
            # a peer of another build, which says it has started, answers
            # the request with garbage
            report = orjson.dumps({"kind": "load", "from": "other#1", "seq": 1, "full": True,
                                   "eps": {}, "decisions": 5, "started": True})
            end = asyncio.get_running_loop().time() + 10
            doc: dict[str, Any] = {}
            while doc.get("kind") != "snapshot-request":
                assert asyncio.get_running_loop().time() < end, "no snapshot request"
                await r.publish(CHANNEL, report)
                # None for the subscription's own confirmation
                msg = await ps.get_message(ignore_subscribe_messages=True, timeout=0.2)
                doc = orjson.loads(msg["data"]) if msg is not None else {}
            assert doc["to"] == "other#1"
            held = orjson.dumps({**_doc("s1", 1, URLS[2]), "from": "other#1"})
            await r.publish(CHANNEL, held)  # heard while it waits: applied after
            await r.set(f"{CHANNEL}:snapshot:{doc['nonce']}", b"\x00garbage")
            await r.publish(CHANNEL, orjson.dumps({"kind": "snapshot", "from": "other#1",
                                                   "nonce": doc["nonce"]}))
        await _until("ignored", lambda: sc.get("snapshot-ignored", 0) == 1)
        await _until("the held message", lambda: sc.get("received", 0) == 1)
        assert "snapshot-loaded" not in sc
        await r.aclose()
        await standby.close()

    _run(go)


def test_the_log_holds_its_entries_at_their_own_size() -> None:
    """50,000 small decisions (about 6 MB of JSON) cost the process tens of
    MiB, not the ~200 MiB that orjson's results held as returned."""
    code = textwrap.dedent("""
        import orjson
        from toposerve.router.ha.snapshot import DecisionLog
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * 4096
        log = DecisionLog(max_bytes=1 << 30)
        before = rss()
        for seq in range(50_000):
            doc = {"from": "a#1", "seq": seq, "stage": "profile", "url": "u",
                   "session": None, "blocks": {"64": [seq, seq + 1]}}
            log.add(doc, orjson.dumps(doc))
        print(rss() - before, log.bytes)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    grown, held = int(out[0]), int(out[1])
    assert held > 4_000_000
    assert grown < 8 * held, f"RSS grew {grown >> 20} MiB for {held >> 20} MiB of entries"
