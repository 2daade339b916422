"""Leader election on a ``coordination.k8s.io/v1`` Lease, as pure
decisions over what the Lease says and what this replica has seen; the
I/O is ``toposerve.router.ha.elector``.

As in client-go's leader election, expiry is judged on the reader's own
clock, from when it first saw the holder's latest renewal, never from the
``renewTime`` the holder wrote: the two hosts' clocks need not agree, only
run at about the same rate. A leader counts itself leader only while its
last successful renewal is younger than its renew deadline, which is
shorter than the lease duration, so it stops leading before anyone else
may take over."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from enum import Enum


@dataclass(frozen=True)
class LeaseRecord:
    """A Lease's spec: ``holder`` "" when nobody holds it (released)."""

    holder: str
    duration_s: int
    renew_time: datetime | None = None
    acquire_time: datetime | None = None
    transitions: int = 0


@dataclass(frozen=True)
class Seen:
    """The record as this replica last saw it, and when (its monotonic
    clock) it first saw it so."""

    record: LeaseRecord
    at: float


class Step(Enum):
    CREATE = "create"  # no Lease yet
    RENEW = "renew"  # ours: write a fresh renewTime
    TAKE = "take"  # released, or its holder stopped renewing
    FOLLOW = "follow"  # someone else holds it


def observe(prev: Seen | None, record: LeaseRecord, now: float) -> Seen:
    """What this replica has seen after reading ``record`` at ``now``: the
    same record keeps the time it first appeared."""
    if prev is not None and prev.record == record:
        return prev
    return Seen(record, now)


def step(record: LeaseRecord | None, seen: Seen | None, me: str, now: float) -> Step:
    if record is None:
        return Step.CREATE
    if record.holder == me:
        return Step.RENEW
    if not record.holder:
        return Step.TAKE
    if seen is None or seen.record != record:
        return Step.FOLLOW  # not yet watched this renewal for a whole duration
    return Step.TAKE if now - seen.at > record.duration_s else Step.FOLLOW


def claimed(record: LeaseRecord | None, me: str, duration_s: int, wall: datetime
            ) -> LeaseRecord:
    """The record to write to hold the Lease from ``wall``."""
    if record is None:
        return LeaseRecord(me, duration_s, wall, wall, 0)
    if record.holder == me:
        return replace(record, duration_s=duration_s, renew_time=wall)
    return LeaseRecord(me, duration_s, wall, wall, record.transitions + 1)


def released(record: LeaseRecord, me: str, wall: datetime) -> LeaseRecord | None:
    """The record that hands the Lease back (a standby takes it at its next
    read rather than after a lease duration); None if it is not ours."""
    if record.holder != me:
        return None
    return replace(record, holder="", duration_s=1, renew_time=wall)


def leading(renewed_at: float | None, now: float, renew_deadline_s: float) -> bool:
    """Whether a replica whose last successful write was sent at
    ``renewed_at`` may still act as leader."""
    return renewed_at is not None and now - renewed_at < renew_deadline_s
