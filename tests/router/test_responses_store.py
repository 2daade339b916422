"""The in-memory Responses store shares its room between tenants: a tenant
at its share (responses.tenantShare of maxItems and of maxBytes) drops its
own oldest turns for new ones, never another's; the store's total bound
holds whatever the tenants do. A chain's walk costs its input and output
only, up to maxChainBytes."""

from __future__ import annotations

import asyncio

import pytest

from toposerve.router.config import ResponsesStoreConfig
from toposerve.router.responses.store import MemoryStore, read_chain
from toposerve.wire.errors import ApiError

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


def _store(**fields: object) -> MemoryStore:
    return MemoryStore(ResponsesStoreConfig.model_validate(fields))


async def _kept(store: MemoryStore, tenant: str, ids: list[str]) -> list[str]:
    return [i for i in ids if await store.get(i, tenant) is not None]


def test_a_tenant_at_its_share_evicts_only_its_own_turns() -> None:
    async def go() -> None:
        store = _store(maxItems=10, tenantShare=0.3)  # 3 turns a tenant
        victim = [f"resp_v{n}" for n in range(3)]
        for rid in victim:
            await store.put(rid, {"input": "mine"}, "victim")
        flood = [f"resp_a{n}" for n in range(50)]
        for rid in flood:
            await store.put(rid, {"input": "flood"}, "attacker")
        assert await _kept(store, "victim", victim) == victim
        assert await _kept(store, "attacker", flood) == flood[-3:]  # its newest

    asyncio.run(go())


def test_a_tenant_share_bounds_its_bytes_too() -> None:
    """Few large turns fill the bytes long before the count."""
    async def go() -> None:
        store = _store(maxBytes=20_000, tenantShare=0.5)  # 10,000 bytes a tenant
        await store.put("resp_small", {"input": "x" * 500}, "victim")
        big = [f"resp_big{n}" for n in range(20)]
        for rid in big:
            await store.put(rid, {"input": "y" * 3000}, "attacker")
        assert await store.get("resp_small", "victim") is not None
        assert await _kept(store, "attacker", big) == big[-3:]
        assert store.bytes <= 20_000

    asyncio.run(go())


def test_the_total_bound_holds_over_tenants_under_their_share() -> None:
    """Five tenants of three turns each, in a store of ten: the oldest go,
    whoever's they are."""
    async def go() -> None:
        store = _store(maxItems=10, tenantShare=0.3)
        ids = [(f"t{n % 5}", f"resp_{n}") for n in range(15)]
        for tenant, rid in ids:
            await store.put(rid, {"input": rid}, tenant)
        kept = [rid for tenant, rid in ids if await store.get(rid, tenant) is not None]
        assert kept == [rid for _, rid in ids[5:]]

    asyncio.run(go())


def test_without_keys_the_one_tenant_has_the_whole_store() -> None:
    """No keys: every client is the tenant "", which nothing shares with."""
    async def go() -> None:
        store = _store(maxItems=10, tenantShare=0.3)
        ids = [f"resp_{n}" for n in range(12)]
        for rid in ids:
            await store.put(rid, {"input": rid}, "")
        assert await _kept(store, "", ids) == ids[2:]

    asyncio.run(go())


def test_deleting_and_expiry_keep_the_shares_counted() -> None:
    """A tenant's deleted and expired turns leave its share: it has room
    for as many new ones, without dropping the rest."""
    async def go() -> None:
        store = _store(maxItems=10, tenantShare=0.3, ttlSeconds=60)
        for n in range(3):
            await store.put(f"resp_{n}", {"input": n}, "t")
        assert await store.delete("resp_0", "t")
        await store.put("resp_3", {"input": 3}, "t")
        assert await _kept(store, "t", ["resp_1", "resp_2", "resp_3"]) == [
            "resp_1", "resp_2", "resp_3"]
        assert store.sweep(now=float("inf")) == 3
        assert store.bytes == 0
        for n in range(4, 7):
            await store.put(f"resp_{n}", {"input": n}, "t")
        assert await _kept(store, "t", ["resp_4", "resp_5", "resp_6"]) == [
            "resp_4", "resp_5", "resp_6"]

    asyncio.run(go())


def test_a_chain_walk_reads_neither_responses_nor_past_its_bytes() -> None:
    """A turn's response (which may echo a megabyte of instructions each
    turn) is read by GET only; and the walk stops at the turn that takes it
    over maxChainBytes. A 150-byte continuation of 200 such turns read them
    all, 200 MB, on the event loop (/health took 3.4 s)."""
    async def go() -> None:
        store = _store()
        echo = {"instructions": "i" * 1_000_000, "output": []}
        previous = None
        for n in range(20):
            await store.put(f"resp_{n}", {"input": "x" * 1000, "output": {"content": "y"},
                                          "previous": previous, "response": echo}, "t")
            previous = f"resp_{n}"
        rec = await store.get("resp_19", "t")
        assert rec is not None and "response" not in rec
        assert await store.response("resp_19", "t") == echo
        assert await store.response("resp_19", "other") is None
        reads: list[str] = []
        real_get = store.get

        async def counted(rid: str, tenant: str) -> dict[str, object] | None:
            reads.append(rid)
            return await real_get(rid, tenant)

        store.get = counted  # type: ignore[method-assign]
        ids, turns = await read_chain(store, "resp_19", "t", 100, 10**6) or ([], [])
        assert len(ids) == len(turns) == 20
        reads.clear()
        with pytest.raises(ApiError, match="maxChainBytes") as err:
            await read_chain(store, "resp_19", "t", 100, 5000)
        assert err.value.status == 413 and len(reads) == 5  # 5 turns of ~1 KB: over 5,000

    asyncio.run(go())
