"""Scale: a 1,000-node cluster comes up with every node Ready and labelled.
Slow, so it runs under ``make scale``, not ``make test``."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from harness.cluster_claim import claimed
from toposerve.localcluster.cluster import ClusterSpec, up
from toposerve.localcluster.clusters import api_client

pytestmark = [pytest.mark.cluster, pytest.mark.scale]


def test_thousand_nodes() -> None:
    name = "pytest-scale"
    with claimed(name):
        up(ClusterSpec(name=name, groups=[("gb200-nvl72", 720), ("hgx-h100", 280)]))
        nodes: list[Any] = client.CoreV1Api(api_client(name)).list_node().items
        assert len(nodes) == 1000
        racks = {n.metadata.labels["topology.toposerve.io/rack"] for n in nodes}
        assert len(racks) == 40 + 70  # 720 / 18 NVL72 racks, 280 / 4 HGX racks
