"""Leader election decisions over an injected clock: create, renew,
follow, take over an expired or released Lease, and step down before
anyone may take over."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from toposerve.router.config import LeaseConfig
from toposerve.router.ha.elector import lease_body
from toposerve.router.ha.lease import LeaseRecord, Step, claimed, leading, observe, released, step

T0 = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)


def test_no_lease_is_created_then_renewed_by_its_holder() -> None:
    assert step(None, None, "a", 0.0) is Step.CREATE
    mine = claimed(None, "a", 1, T0)
    assert (mine.holder, mine.transitions, mine.acquire_time) == ("a", 0, T0)
    assert step(mine, observe(None, mine, 0.0), "a", 5.0) is Step.RENEW
    later = claimed(mine, "a", 1, T0 + timedelta(seconds=1))
    assert later.acquire_time == T0 and later.renew_time == T0 + timedelta(seconds=1)


def test_a_live_holder_is_followed_and_an_expired_one_taken_over() -> None:
    theirs = claimed(None, "a", 1, T0)
    seen = observe(None, theirs, 10.0)
    assert step(theirs, seen, "b", 10.9) is Step.FOLLOW
    # a renewal restarts the count on the reader's clock, whatever its renewTime says
    renewed = claimed(theirs, "a", 1, T0 - timedelta(hours=1))
    seen = observe(seen, renewed, 10.95)
    assert seen.at == 10.95
    assert step(renewed, seen, "b", 11.5) is Step.FOLLOW
    assert observe(seen, renewed, 11.6) is seen  # unchanged: the first sighting counts
    assert step(renewed, seen, "b", 11.96) is Step.TAKE
    taken = claimed(renewed, "b", 1, T0)
    assert (taken.holder, taken.transitions) == ("b", 1)


def test_a_released_lease_is_taken_at_once() -> None:
    theirs = claimed(None, "a", 1, T0)
    assert released(theirs, "b", T0) is None  # only its holder hands it back
    free = released(theirs, "a", T0)
    assert free is not None and free.holder == ""
    assert step(free, observe(None, free, 0.0), "b", 0.0) is Step.TAKE


def test_a_leader_that_cannot_renew_steps_down_before_expiry() -> None:
    cfg = LeaseConfig()
    assert not leading(None, 0.0, cfg.renew_deadline_s)
    assert leading(100.0, 100.0 + cfg.renew_deadline_s - 0.01, cfg.renew_deadline_s)
    assert not leading(100.0, 100.0 + cfg.renew_deadline_s, cfg.renew_deadline_s)
    # a standby first sees the last renewal no earlier than it was sent
    assert cfg.renew_deadline_s < cfg.duration_s


def test_timing_is_validated() -> None:
    with pytest.raises(ValueError, match="renewDeadlineSeconds"):
        LeaseConfig.model_validate({"leaseDurationSeconds": 1, "renewDeadlineSeconds": 1.5})


def test_lease_body_writes_micro_time() -> None:
    body = lease_body(LeaseConfig(), LeaseRecord("a", 1, T0, T0, 2), "17")
    assert body["spec"]["renewTime"] == "2026-12-01T12:00:00.000000Z"
    assert body["metadata"]["resourceVersion"] == "17"
    assert lease_body(LeaseConfig(), LeaseRecord("", 1), None)["spec"]["holderIdentity"] is None
