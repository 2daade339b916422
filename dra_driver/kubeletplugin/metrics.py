"""Prometheus series of a DRA driver on this framework (served on
``/metrics`` by ``liveness.HttpEndpoints``; the slice publisher adds its
own ``toposerve_dra_slice_writes_total`` and error series)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PREPARE_SECONDS = Histogram(
    "toposerve_dra_prepare_seconds", "NodePrepareResources per claim, by result",
    ["driver", "result"], buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 45))
UNPREPARE_SECONDS = Histogram(
    "toposerve_dra_unprepare_seconds", "NodeUnprepareResources per claim, by result",
    ["driver", "result"], buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 45))
BACKGROUND_ERRORS = Counter(
    "toposerve_dra_background_errors_total",
    "Errors outside a kubelet call (publishing, health checks, recovery), by source",
    ["driver", "source"])
REGISTERED = Gauge(
    "toposerve_dra_registered", "1 once the kubelet reported this plugin registered",
    ["driver"])
PREPARED_CLAIMS = Gauge(
    "toposerve_dra_prepared_claims", "Claims prepared according to the checkpoint", ["driver"])
DEVICE_HEALTHY = Gauge(
    "toposerve_dra_device_healthy", "1 healthy, 0 unhealthy, -1 unknown",
    ["driver", "pool", "device"])
