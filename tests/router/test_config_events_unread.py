"""A config whose model servers publish KV events but whose profiles have no
scorer reading them (the default profile routes by prefix-approx) loads,
with one line saying how to use them."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from toposerve.router.config import RouterConfig

pytestmark = pytest.mark.unit


def _config(scorers: list[dict[str, Any]] | None = None, **endpoint: Any) -> list[str]:
    doc: dict[str, Any] = {"apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
                           "discovery": {"static": [{"url": "http://127.0.0.1:8000",
                                                     **endpoint}]}}
    if scorers is not None:
        doc["profile"] = {"scorers": scorers}
    with capture_logs() as logs:
        RouterConfig.model_validate(doc)
    return [str(e["event"]) for e in logs if e["log_level"] == "warning"]


def test_events_without_a_precise_scorer_are_said() -> None:
    said = _config(kvEvents="tcp://127.0.0.1:5557")
    assert len(said) == 1 and "prefix-precise" in said[0] and "profile.scorers" in said[0]


def test_events_read_or_absent_say_nothing() -> None:
    assert _config(kvEvents="tcp://127.0.0.1:5557",
                   scorers=[{"type": "prefix-precise", "weight": 4}]) == []
    assert _config() == []


def test_pod_discovery_events_port_counts() -> None:
    with capture_logs() as logs:
        RouterConfig.model_validate({
            "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
            "discovery": {"kubernetes": {"labelSelector": "app=vllm", "port": 8000,
                                         "kvEventsPort": 5557}}})
    assert [e for e in logs if "prefix-precise" in str(e["event"])]
