"""The publisher's decisions as pure functions: splitting, names,
generations, what counts as unchanged, dropped-field reports."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import orjson

from toposerve.dra_driver.resourceslice import slice_plan as sp
from toposerve.dra_driver.resourceslice.slice_plan import Pool
from toposerve.kubeapi import Reflector

DRIVER = "gpu.toposerve.io"


def _dev(i: int, **extra: Any) -> dict[str, Any]:
    return {"name": f"dev-{i}", "attributes": {"index": {"int": i}}, **extra}


def _observed(want: sp.DesiredPool, generation: int, rv: int = 1,
              mutate: Any = None) -> list[sp.Observed]:
    """What the apiserver would hold after the plan's writes, as objects."""
    out = []
    for i, d in enumerate(want.slices):
        obj = {"metadata": {"name": d.name, "uid": f"u{i}", "resourceVersion": str(rv),
                            "ownerReferences": [{"kind": "Node", "name": want.node_name}]},
               "spec": {"driver": DRIVER, "nodeName": want.node_name,
                        "pool": {"name": want.pool, "generation": generation,
                                 "resourceSliceCount": len(want.slices)},
                        d.key: orjson.loads(d.items())}}
        if mutate:
            mutate(i, obj)
        out.append(sp.observe(obj))
    return out


def test_split_limits() -> None:
    plain = Pool(name="n", node_name="n", devices=tuple(_dev(i) for i in range(200)))
    assert [(k, len(c)) for k, c in sp.split(plain)] == [("devices", 128), ("devices", 72)]
    tainted = Pool(name="n", node_name="n", devices=tuple(
        _dev(i, **({"taints": [{"key": "k", "effect": "NoSchedule"}]} if i == 150 else {}))
        for i in range(200)))
    assert [len(c) for _, c in sp.split(tainted)] == [64, 64, 64, 8]
    counters = Pool(name="n", node_name="n", devices=(_dev(0),), shared_counters=tuple(
        {"name": f"c{i}", "counters": {"x": {"value": "1"}}} for i in range(10)))
    assert [(k, len(c)) for k, c in sp.split(counters)] == [
        ("sharedCounters", 8), ("sharedCounters", 2), ("devices", 1)]
    assert sp.split(Pool(name="n", node_name="n", devices=())) == [("devices", ())]


def test_names_deterministic_and_valid() -> None:
    assert sp.slice_name(DRIVER, "node-1", 3, 12) == "node-1-gpu.toposerve.io-03"
    long = sp.slice_name(DRIVER, "x" * 250, 0, 1)
    assert len(long) <= 253 and long == sp.slice_name(DRIVER, "x" * 250, 0, 1)
    assert sp.slice_name(DRIVER, "x" * 250, 0, 1) != sp.slice_name(DRIVER, "x" * 249 + "y", 0, 1)
    assert "/" not in sp.slice_name(DRIVER, "a/b", 0, 1)


def test_plan_create_then_steady_then_bump() -> None:
    pool = Pool(name="n1", node_name="n1", node_uid="uid-1",
                devices=tuple(_dev(i) for i in range(200)))
    want = sp.desired_pool(DRIVER, pool)
    first = sp.plan(DRIVER, want, [])
    assert first.generation == 1 and [w.create for w in first.writes] == [True, True]
    body = first.writes[0].body
    assert body["metadata"]["ownerReferences"][0] == {
        "apiVersion": "v1", "kind": "Node", "name": "n1", "uid": "uid-1", "controller": True}
    assert body["spec"]["pool"] == {"name": "n1", "generation": 1, "resourceSliceCount": 2}
    have = _observed(want, 1)
    assert sp.plan(DRIVER, want, have).empty()
    # one device changes: a new generation, every slice rewritten in place
    changed = sp.desired_pool(DRIVER, Pool(name="n1", node_name="n1", devices=(
        *pool.devices[:-1], _dev(999))))
    p = sp.plan(DRIVER, changed, have)
    assert p.generation == 2 and len(p.writes) == 2 and not any(w.create for w in p.writes)
    assert all(w.body["spec"]["pool"]["generation"] == 2 for w in p.writes)
    assert all(w.body["metadata"]["resourceVersion"] == "1" for w in p.writes)


