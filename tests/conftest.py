"""Shared fixtures. ``cluster``: one real local cluster (etcd, kube-apiserver,
kube-controller-manager, kube-scheduler, kwok) for the whole session."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

from harness.cluster_claim import claimed
from harness.procs import Procs
from toposerve.localcluster.cluster import ClusterSpec, check_components, up
from toposerve.localcluster.clusters import ClusterError, api_client
from toposerve.localcluster.tools import helm_path

# Property tests check results, not speed (benchmarks measure that): no
# per-example deadline, which a busy 2-core machine overruns (570 ms
# against hypothesis' 200 ms default). A test that sets its own keeps it.
settings.register_profile("toposerve", deadline=None)
settings.load_profile("toposerve")

# Overridable so that two test runs on one machine do not tear down each other's cluster.
TEST_CLUSTER = os.environ.get("TOPOSERVE_TEST_CLUSTER", "toposerve-test")
TEST_GROUPS = [("hgx-h100", 4), ("gb200-nvl72", 18), ("mi300x", 2)]
# the install's tests render the chart with the helm `make setup` builds
if os.access(helm_path(), os.X_OK):
    os.environ.setdefault("TOPOSERVE_HELM", str(helm_path()))


@dataclass
class Cluster:
    name: str
    api: Any
    groups: list[tuple[str, int]]
    up_seconds: float


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    with claimed(TEST_CLUSTER):
        started = time.monotonic()
        up(ClusterSpec(name=TEST_CLUSTER, groups=TEST_GROUPS),
           progress=lambda m: print(f"[cluster] {m}", file=sys.stderr))
        yield Cluster(name=TEST_CLUSTER, api=api_client(TEST_CLUSTER), groups=TEST_GROUPS,
                      up_seconds=time.monotonic() - started)


@pytest.fixture(autouse=True)
def _cluster_components_alive(request: pytest.FixtureRequest) -> None:
    """A test on the shared cluster fails at once, naming the component, when
    one of it has exited, rather than timing out on pods that never run."""
    if "cluster" in request.fixturenames:
        request.getfixturevalue("cluster")
        try:
            check_components(TEST_CLUSTER)
        except ClusterError as err:
            pytest.fail(f"cluster {TEST_CLUSTER!r}: {err}")


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    """Simulators and routers as real subprocesses, stopped after the test."""
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.close()
