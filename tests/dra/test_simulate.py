"""``toposerve driver simulate`` as a user runs it: slices for every kwok
fake node, a node that comes and goes, health and readiness, a clean stop
on SIGTERM, and ``--uninstall``."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from kubernetes.client import CoreV1Api
from prometheus_client.parser import text_string_to_metric_families

from harness.waiting import wait_for
from tests.conftest import Cluster
from toposerve.dra_driver.gpu.devices import DRIVER as GPU_DRIVER
from toposerve.dra_driver.gpu.devices import PARTITIONS_LABEL
from toposerve.dra_driver.simulate import LABELS, label_partitions, sim_node
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster.nodes import node_manifest
from toposerve.localcluster.ports import free_port
from toposerve.topology.labels import PRESETS, DialectName
from toposerve.topology.layout import plan_nodes
from toposerve.topology.profiles import load_profile

pytestmark = pytest.mark.cluster
REPO = Path(__file__).resolve().parents[2]
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def _slices(rest: JsonApi, node: str | None = None) -> list[dict[str, Any]]:
    q = [("labelSelector", ",".join(f"{k}={v}" for k, v in LABELS.items()))]
    if node:
        q.append(("fieldSelector", f"spec.nodeName={node}"))
    return list(rest.request("GET", SLICES, q)["items"])


def _simulate(cluster: Cluster, tmp: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    log = tmp / "simulate.log"
    p = subprocess.Popen(
        [sys.executable, "-m", "toposerve.main", "driver", "simulate", "--cluster",
         cluster.name, "--http-address", f"127.0.0.1:{port}", *extra],
        cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    return p, f"http://127.0.0.1:{port}"


@contextlib.contextmanager
def _running(cluster: Cluster, tmp: Path, *extra: str) -> Iterator[str]:
    """The command until the block stops it, which must end it with SIGTERM."""
    proc, url = _simulate(cluster, tmp, *extra)
    try:
        yield url
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _code(url: str) -> int:
    try:
        return httpx.get(url, timeout=2).status_code
    except httpx.HTTPError:
        return 0


def _writes(url: str) -> float:
    return sum(s.value for fam in text_string_to_metric_families(httpx.get(url + "/metrics").text)
               for s in fam.samples if s.name == "toposerve_dra_slice_writes_total")


def test_sim_node_reads_profile_and_place() -> None:
    fake = {"metadata": {"name": "n1", "uid": "u1", "annotations": {"kwok.x-k8s.io/node": "fake"},
                         "labels": {"topology.toposerve.io/profile": "mi300x",
                                    "topology.toposerve.io/rack": "r1"}}}
    got = sim_node(fake, None, DialectName.TOPOSERVE)
    assert not isinstance(got, str) and got is not None
    assert (got.profile, got.uid, got.path.rack) == ("mi300x", "u1", "r1")
    over = sim_node(fake, "hgx-h100", DialectName.TOPOSERVE)
    assert not isinstance(over, str) and over is not None and over.profile == "hgx-h100"
    real = {"metadata": {"name": "n2", "labels": {"topology.toposerve.io/profile": "mi300x"}}}
    assert sim_node(real, None, DialectName.TOPOSERVE) is None  # a real kubelet node: not ours
    bare = {"metadata": {"name": "n3", "annotations": {"kwok.x-k8s.io/node": "fake"}}}
    assert "give --profile" in str(sim_node(bare, None, DialectName.TOPOSERVE))


def test_simulate_command(cluster: Cluster, tmp_path: Path) -> None:
    rest = JsonApi(cluster.api)
    nodes = sum(c for _, c in cluster.groups)
    extra = "mi300x-0099"
    try:
        with _running(cluster, tmp_path) as url:
            wait_for("ready", lambda: _code(url + "/readyz") == 200, timeout=120, interval=0.3)
            assert _code(url + "/healthz") == 200
            assert len({o["spec"]["nodeName"] for o in _slices(rest)}) == nodes
            assert _writes(url) == len(_slices(rest))  # one create each, nothing more
            # a node joins: its slices follow; it leaves: they go
            profile = load_profile("mi300x")
            (planned,) = [n for n in plan_nodes([(profile, 100)]) if n.name == extra]
            rest.request("POST", "/api/v1/nodes",
                         body=node_manifest(planned, profile, PRESETS[DialectName.TOPOSERVE]))
            wait_for("slices of the new node", lambda: len(_slices(rest, extra)) == 2,
                     timeout=60)
            rest.request("DELETE", f"/api/v1/nodes/{extra}")
            wait_for("slices of the node gone", lambda: not _slices(rest, extra), timeout=60)
    finally:
        try:
            rest.request("DELETE", f"/api/v1/nodes/{extra}")
        except ApiError as err:
            assert err.status == 404
    # the slices stay when the process stops; a restarted one writes nothing
    before = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in _slices(rest)}
    assert len({o["spec"]["nodeName"] for o in _slices(rest)}) == nodes
    with _running(cluster, tmp_path) as url:
        wait_for("ready again", lambda: _code(url + "/readyz") == 200, timeout=120,
                 interval=0.3)
        assert _writes(url) == 0
        assert {o["metadata"]["name"]: o["metadata"]["resourceVersion"]
                for o in _slices(rest)} == before
    # --uninstall takes them away
    p, _ = _simulate(cluster, tmp_path, "--uninstall")
    assert p.wait(timeout=60) == 0
    assert _slices(rest) == []


def _gpu_devices(rest: JsonApi, node: str) -> int:
    return sum(len(o["spec"].get("devices", ())) for o in _slices(rest, node)
               if o["spec"]["driver"] == GPU_DRIVER)


def test_simulate_follows_the_partitions_label(cluster: Cluster, tmp_path: Path) -> None:
    rest = JsonApi(cluster.api)
    node = "hgx-h100-0000"
    try:
        with _running(cluster, tmp_path) as url:
            wait_for("ready", lambda: _code(url + "/readyz") == 200, timeout=120, interval=0.3)
            assert _gpu_devices(rest, node) == 8 * (1 + 9)
            # MIG off on this node: whole GPUs only, in one slice without counters
            label_partitions(cluster.api, [node], on=False)
            wait_for("whole GPUs only", lambda: _gpu_devices(rest, node) == 8, timeout=60)
            assert [len(o["spec"].get("sharedCounters", ())) for o in _slices(rest, node)
                    if o["spec"]["driver"] == GPU_DRIVER] == [0]
            label_partitions(cluster.api, [node], on=True)
            wait_for("partitions again", lambda: _gpu_devices(rest, node) == 80, timeout=60)
    finally:
        CoreV1Api(cluster.api).patch_node(node, {"metadata": {"labels": {PARTITIONS_LABEL: None}}})
        p, _ = _simulate(cluster, tmp_path, "--uninstall")
        assert p.wait(timeout=60) == 0


def test_simulate_publishes_for_the_drivers_asked(cluster: Cluster, tmp_path: Path) -> None:
    """A cluster that runs the GPU driver alone: no NIC slices beside its GPUs."""
    rest = JsonApi(cluster.api)
    nodes = sum(c for _, c in cluster.groups)
    try:
        with _running(cluster, tmp_path, "--drivers", GPU_DRIVER) as url:
            wait_for("ready", lambda: _code(url + "/readyz") == 200, timeout=120, interval=0.3)
            got = _slices(rest)
            assert {o["spec"]["driver"] for o in got} == {GPU_DRIVER}
            assert len({o["spec"]["nodeName"] for o in got}) == nodes
        p, _ = _simulate(cluster, tmp_path, "--drivers", "nvidia.com")
        assert p.wait(timeout=60) != 0
        assert "drivers: nvidia.com; choose from" in (tmp_path / "simulate.log").read_text()
    finally:
        p, _ = _simulate(cluster, tmp_path, "--uninstall")
        assert p.wait(timeout=60) == 0