def test_plan_repairs_drift() -> None:
    want = sp.desired_pool(DRIVER, Pool(name="n1", node_name="n1", node_uid="u",
                                        devices=tuple(_dev(i) for i in range(200))))
    have = _observed(want, 4)
    # a deleted slice: recreated, the pool's generation bumped
    p = sp.plan(DRIVER, want, have[1:])
    assert p.generation == 5 and [w.create for w in p.writes] == [True, False]

    # an edited slice
    def edit(i: int, obj: dict[str, Any]) -> None:
        if i == 1:
            obj["spec"]["devices"][0]["attributes"]["index"] = {"int": -1}
    p = sp.plan(DRIVER, want, _observed(want, 4, mutate=edit))
    assert p.generation == 5 and len(p.writes) == 2
    # a stranger's slice in our pool, and a leftover of an older generation
    stray = sp.observe({"metadata": {"name": "n1-old", "uid": "x", "resourceVersion": "1"},
                        "spec": {"pool": {"name": "n1", "generation": 1}}})
    p = sp.plan(DRIVER, want, [*have, stray])
    assert p.deletes == (stray,) and not p.writes
    # lost owner reference or label: fixed in place, generation kept
    def unown(i: int, obj: dict[str, Any]) -> None:
        if i == 0:
            obj["metadata"]["ownerReferences"] = []
    p = sp.plan(DRIVER, want, _observed(want, 4, mutate=unown), labels={})
    assert p.generation == 4 and [w.name for w in p.writes] == [want.slices[0].name]
    p = sp.plan(DRIVER, want, have, labels={"a": "b"})
    assert len(p.writes) == 2 and p.writes[0].body["metadata"]["labels"] == {"a": "b"}
    # the pool is no longer wanted
    assert sp.plan(DRIVER, None, have).deletes == tuple(have)


def test_server_form_counts_as_unchanged() -> None:
    want = sp.desired_pool(DRIVER, Pool(name="n", node_name="n", devices=(_dev(0),)))

    def normalise(i: int, obj: dict[str, Any]) -> None:
        obj["spec"]["devices"][0]["capacity"] = {"memory": {"value": "1Gi"}}
    have = _observed(want, 1, mutate=normalise)
    assert not sp.plan(DRIVER, want, have).empty()
    forms = {want.slices[0].name: (want.slices[0].digest, have[0].digest)}
    assert sp.plan(DRIVER, want, have, server_forms=forms).empty()


def test_taint_times_kept_and_ignored() -> None:
    taint = {"key": "gpu.toposerve.io/unhealthy", "effect": "NoSchedule"}
    want = sp.desired_pool(DRIVER, Pool(name="n", node_name="n", devices=(
        _dev(0, taints=[taint]), _dev(1))))

    def stamp(i: int, obj: dict[str, Any]) -> None:
        obj["spec"]["devices"][0]["taints"][0]["timeAdded"] = "2026-12-01T00:00:00Z"
    have = _observed(want, 1, mutate=stamp)
    assert sp.plan(DRIVER, want, have).empty()
    moved = sp.desired_pool(DRIVER, Pool(name="n", node_name="n", devices=(
        _dev(0, taints=[taint]), _dev(2))))
    w = sp.plan(DRIVER, moved, have).writes[0]
    assert w.body["spec"]["devices"][0]["taints"][0]["timeAdded"] == "2026-12-01T00:00:00Z"


def test_dropped_fields_named_by_gate() -> None:
    sent = {"devices": [{"name": "d0", "taints": [{"key": "k"}],
                         "consumesCounters": [{"counterSet": "c"}],
                         "attributes": {"a": {"ints": [1, 2]}, "b": {"int": 1}}}]}
    got = {"devices": [{"name": "d0", "attributes": {"a": {}, "b": {"int": 1}}}]}
    assert sorted(sp.dropped_fields(sent, got)) == [
        ("spec.devices[d0].attributes.a.ints", "DRAListTypeAttributes"),
        ("spec.devices[d0].consumesCounters", "DRAPartitionableDevices"),
        ("spec.devices[d0].taints", "DRADeviceTaints")]
    assert sp.dropped_fields({"sharedCounters": [{"name": "c"}]}, {}) == [
        ("spec.sharedCounters", "DRAPartitionableDevices")]
    assert sp.dropped_fields({"x": 1}, {"x": 1}) == []


class _Apiserver:
    """Answers a Reflector as an apiserver does: a LIST, watches from the
    version asked for (events, a bookmark), and 410 Gone for one too old."""

    def __init__(self) -> None:
        self.lists = 0
        self.watched_from: list[str] = []
        self.reflector: Reflector | None = None

    def request(self, method: str, path: str, query: Any = (), body: Any = None,
                timeout: float = 30, accept: str = "") -> Any:
        self.lists += 1
        return {"items": [], "metadata": {"resourceVersion": str(10 * self.lists)}}

    def stream(self, path: str, query: Any, read_timeout: float,
               opened: Any) -> Iterator[dict[str, Any]]:
        self.watched_from.append(dict(query)["resourceVersion"])
        n = len(self.watched_from)
        if n == 1:
            yield {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "11"}}}
            yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "15"}}}
        elif n == 2:  # the server timed the watch out; then compaction passed version 15
            yield {"type": "ERROR", "object": {"code": 410, "message": "too old"}}
        else:
            assert self.reflector is not None
            self.reflector.stop()


def test_reflector_resumes_and_relists_only_on_gone() -> None:
    server = _Apiserver()
    events: list[str] = []
    r = Reflector(server, "/x", [], lambda items, rv: events.append(f"list@{rv}"),  # type: ignore[arg-type]
                  lambda kind, obj: events.append(kind), lambda err: events.append(str(err)))
    server.reflector = r
    r.run()
    assert server.watched_from == ["10", "15", "20"]
    assert events == ["list@10", "ADDED", "list@20"]
    assert (r.lists, r.watches) == (2, 3)
