"""``toposerve cluster`` against real processes: refusing a second cluster
of the same name, ``up --crd`` installing a CRD, and ``down`` ending every
process ``up`` started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client

from tests.conftest import Cluster
from toposerve.kubeapi import JsonApi
from toposerve.localcluster import crds
from toposerve.localcluster.clusters import api_client, cluster_dir
from toposerve.localcluster.processes import processes_under

pytestmark = pytest.mark.cluster
CLI = [sys.executable, "-m", "toposerve.main"]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=600,
                          check=False)


def test_second_cluster_with_same_name_refused(cluster: Cluster) -> None:
    r = cli("cluster", "up", "--name", cluster.name, "--profile", "hgx-h100=1")
    assert r.returncode == 2
    assert f"cluster {cluster.name!r} already exists" in r.stderr
    # the running cluster is untouched
    assert len(client.CoreV1Api(cluster.api).list_node().items) == sum(
        c for _, c in cluster.groups)


def test_status_and_kubeconfig(cluster: Cluster) -> None:
    r = cli("cluster", "status")
    assert r.returncode == 0
    line = next(x for x in r.stdout.splitlines() if x.startswith(cluster.name + ":"))
    total = sum(c for _, c in cluster.groups)
    assert f"{total}/{total} nodes Ready" in line
    r = cli("cluster", "kubeconfig", "--name", cluster.name)
    assert r.returncode == 0 and Path(r.stdout.strip()).is_file()
    r = cli("cluster", "kubeconfig", "--name", "no-such-cluster")
    assert r.returncode == 2 and "no cluster named 'no-such-cluster'" in r.stderr


def test_topology_show_reads_live_labels(cluster: Cluster) -> None:
    r = cli("topology", "show", "--name", cluster.name)
    assert r.returncode == 0, r.stderr
    assert "rack gb200-nvl72-b0-r0  (1 NVLink domains, 18 nodes)" in r.stdout
    assert "rack hgx-h100-b0-r0  (4 NVLink domains, 4 nodes)" in r.stdout


def test_down_ends_every_process() -> None:
    name = "pytest-down"
    workdir = cluster_dir(name)
    cli("cluster", "down", "--name", name)  # leftovers from an interrupted run
    r = cli("cluster", "up", "--name", name, "--profile", "mi300x=2", "--crd", "inference-pool")
    assert r.returncode == 0, r.stderr
    # --crd: the InferencePool v1 CRD of the pinned module version, served
    crd = JsonApi(api_client(name)).request(
        "GET", f"{crds.PATH}/inferencepools.inference.networking.k8s.io")
    assert crds.established(crd)
    assert crd["metadata"]["annotations"][crds.INFERENCE_POOL.version_annotation] == "v1.6.0"
    started = processes_under(workdir)
    # etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok-controller
    assert len(started) >= 5, started
    r = cli("cluster", "down", "--name", name)
    assert r.returncode == 0, r.stderr
    assert processes_under(workdir) == []
    assert not workdir.exists()
    r = cli("cluster", "down", "--name", name)
    assert r.returncode == 2 and f"no cluster named {name!r}" in r.stderr


def test_failed_up_leaves_nothing(tmp_path: Path) -> None:
    name = "pytest-broken"
    bad = tmp_path / "sched.yaml"
    bad.write_text("apiVersion: kubescheduler.config.k8s.io/v1\n"
                   "kind: KubeSchedulerConfiguration\n"
                   "profiles: [{plugins: {score: {enabled: [{name: NoSuch}]}}}]\n")
    r = cli("cluster", "up", "--name", name, "--profile", "hgx-h100=1",
            "--scheduler-config", str(bad))
    assert r.returncode != 0
    assert processes_under(cluster_dir(name)) == []
    assert not cluster_dir(name).exists()
    assert name not in cli("cluster", "status").stdout
