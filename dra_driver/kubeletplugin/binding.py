"""Binding conditions (DRADeviceBindingConditions, beta and on by default
in 1.37; it needs DRAResourceClaimDeviceStatus): a device published with
``bindingConditions`` makes the scheduler wait in PreBind, after it has
written the claim's allocation and reservation, until every one of those
condition types is True in the claim's ``status.devices[]`` entry for that
device. A True ``bindingFailureConditions`` type, or the binding timeout
(600 s by default, the plugin arg ``bindingTimeout``) counted from
``status.allocation.allocationTimestamp``, fails PreBind; the pod goes back
to the queue, and its next attempt deallocates the claim (allocation,
reservation and ``status.devices`` cleared) and allocates afresh. The
scheduler reads the conditions from its informer, polling every 5 s.

Here, for any device kind: the slice fields (``with_binding_conditions``),
what to write as pure functions of a claim and the devices' readiness
(``tracked``, ``settle``, ``desired``), and ``BindingController``, the
node's watch of claims that does the I/O. Its writes are a server-side
apply under a field manager of their own (``<driver>/binding``), so the
``Ready`` condition and ``networkData`` that prepare applies later under
the driver's name neither remove the binding conditions nor are removed
by them.
"""

from __future__ import annotations

import datetime as dt
import enum
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import structlog
from prometheus_client import Counter

from toposerve.dra_driver.kubeletplugin import metrics
from toposerve.dra_driver.kubeletplugin.claim_status import (
    UnwritableClaim,
    apply_status,
    stamp,
    status_body,
)
from toposerve.dra_driver.kubeletplugin.claims import selects_node
from toposerve.dra_driver.kubeletplugin.device_kind import ClaimRef
from toposerve.dra_driver.resourceslice import Pool
from toposerve.kubeapi import JsonApi, Reflector, WorkQueue, backoff

log = structlog.get_logger("dra.binding")

CLAIMS_PATH = "/apis/resource.k8s.io/v1/resourceclaims"
DECISIONS = Counter(
    "toposerve_dra_binding_decisions_total",
    "Devices of claims waiting on binding conditions that this driver marked ready or failed",
    ["driver", "outcome"])


@dataclass(frozen=True)
class BindingConditions:
    """A driver's condition types: ``ready`` True lets the pod bind,
    ``failed`` True sends it back to scheduling."""

    ready: str
    failed: str

    def fields(self) -> dict[str, Any]:
        """The device fields: ``bindsToNode`` too, so the allocation names
        the node the scheduler picked even for a device more than one node
        could reach (and the driver on that node is the one to answer)."""
        return {"bindsToNode": True, "bindingConditions": [self.ready],
                "bindingFailureConditions": [self.failed]}


def with_binding_conditions(pool: Pool, conditions: BindingConditions,
                            applies: Callable[[Mapping[str, Any]], bool] = lambda d: True
                            ) -> Pool:
    """The pool with the binding fields on each device ``applies`` to."""
    extra = conditions.fields()
    return replace(pool, devices=tuple({**d, **extra} if applies(d) else d
                                       for d in pool.devices))


class State(enum.Enum):
    READY = "ready"
    PENDING = "pending"   # not ready yet: nothing is decided, the timeout still runs
    FAILED = "failed"


@dataclass(frozen=True)
class Readiness:
    """A device's readiness as its kind sees it now; ``reason`` is a
    condition reason (CamelCase), ``message`` says what a user can do."""

    state: State
    reason: str
    message: str = ""


DeviceKey = tuple[str, str, str | None]  # pool, device, shareID


@dataclass(frozen=True)
class Waiting:
    """One allocation result of ours that carries binding conditions (copied
    from the slice when the scheduler allocated it)."""

    pool: str
    device: str
    share_id: str | None
    ready: tuple[str, ...]
    failed: tuple[str, ...]

    @property
    def key(self) -> DeviceKey:
        return (self.pool, self.device, self.share_id)


@dataclass(frozen=True)
class Tracked:
    """What the controller keeps of a claim waiting on us: its devices and
    the conditions of theirs its status shows, by device and type."""

    ref: ClaimRef
    devices: tuple[Waiting, ...]
    shown: Mapping[DeviceKey, Mapping[str, Mapping[str, Any]]] = field(default_factory=dict)

    def decided(self, w: Waiting) -> bool:
        got = self.shown.get(w.key, {})
        if any(got.get(t, {}).get("status") == "True" for t in w.failed):
            return True
        return all(got.get(t, {}).get("status") == "True" for t in w.ready)


