"""A test run's claim on a named local cluster: a second live run with the
same name is refused, a dead holder's record is taken over."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from harness import cluster_claim
from harness.cluster_claim import ClusterInUse, claimed, live_holder

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


def _record(pid: int) -> str:
    return f"{pid} {psutil.Process(pid).create_time():.2f}"


def test_a_holder_is_live_only_with_its_own_start_time() -> None:
    me = os.getpid()
    assert live_holder(_record(me)) == me
    assert live_holder(f"{me} 12.00") is None  # the pid reused by another process
    assert live_holder("") is None
    assert live_holder("not a pid") is None


def test_another_live_run_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_claim, "HOLDERS", tmp_path)
    other = os.getppid()  # alive, and not this process
    (tmp_path / "c1").write_text(_record(other))
    with (pytest.raises(ClusterInUse, match=rf"pid {other}.*TOPOSERVE_TEST_CLUSTER"),
          claimed("c1")):
        raise AssertionError("ran while another run holds the cluster")
    assert (tmp_path / "c1").read_text() == _record(other)  # its record left alone


def test_a_dead_holders_record_is_taken_over(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_claim, "HOLDERS", tmp_path)
    monkeypatch.setattr(cluster_claim, "running_clusters", lambda: [])
    (tmp_path / "c2").write_text(f"{os.getpid()} 12.00")  # a process long gone
    with claimed("c2"):
        assert (tmp_path / "c2").read_text() == _record(os.getpid())
    assert not (tmp_path / "c2").exists()
