"""The Lease I/O of leader election: a thread on ``kubeapi.JsonApi``
reads the Lease every renew interval and writes
what ``toposerve.router.ha.lease`` decides (a write carries the resourceVersion it
read, so of two replicas racing for a free Lease one gets 409 and
follows). ``leader`` is read from the event loop."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import structlog

from toposerve.kubeapi import ApiError, JsonApi, connect
from toposerve.router.config import LeaseConfig
from toposerve.router.ha.lease import (
    LeaseRecord,
    Seen,
    Step,
    claimed,
    leading,
    observe,
    released,
    step,
)

log = structlog.get_logger("router.ha")


def default_identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def _micro(t: datetime | None) -> str | None:
    # MicroTime: the apiserver parses exactly six fractional digits
    return None if t is None else t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(t: str | None) -> datetime | None:
    return None if not t else datetime.fromisoformat(t)


def record_of(lease: dict[str, Any]) -> LeaseRecord:
    s = lease.get("spec") or {}
    return LeaseRecord(holder=s.get("holderIdentity") or "",
                       duration_s=s.get("leaseDurationSeconds") or 1,
                       renew_time=_time(s.get("renewTime")),
                       acquire_time=_time(s.get("acquireTime")),
                       transitions=s.get("leaseTransitions") or 0)


def _version(lease: dict[str, Any]) -> str | None:
    return (lease.get("metadata") or {}).get("resourceVersion")


def lease_body(cfg: LeaseConfig, r: LeaseRecord, resource_version: str | None
               ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": cfg.name, "namespace": cfg.namespace}
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": r.holder or None, "leaseDurationSeconds": r.duration_s,
                     "renewTime": _micro(r.renew_time), "acquireTime": _micro(r.acquire_time),
                     "leaseTransitions": r.transitions}}


class Elector:
    def __init__(self, cfg: LeaseConfig, on_change: Callable[[bool], None] = lambda _: None,
                 eligible: Callable[[], bool] = lambda: True,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime] = lambda: datetime.now(UTC),
                 api: JsonApi | None = None) -> None:
        """``on_change`` is told (from the election thread) whether this
        replica leads: once at start (False), then at each change.
        ``eligible``: whether it could serve now; only then does it take
        a Lease (a replica that has not yet found a ready endpoint would
        lead nobody anywhere). ``api``: the client (default: from the
        Lease's kubeconfig, at start)."""
        self.cfg, self.on_change, self.eligible = cfg, on_change, eligible
        self.clock, self.wall = clock, wall
        self.identity = cfg.identity or default_identity()
        self._renewed_at: float | None = None
        self._seen: Seen | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._was = False
        self._api = api
        base = f"/apis/coordination.k8s.io/v1/namespaces/{cfg.namespace}/leases"
        self._leases, self._lease = base, f"{base}/{cfg.name}"

    @property
    def leader(self) -> bool:
        return leading(self._renewed_at, self.clock(), self.cfg.renew_deadline_s)

    def start(self) -> None:
        if self._api is None:
            self._api = JsonApi(connect(self.cfg.kubeconfig))
        self._thread = threading.Thread(target=self._run, name="lease", daemon=True)
        self._thread.start()

    def step_down(self) -> None:
        """Stop leading now and hand the Lease back (SIGTERM): blocking, at
        most about one renew deadline."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.cfg.renew_deadline_s * 2)
        was_leader, self._renewed_at = self.leader, None
        try:
            self._release(was_leader)
        finally:
            self._changed()  # after the release: telling others of the change takes time

    def _release(self, was_leader: bool) -> None:
        if self._api is None or not was_leader:
            return
        try:
            lease = self._read()
            rec = released(record_of(lease), self.identity, self.wall()) if lease else None
            if lease is not None and rec is not None:
                self._write("PUT", self._lease, lease_body(self.cfg, rec, _version(lease)))
                log.info("lease released", lease=self.cfg.name, identity=self.identity)
        except Exception as err:  # the standby takes over after a lease duration instead
            log.warning("lease release failed", error=repr(err))

    def _changed(self) -> None:
        now = self.leader
        if now != self._was:
            self._was = now
            log.info("leading" if now else "standing by", lease=self.cfg.name,
                     identity=self.identity)
            self.on_change(now)

    def _read(self) -> dict[str, Any] | None:
        assert self._api is not None
        try:
            lease: dict[str, Any] = self._api.request("GET", self._lease,
                                                      timeout=self.cfg.renew_deadline_s)
        except ApiError as err:
            if err.status == 404:
                return None
            raise
        return lease

    def _write(self, method: str, path: str, body: dict[str, Any]) -> None:
        assert self._api is not None
        self._api.request(method, path, body=body, timeout=self.cfg.renew_deadline_s)

    def _run(self) -> None:
        self.on_change(False)
        while not self._stop.is_set():
            try:
                self.round()
            except Exception as err:  # the API is slow or down: leadership lapses on its own
                log.warning("lease round failed", lease=self.cfg.name, error=repr(err))
            self._changed()
            self._stop.wait(self.cfg.renew_interval_s)

    def round(self) -> Step:
        """One read and, if this replica should hold the Lease, one write."""
        lease = self._read()
        now = self.clock()
        record = record_of(lease) if lease is not None else None
        self._seen = observe(self._seen, record, now) if record is not None else None
        action = step(record, self._seen, self.identity, now)
        if action is Step.FOLLOW or (action is not Step.RENEW and not self.eligible()):
            return Step.FOLLOW
        body = lease_body(self.cfg, claimed(record, self.identity, self.cfg.duration_s,
                                            self.wall()),
                          _version(lease) if lease is not None else None)
        sent = self.clock()  # leadership counts from the send, not the answer
        try:
            if lease is None:
                self._write("POST", self._leases, body)
            else:
                self._write("PUT", self._lease, body)
        except ApiError as err:
            if err.status in (409, 422):  # another replica wrote first
                return Step.FOLLOW
            raise
        if action is Step.TAKE:
            log.info("lease taken", lease=self.cfg.name, identity=self.identity,
                     previous=record.holder if record else None)
        self._renewed_at = sent
        return action