def tracked(claim: Mapping[str, Any], driver: str, node_name: str) -> Tracked | None:
    """The claim's results for ``driver`` that carry binding conditions, on
    this node, while any of them is undecided; None otherwise (nothing to
    do: the scheduler has what it waits for, or the claim is not ours)."""
    meta = claim.get("metadata") or {}
    status = claim.get("status") or {}
    allocation = status.get("allocation") or {}
    if not allocation or meta.get("deletionTimestamp"):
        return None
    if not selects_node(allocation.get("nodeSelector"), node_name):
        return None
    waiting = tuple(
        Waiting(pool=r["pool"], device=r["device"], share_id=r.get("shareID"),
                ready=tuple(r["bindingConditions"]),
                failed=tuple(r.get("bindingFailureConditions") or ()))
        for r in (allocation.get("devices") or {}).get("results") or []
        if r.get("driver") == driver and r.get("bindingConditions"))
    if not waiting:
        return None
    ours = {w.key: set(w.ready) | set(w.failed) for w in waiting}
    shown: dict[DeviceKey, dict[str, Mapping[str, Any]]] = {}
    for d in status.get("devices") or []:
        key = (d.get("pool"), d.get("device"), d.get("shareID"))
        if d.get("driver") == driver and key in ours:
            shown[key] = {c["type"]: c for c in d.get("conditions") or []
                          if c.get("type") in ours[key]}
    t = Tracked(ref=ClaimRef(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"]),
                devices=waiting, shown=shown)
    return None if all(t.decided(w) for w in waiting) else t


def settle(r: Readiness, bad_since: float | None, now: float, fail_after_s: float) -> Readiness:
    """A failure counts once it has lasted ``fail_after_s`` (a link coming
    up negotiates for a few seconds, a fabric retries): until then the
    device is pending, for the same reason."""
    if r.state != State.FAILED or bad_since is None or now - bad_since >= fail_after_s:
        return r
    # the same words on every look, so a recheck does not rewrite the claim
    return Readiness(State.PENDING, r.reason,
                     f"{r.message} (the binding fails if this lasts {fail_after_s:g}s)")


def _condition(kind: str, true: bool, r: Readiness, now: str,
               before: Mapping[str, Any] | None) -> dict[str, Any]:
    status = "True" if true else "False"
    # the transition time moves only when the status does (metav1.Condition)
    since = before.get("lastTransitionTime") if before and before.get("status") == status \
        else None
    return {"type": kind, "status": status, "reason": r.reason, "message": r.message,
            "lastTransitionTime": since or now}


def desired(t: Tracked, driver: str, readiness: Mapping[str, Readiness],
            now: dt.datetime) -> list[dict[str, Any]] | None:
    """Every ``status.devices`` entry this driver's binding manager states
    for the claim (an apply states all of them: a device left out would
    lose its conditions), or None when the claim already shows them.

    A decided device keeps what it shows (the scheduler may be acting on
    it); an undecided one gets its ready types True when ready, its failure
    types True when failed, and all False, with the reason, while pending.
    A device its kind does not know is failed (it is gone)."""
    when = stamp(now)
    entries: list[dict[str, Any]] = []
    changed = False
    for w in t.devices:
        shown = t.shown.get(w.key, {})
        if t.decided(w):
            conditions = [dict(shown[k]) for k in (*w.ready, *w.failed) if k in shown]
        else:
            r = readiness.get(w.device) or Readiness(
                State.FAILED, "DeviceGone", f"{w.device} is no longer on this node")
            conditions = [_condition(k, r.state == State.READY, r, when, shown.get(k))
                          for k in w.ready]
            conditions += [_condition(k, r.state == State.FAILED, r, when, shown.get(k))
                           for k in w.failed]
            changed |= any(
                {f: c[f] for f in ("status", "reason", "message")}
                != {f: shown.get(c["type"], {}).get(f) for f in ("status", "reason", "message")}
                for c in conditions)
        entry: dict[str, Any] = {"driver": driver, "pool": w.pool, "device": w.device,
                                 "conditions": conditions}
        if w.share_id is not None:
            entry["shareID"] = w.share_id
        entries.append(entry)
    return entries if changed else None


def outcomes(t: Tracked, entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """``ready`` / ``failed`` for each device these entries newly decide."""
    by_key = {(e["pool"], e["device"], e.get("shareID")): e for e in entries}
    out = []
    for w in t.devices:
        if t.decided(w):
            continue
        now = {c["type"]: c["status"] for c in by_key[w.key]["conditions"]}
        if any(now.get(k) == "True" for k in w.failed):
            out.append(State.FAILED.value)
        elif all(now.get(k) == "True" for k in w.ready):
            out.append(State.READY.value)
    return out


ReadinessOf = Callable[[Collection[str]], Mapping[str, Readiness]]


class BindingController:
    """Per node: a watch of every ResourceClaim (claims cannot be selected
    by node; the projection keeps only those waiting on this driver here),
    a queue of them, and a worker that asks the kind how the devices are
    (``readiness_of``) and applies the conditions ``desired`` says. Claims
    still pending are looked at again every ``recheck_s`` and on ``kick``
    (a kind calls it when it sees its devices change)."""

    def __init__(self, api: Any, driver: str, node_name: str, pools: Callable[[], set[str]],
                 readiness_of: ReadinessOf, *, fail_after_s: float = 10.0,
                 recheck_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.driver = driver
        self.manager = f"{driver}/binding"
        self.node_name = node_name
        self._pools = pools
        self._readiness_of = readiness_of
        self._fail_after_s = fail_after_s
        self._recheck_s = recheck_s
        self._clock = clock
        self._lock = threading.Lock()
        self._claims: dict[str, Tracked] = {}
        # device -> (first, last) time it was seen failed in a row of looks
        self._bad: dict[str, tuple[float, float]] = {}
        self._failures: dict[str, int] = {}      # claim key -> write failures in a row
        self._queue = WorkQueue(clock)
        self._stop = threading.Event()
        self._reflector = Reflector(JsonApi(api), CLAIMS_PATH, [], self._on_list,
                                    self._on_event, self._on_error, keep=self._keep)
        self._threads = [threading.Thread(target=self._reflector.run, name="binding-watch",
                                          daemon=True),
                         threading.Thread(target=self._work, name="binding", daemon=True),
                         threading.Thread(target=self._recheck, name="binding-recheck",
                                          daemon=True)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()
        self._reflector.stop()
        self._queue.close()
        for t in self._threads:
            t.join(timeout=5)

    def kick(self) -> None:
        """Look at every waiting claim again (the devices changed)."""
        with self._lock:
            keys = list(self._claims)
        for k in keys:
            self._queue.add(k)

    # -- the watch ----------------------------------------------------------------

    def _keep(self, obj: dict[str, Any]) -> tuple[str, Tracked] | None:
        t = tracked(obj, self.driver, self.node_name)
        return None if t is None else (f"{t.ref.namespace}/{t.ref.name}", t)

    def _on_list(self, items: list[Any], _rv: int) -> None:
        with self._lock:
            self._claims = dict(i for i in items if i is not None)
        self.kick()

    def _on_event(self, kind: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        kept = None if kind == "DELETED" else self._keep(obj)
        with self._lock:
            if kept is None:
                self._claims.pop(key, None)
                self._failures.pop(key, None)
                return
            self._claims[key] = kept[1]
        self._queue.add(key)

    def _on_error(self, err: Exception) -> None:
        metrics.BACKGROUND_ERRORS.labels(self.driver, "binding-watch").inc()
        log.warning("watching claims failed; retrying", driver=self.driver, error=str(err))

    # -- the worker ---------------------------------------------------------------

    def _recheck(self) -> None:
        while not self._stop.wait(self._recheck_s):
            self.kick()

    def _work(self) -> None:
        while (key := self._queue.get()) is not None:
            try:
                self._sync(key)
                self._failures.pop(key, None)
            except Exception as err:
                n = self._failures[key] = self._failures.get(key, 0) + 1
                metrics.BACKGROUND_ERRORS.labels(self.driver, "binding").inc()
                log.error("writing binding conditions failed", driver=self.driver, claim=key,
                          error=str(err), failures=n)
                self._queue.add(key, backoff(n, 60 if isinstance(err, UnwritableClaim) else 30))
            finally:
                self._queue.done(key)

    def _readiness(self, devices: Collection[str]) -> dict[str, Readiness]:
        now = self._clock()
        out = {}
        for name, r in self._readiness_of(devices).items():
            since = None
            if r.state == State.FAILED:
                first, last = self._bad.get(name, (now, now))
                # not looked at for a while (no claim waited on it): a new failure
                since = first if now - last <= 2 * self._recheck_s + 1 else now
                self._bad[name] = (since, now)
            else:
                self._bad.pop(name, None)
            out[name] = settle(r, since, now, self._fail_after_s)
        return out

    def _sync(self, key: str) -> None:
        with self._lock:
            t = self._claims.get(key)
        if t is None:
            return
        pools = self._pools()
        t = replace(t, devices=tuple(w for w in t.devices if w.pool in pools))
        if not t.devices:
            return
        entries = desired(t, self.driver, self._readiness({w.device for w in t.devices}),
                          dt.datetime.now(dt.UTC))
        if entries is None:
            return
        if apply_status(self.api, self.manager, status_body(t.ref, entries)):
            for outcome in outcomes(t, entries):
                DECISIONS.labels(self.driver, outcome).inc()
                log.info("binding condition written", driver=self.driver, claim=str(t.ref),
                         outcome=outcome)
