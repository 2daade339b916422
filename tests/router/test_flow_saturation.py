"""Saturation as a number, stale metrics failing closed, the shedding
curve, the room the release loop counts; token buckets; API key tables."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from toposerve.router.admission.keys import read_file, secret_table
from toposerve.router.admission.ratelimit import Bucket
from toposerve.router.admission.tenants import bearer
from toposerve.router.config import RouterConfig
from toposerve.router.pool.endpoints import Endpoint, LoadSample
from toposerve.router.pool.saturation import (
    free_slots,
    pool_saturation,
    saturated,
    shed_probability,
    utilisation,
)
from toposerve.topology.config_file import ConfigError

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


def _cfg(**flow: Any) -> RouterConfig:
    return RouterConfig.model_validate({
        "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
        "discovery": {"static": [{"url": "http://127.0.0.1:9"}]},
        "saturation": {"queueThreshold": 4, "kvUsageThreshold": 0.8},
        "scrape": {"intervalSeconds": 1, "timeoutSeconds": 1, "staleAfterSeconds": 3},
        "flowControl": flow})


def _ep(waiting: float = 0, kv: float = 0, at: float = 100.0, inflight: int = 0) -> Endpoint:
    ep = Endpoint("http://127.0.0.1:9", load=LoadSample(waiting=waiting, kv_usage=kv, at=at))
    ep.inflight = inflight
    return ep


def test_metrics_detector_and_stale_fails_closed() -> None:
    cfg = _cfg()
    assert utilisation(_ep(waiting=2), cfg, 101) == pytest.approx(0.5)
    assert utilisation(_ep(waiting=1, kv=0.6), cfg, 101) == pytest.approx(0.75)
    assert saturated(_ep(waiting=4), cfg, 101) and not saturated(_ep(waiting=3), cfg, 101)
    assert saturated(_ep(at=100), cfg, 104)  # metrics 4 s old: full, whatever they said
    assert saturated(_ep(at=0), cfg, 1)  # never scraped
    eps = [_ep(waiting=2), _ep(waiting=8)]
    assert pool_saturation(eps, cfg, 101) == pytest.approx(0.75)  # each capped at 1
    assert pool_saturation([], cfg, 101) == 1.0
    assert free_slots(eps, cfg, 101) == 2


def test_concurrency_detector_never_stale() -> None:
    cfg = _cfg(saturation={"detector": "concurrency", "maxConcurrency": 4})
    ep = _ep(at=0, inflight=3)
    assert utilisation(ep, cfg, 1e9) == 0.75 and not saturated(ep, cfg, 1e9)
    assert free_slots([ep, _ep(inflight=6)], cfg) == 1


def test_shed_probability_curve() -> None:
    assert shed_probability(0.5, 0.8) == 0.0
    assert shed_probability(0.9, 0.8) == pytest.approx(0.5)
    assert shed_probability(1.0, 0.8) == 1.0
    assert shed_probability(0.99, 1.0) == 0.0  # start at 1: only when full
    assert shed_probability(0.6, 0.4, 0.8) == pytest.approx(0.5)
    assert shed_probability(0.8, 0.4, 0.8) == 1.0  # the last fifth kept for the rest
    with pytest.raises(ValueError, match="shedAll"):
        _cfg(saturation={"shedStart": 0.9, "shedAll": 0.5})


def test_bucket_rate_and_burst() -> None:
    b = Bucket(rate=2, burst=2)
    assert b.take(1, 0) and b.take(1, 0) and not b.take(1, 0)
    assert not b.take(1, 0.4) and b.take(1, 0.5)
    big = Bucket(rate=10, burst=10)
    assert big.take(50, 0)  # a full bucket lets one large request through
    assert not big.take(1, 0.05) and big.take(1, 5.1)


def test_key_file_and_secret_tables(tmp_path: Path) -> None:
    f = tmp_path / "keys.yaml"
    f.write_text("apiVersion: toposerve.io/v1\nkind: APIKeys\n"
                 "tenants: {a: [sk-a1, sk-a2], b: [sk-b]}\n")
    t = read_file(str(f))
    assert sorted(t.values()) == ["a", "a", "b"] and len(t) == 3
    f.write_text("apiVersion: toposerve.io/v1\nkind: APIKeys\ntenants: {a: [k], b: [k]}\n")
    with pytest.raises(ConfigError, match="a key is also a's"):
        read_file(str(f))
    f.write_text("apiVersion: toposerve.io/v1\nkind: APIKeys\ntenant: {}\n")
    with pytest.raises(ConfigError, match="tenant: Extra inputs"):
        read_file(str(f))
    data = {"a": base64.b64encode(b"sk-1\n\nsk-2\n").decode()}
    assert sorted(secret_table(data).values()) == ["a", "a"]
    assert secret_table(None) == {}


def test_bearer() -> None:
    assert bearer("Bearer sk-1") == "sk-1" and bearer("bearer  sk-1 ") == "sk-1"
    assert bearer("Basic abc") is None and bearer("Bearer ") is None and bearer(None) is None


def test_saturated_is_utilisation_at_one() -> None:
    for cfg in (_cfg(), _cfg(saturation={"detector": "concurrency", "maxConcurrency": 4}),
                RouterConfig.model_validate({
                    "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
                    "discovery": {"static": [{"url": "http://127.0.0.1:9"}]},
                    "saturation": {"queueThreshold": 0}})):
        for ep in (_ep(), _ep(waiting=3.9), _ep(waiting=4), _ep(kv=0.79), _ep(kv=0.8),
                   _ep(inflight=3), _ep(inflight=4), _ep(at=90)):
            assert saturated(ep, cfg, 101) == (utilisation(ep, cfg, 101) >= 1.0), ep
