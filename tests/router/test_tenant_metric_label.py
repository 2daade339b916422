"""/metrics names tenants in a label: its values are bounded by
flowControl.tenants.metricTenants, the configured tenants first, the rest
folded into `other`."""

from __future__ import annotations

from toposerve.router.admission.tenants import OTHER_TENANTS, Tenants
from toposerve.router.config import FlowControlConfig


def _tenants(bound: int, configured: list[str]) -> Tenants:
    return Tenants(FlowControlConfig.model_validate({"tenants": {
        "metricTenants": bound, "tenants": [{"name": n} for n in configured]}}))


def test_tenants_beyond_the_bound_are_other() -> None:
    t = _tenants(3, ["gold"])
    assert [t.metric_label(n) for n in ("a", "b", "c", "gold", "a")] == [
        "a", "b", OTHER_TENANTS, "gold", "a"]
    # a configured tenant keeps its label whoever came first
    assert t.metric_label("gold") == "gold"


def test_zero_folds_every_tenant() -> None:
    t = _tenants(0, ["gold"])
    assert {t.metric_label(n) for n in ("gold", "a")} == {OTHER_TENANTS}


def test_the_default_bound() -> None:
    t = Tenants(FlowControlConfig())
    labels = {t.metric_label(f"t{i}") for i in range(1000)}
    assert len(labels) == 101 and OTHER_TENANTS in labels
