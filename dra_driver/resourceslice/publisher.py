"""The ResourceSlice publisher: desired pools in, minimal writes out, the
same for the real drivers (one node) and ``driver simulate`` (every kwok
node). Modelled on Go's ``k8s.io/dynamic-resource-allocation/resourceslice``
controller:

- one watch on the driver's slices (resumed from its resourceVersion,
  relisted only on 410 Gone), kept as a compact store;
- a mutation cache: a slice we wrote counts as there until the watch shows
  that version or a newer one, so a write is never made twice;
- a work queue of pool names with bounded concurrent workers, per-pool
  exponential backoff on errors (an apiserver outage is retried, never
  dropped), and a short delay after watch events so a burst is one sync;
- drift repair: a slice deleted or edited by someone else (or every slice
  wiped by a restarting kubelet) is seen on the watch and rewritten;
- a field the apiserver silently dropped is reported by its feature gate.

What to write is decided in ``slice_plan`` (pure functions).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
import structlog
from prometheus_client import Counter, Gauge

from toposerve.dra_driver.resourceslice import slice_plan
from toposerve.dra_driver.resourceslice.slice_plan import DesiredPool, Observed, Pool, Write
from toposerve.kubeapi import ApiError, JsonApi, Reflector, WorkQueue, backoff

__all__ = ["ReconcileStats", "SlicePublisher"]

log = structlog.get_logger("toposerve.dra.publisher")

SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"

WRITES = Counter("toposerve_dra_slice_writes", "ResourceSlice API writes by the publisher",
                 ["driver", "op"])
ERRORS = Counter("toposerve_dra_publisher_errors", "Publisher errors (each one is retried)",
                 ["driver", "kind"])
DROPPED = Counter("toposerve_dra_dropped_fields",
                  "Slice fields the apiserver dropped, by the feature gate that is off",
                  ["driver", "gate"])
SLICES = Gauge("toposerve_dra_slices", "ResourceSlices of the driver the watch shows", ["driver"])
POOLS = Gauge("toposerve_dra_pools", "Pools the driver wants published", ["driver"])


@dataclass
class ReconcileStats:
    creates: int = 0
    updates: int = 0
    deletes: int = 0

    @property
    def writes(self) -> int:
        return self.creates + self.updates + self.deletes

    def add(self, other: ReconcileStats) -> None:
        self.creates += other.creates
        self.updates += other.updates
        self.deletes += other.deletes


class _Store:
    """The driver's slices as the watch shows them, overlaid with our own
    writes the watch has not shown yet (the mutation cache). Compact
    ``Observed`` records, indexed by pool."""

    def __init__(self, ttl: float, clock: Callable[[], float]) -> None:
        self._lock = threading.Lock()
        self._watched: dict[str, Observed] = {}
        # name -> (what we wrote, or None for a delete; uid deleted; expiry)
        self._pending: dict[str, tuple[Observed | None, str, float]] = {}
        self._by_pool: dict[str, set[str]] = {}
        self._ttl = ttl
        self._clock = clock
        self.synced = False

    def _index(self, obs: Observed) -> None:
        self._by_pool.setdefault(obs.pool, set()).add(obs.name)

    def _current(self, name: str) -> Observed | None:
        w = self._watched.get(name)
        p = self._pending.get(name)
        if p is None:
            return w
        obs, deleted_uid, expiry = p
        if self._clock() > expiry:
            del self._pending[name]
            return w
        if obs is None:  # our delete, not yet seen: gone unless recreated since
            return w if w is not None and w.uid != deleted_uid else None
        if w is not None and w.resource_version >= obs.resource_version:
            del self._pending[name]
            return w
        return obs

    def pool(self, pool: str) -> list[Observed]:
        with self._lock:
            names = self._by_pool.get(pool, set())
            out = [o for n in sorted(names) if (o := self._current(n)) is not None
                   and o.pool == pool]
            # forget names that no longer hold anything of this pool
            for n in [n for n in names if (o := self._current(n)) is None or o.pool != pool]:
                names.discard(n)
            if not names:
                self._by_pool.pop(pool, None)
            return out

    def pools(self) -> set[str]:
        with self._lock:
            return set(self._by_pool)

    def count(self) -> int:
        with self._lock:
            return len(self._watched)

    def wrote(self, obs: Observed) -> None:
        with self._lock:
            self._pending[obs.name] = (obs, "", self._clock() + self._ttl)
            self._index(obs)

    def deleted(self, obs: Observed) -> None:
        with self._lock:
            self._pending[obs.name] = (None, obs.uid, self._clock() + self._ttl)

    def replace(self, items: Sequence[Observed], list_rv: int) -> set[str]:
        """A fresh LIST; returns the pools whose slices changed."""
        with self._lock:
            old = self._watched
            self._watched = {o.name: o for o in items}
            for name, (obs, _, _) in list(self._pending.items()):
                if obs is None or obs.resource_version <= list_rv:
                    del self._pending[name]
            for o in items:
                self._index(o)
            self.synced = True
            changed = {o.pool for n, o in old.items() if self._watched.get(n) != o}
            return changed | {o.pool for n, o in self._watched.items() if old.get(n) != o}

    def event(self, kind: str, obs: Observed) -> set[str]:
        with self._lock:
            before = self._watched.get(obs.name)
            if kind == "DELETED":
                self._watched.pop(obs.name, None)
                p = self._pending.get(obs.name)
                if p is not None and (p[0] is None
                                      or p[0].resource_version <= obs.resource_version):
                    del self._pending[obs.name]
            else:
                self._watched[obs.name] = obs
                self._index(obs)
            return {obs.pool} | ({before.pool} if before else set())


class SlicePublisher:
    """Publishes the pools of one driver and keeps them published.

    ``node_name`` scopes the publisher to one node's slices (the real
    driver: its watch selects ``spec.nodeName``). ``labels`` are put on
    every slice and select the watch, so two publishers of one driver
    (``driver simulate`` beside real nodes) never touch each other's."""

    def __init__(self, api: Any, driver: str, *, node_name: str | None = None,
                 labels: Mapping[str, str] | None = None, workers: int = 8,
                 sync_delay: float = 1.0, mutation_ttl: float = 60.0,
                 watch_timeout: int = 300, max_backoff: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.driver = driver
        self._rest = JsonApi(api)
        self._node_name = node_name
        self._labels = dict(labels or {})
        self._workers_n = workers
        self._sync_delay = sync_delay
        self._watch_timeout = watch_timeout
        self._max_backoff = max_backoff
        self._clock = clock
        self._store = _Store(mutation_ttl, clock)
        self._queue = WorkQueue(clock)
        self._lock = threading.Lock()
        self._desired: dict[str, DesiredPool] = {}
        self._forms: dict[str, tuple[str, str]] = {}
        self._node_uids: dict[str, str] = {}
        self._pool_locks: dict[str, threading.Lock] = {}
        self._failures: dict[str, int] = {}
        self._dropped: dict[str, list[tuple[str, str]]] = {}
        self._threads: list[threading.Thread] = []
        self._stopping = threading.Event()
        self._desired_known = threading.Event()
        self._reflector = self._new_reflector()
        self.stats = ReconcileStats()
        self.last_error = ""

    def _new_reflector(self) -> Reflector:
        return Reflector(self._rest, SLICES_PATH, self._selectors(), self._on_list,
                         self._on_event, lambda err: self._error("watch", err),
                         timeout=self._watch_timeout, max_backoff=self._max_backoff,
                         keep=slice_plan.observe)

    @property
    def watching(self) -> bool:
        return self._reflector.watching

    # -- desired state ------------------------------------------------------

    def set_pools(self, pools: Iterable[Pool]) -> None:
        """Desired state: exactly these pools for this driver (pools not
        named are deleted). Thread-safe; wakes the reconcile loop. The loop
        writes nothing before the first call: a restarted driver must not
        delete the slices it is about to publish again."""
        built = {p.name: slice_plan.desired_pool(self.driver, p) for p in pools}
        with self._lock:
            gone = set(self._desired) - set(built)
            changed = {n for n, d in built.items() if self._desired.get(n) != d}
            self._desired = built
        self._desired_known.set()
        POOLS.labels(self.driver).set(len(built))
        for name in sorted(gone | changed):
            self._queue.add(name)

    def set_pool(self, pool: Pool) -> None:
        """Add or replace one pool, leaving the others as they are."""
        built = slice_plan.desired_pool(self.driver, pool)
        with self._lock:
            if self._desired.get(pool.name) == built:
                return
            self._desired[pool.name] = built
            POOLS.labels(self.driver).set(len(self._desired))
        self._queue.add(pool.name)

    def remove_pool(self, name: str) -> None:
        """Stop publishing one pool: its slices are deleted."""
        with self._lock:
            if self._desired.pop(name, None) is None:
                return
            POOLS.labels(self.driver).set(len(self._desired))
        self._queue.add(name)

    # -- running ------------------------------------------------------------

    def start(self) -> None:
        """Background reconcile: a watch of our slices and the workers."""
        if self._threads:
            return
        self._stopping.clear()
        self._reflector = self._new_reflector()
        t = threading.Thread(target=self._reflector.run, name=f"slices-watch-{self.driver}",
                             daemon=True)
        self._threads.append(t)
        for i in range(self._workers_n):
            self._threads.append(threading.Thread(
                target=self._work_loop, name=f"slices-{self.driver}-{i}", daemon=True))
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stopping.set()
        self._queue.close()
        self._reflector.stop()
        for t in self._threads:
            t.join(timeout=10)
        self._threads = []
        self._queue = WorkQueue(self._clock)
        self._reflector = self._new_reflector()

    def wait_synced(self, timeout: float = 30) -> bool:
        """True once the first LIST has filled the store."""
        deadline = self._clock() + timeout
        while not self._store.synced and self._clock() < deadline:
            time.sleep(0.05)
        return self._store.synced

    def idle(self) -> bool:
        """Nothing queued or being written (delayed re-checks aside)."""
        return self._queue.depth() == 0

    def reconcile_once(self) -> ReconcileStats:
        """Sync every pool now, in the caller's thread; the writes it made.
        Without ``start()`` it lists the slices first."""
        if not self._threads:
            self._relist()
        with self._lock:
            names = set(self._desired)
        out = ReconcileStats()
        for name in sorted(names | self._store.pools()):
            out.add(self._sync(name))
        return out

    def uninstall(self) -> int:
        """Stop publishing and delete this driver's slices (of the pools'
        nodes, or everything this publisher's scope selects when it has no
        pools); returns how many were deleted."""
        with self._lock:
            nodes = {d.node_name for d in self._desired.values()}
            self._desired = {}
        POOLS.labels(self.driver).set(0)
        items, _ = self._list()
        n = 0
        for obs in items:
            if nodes and obs.node_name not in nodes:
                continue
            if self._delete(obs):
                n += 1
        return n

    def dropped_fields(self) -> dict[str, list[tuple[str, str]]]:
        """Per slice name, (field path, feature gate) the apiserver dropped."""
        with self._lock:
            return {k: list(v) for k, v in self._dropped.items()}

    def status(self) -> dict[str, Any]:
        with self._lock:
            failing = sum(1 for v in self._failures.values() if v)
            pools = len(self._desired)
        return {"driver": self.driver, "watching": self.watching, "synced": self._store.synced,
                "pools": pools, "slices": self._store.count(), "queued": self._queue.depth(),
                "failingPools": failing, "lastError": self.last_error,
                "writes": self.stats.writes}

    # -- the watch ----------------------------------------------------------

    def _selectors(self) -> list[tuple[str, str]]:
        fields = [f"spec.driver={self.driver}"]
        if self._node_name:
            fields.append(f"spec.nodeName={self._node_name}")
        q = [("fieldSelector", ",".join(fields))]
        if self._labels:
            q.append(("labelSelector", ",".join(f"{k}={v}" for k, v in self._labels.items())))
        return q

    def _list(self) -> tuple[list[Observed], int]:
        return self._reflector.list()

    def _relist(self) -> None:
        self._reflector.relist()

    def _on_list(self, items: list[Observed], rv: int) -> None:
        changed = self._store.replace(items, rv)
        SLICES.labels(self.driver).set(self._store.count())
        with self._lock:
            wanted = set(self._desired)
        for pool in changed | wanted:
            self._queue.add(pool)

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        obs = slice_plan.observe(obj)
        for pool in self._store.event(kind, obs):
            self._queue.add(pool, self._sync_delay)
        if kind == "DELETED" and obs.node_name:
            # an owner the garbage collector acted on may have a new UID
            with self._lock:
                self._node_uids.pop(obs.node_name, None)
        SLICES.labels(self.driver).set(self._store.count())

    # -- the workers --------------------------------------------------------

    def _work_loop(self) -> None:
        while True:
            pool = self._queue.get()
            if pool is None:
                return
            try:
                if self._store.synced and self._desired_known.is_set():
                    self._sync(pool)
                else:
                    self._queue.add(pool, 0.2)
            finally:
                self._queue.done(pool)

    def _error(self, kind: str, err: Exception) -> None:
        ERRORS.labels(self.driver, kind).inc()
        self.last_error = str(err)
        log.warning("resourceslice API call failed; retrying", driver=self.driver, during=kind,
                    error=str(err)[:300])

    def _sync(self, pool: str) -> ReconcileStats:
        with self._lock:
            lock = self._pool_locks.setdefault(pool, threading.Lock())
        with lock:
            try:
                done = self._sync_locked(pool)
            except ApiError as err:
                with self._lock:
                    n = self._failures[pool] = self._failures.get(pool, 0) + 1
                self._error("sync", err)
                if not self._stopping.is_set() and not self._queue.closed:
                    self._queue.add(pool, backoff(n, self._max_backoff))
                return ReconcileStats()
            with self._lock:
                self._failures.pop(pool, None)
                self.stats.add(done)
            return done

    def _sync_locked(self, pool: str) -> ReconcileStats:
        with self._lock:
            want = self._desired.get(pool)
            forms = {d.name: self._forms[d.name] for d in want.slices
                     if d.name in self._forms} if want else {}
        have = self._store.pool(pool)
        p = slice_plan.plan(self.driver, want, have, labels=self._labels, server_forms=forms)
        done = ReconcileStats()
        if p.empty():
            return done
        for obs in p.deletes:
            if self._delete(obs):
                done.deletes += 1
        if p.writes and want is not None and not want.node_uid:
            # the owner reference needs the Node's UID (cached per node)
            uid = self._node_uid(want.node_name)
            p = slice_plan.plan(self.driver, DesiredPool(
                pool=want.pool, node_name=want.node_name, node_uid=uid, slices=want.slices),
                have, labels=self._labels, server_forms=forms)
        for w in p.writes:
            self._write(pool, w)
            if w.create:
                done.creates += 1
            else:
                done.updates += 1
        return done

    def _node_uid(self, node: str) -> str:
        with self._lock:
            uid = self._node_uids.get(node)
        if uid is None:
            uid = self._rest.request("GET", f"/api/v1/nodes/{node}")["metadata"]["uid"]
            with self._lock:
                self._node_uids[node] = uid
        return uid

    def _write(self, pool: str, w: Write) -> None:
        try:
            if w.create:
                got = self._rest.request("POST", SLICES_PATH, body=w.body)
            else:
                got = self._rest.request("PUT", f"{SLICES_PATH}/{w.name}", body=w.body)
        except ApiError as err:
            if err.status == 409 and w.create:
                self._adopt(w.name)  # there already, the watch had not shown it
            raise
        WRITES.labels(self.driver, "create" if w.create else "update").inc()
        obs = slice_plan.observe(got)
        self._store.wrote(obs)
        with self._lock:
            self._forms[w.name] = (w.sent_digest, obs.digest)
        if obs.digest != w.sent_digest:
            self._check_dropped(w, got)

    def _adopt(self, name: str) -> None:
        try:
            got = self._rest.request("GET", f"{SLICES_PATH}/{name}")
        except ApiError:
            return
        if got.get("spec", {}).get("driver") != self.driver:
            raise ApiError(409, f"slice {name} exists and belongs to driver "
                                f"{got.get('spec', {}).get('driver')!r}")
        self._store.wrote(slice_plan.observe(got))

    def _check_dropped(self, w: Write, got: Mapping[str, Any]) -> None:
        sent = orjson.loads(orjson.dumps(w.body["spec"]))
        lost = slice_plan.dropped_fields(sent, got.get("spec", {}))
        if not lost:
            return  # only the server's normal form of what we sent
        with self._lock:
            first = w.name not in self._dropped
            self._dropped[w.name] = lost
        gates = sorted({g for _, g in lost})
        for g in gates:
            DROPPED.labels(self.driver, g).inc()
        if first:
            log.warning("the apiserver dropped fields of a ResourceSlice: enable these "
                        "feature gates or stop using the fields", driver=self.driver,
                        slice=w.name, gates=gates, fields=[p for p, _ in lost[:8]])

    def _delete(self, obs: Observed) -> bool:
        body = {"kind": "DeleteOptions", "apiVersion": "v1",
                "preconditions": {"uid": obs.uid}}
        try:
            self._rest.request("DELETE", f"{SLICES_PATH}/{obs.name}", body=body)
        except ApiError as err:
            if err.status == 404:
                self._store.deleted(obs)
                return False
            raise
        WRITES.labels(self.driver, "delete").inc()
        self._store.deleted(obs)
        with self._lock:
            self._forms.pop(obs.name, None)
            self._dropped.pop(obs.name, None)
        return True
