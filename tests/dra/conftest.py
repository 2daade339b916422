"""Fixtures of the GPU driver's cluster tests (see harness/dra_gpu.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.dra_gpu import DriverProc, GpuEnv, running, setup_env, teardown_env, wait_slices
from tests.conftest import Cluster


# the package's, not the session's: its node must be gone before other
# packages count the session cluster's nodes
@pytest.fixture(scope="package")
def gpu_env(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GpuEnv]:
    env = setup_env(cluster.name, cluster.api, tmp_path_factory.mktemp("gpu-env"))
    try:
        yield env
    finally:
        teardown_env(cluster.api)


@pytest.fixture
def gpu_driver(gpu_env: GpuEnv, tmp_path: Path) -> Iterator[DriverProc]:
    """The driver running on our kwok node, its slices published."""
    with running(gpu_env, tmp_path) as d:
        wait_slices(gpu_env.api)
        yield d
