"""CPU profiles of the real scheduler, as scale runs and bench.dra_sched
take them: its pprof path is open on loopback, and the profile reads."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest

from tests.conftest import Cluster
from toposerve.localcluster.scale import profile

pytestmark = pytest.mark.cluster


def test_scheduler_cpu_profile(cluster: Cluster, tmp_path: Path) -> None:
    url, binary = profile.component(cluster.name, "kube-scheduler")
    assert url.startswith("https://127.0.0.1:") and binary.name == "kube-scheduler"
    got = profile.cpu_profile(cluster.name, "kube-scheduler", 1, tmp_path / "s.pprof")
    assert gzip.decompress(got.read_bytes())  # pprof's gzipped protobuf, not a 403 Status
    assert "Type: cpu" in profile.top(binary, got)
    with pytest.raises(LookupError, match="no component 'kube-nothing'"):
        profile.component(cluster.name, "kube-nothing")
