"""Teardown leaves nothing behind: after a clean stop, after a failed
start, after a crash (cleaned by the next start), and through the CLI."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from harness.waiting import wait_for
from tests.conftest import Cluster
from tests.realnode.conftest import MACHINE_WAIT_S, PodMaker, RealNode, wait_phase
from toposerve.localcluster.cluster import running_clusters
from toposerve.localcluster.realnode import node as realnode
from toposerve.localcluster.realnode.paths import default_layout
from toposerve.localcluster.realnode.pods import busybox_pod
from toposerve.localcluster.realnode.teardown import (
    alive,
    container_states,
    leftovers,
    our_processes,
)
from toposerve.main import main

pytestmark = [pytest.mark.cluster, pytest.mark.realnode]


def _running_containers(node: RealNode) -> tuple[list[int], list[Path]]:
    """PIDs of the containers' first processes and their cgroup directories."""
    pids, cgroups = [], []
    for state in container_states(node.layout.runc_root).values():
        pids.append(int(state["init_process_pid"]))
        cgroups += [Path(p) for p in state["cgroup_paths"].values()]
    return pids, cgroups


def _sleeping_pod(node: RealNode, make_pod: PodMaker, name: str) -> None:
    make_pod(busybox_pod(name, "sleep 3600"))
    wait_phase(node.core, name, {"Running"})


def test_stop_leaves_nothing(real_node: RealNode, make_pod: PodMaker) -> None:
    _sleeping_pod(real_node, make_pod, "rn-stop")
    pids, cgroups = _running_containers(real_node)
    assert len(pids) == 2 and cgroups  # the sandbox and the container
    assert leftovers(real_node.layout)  # the check sees a running node

    assert realnode.stop(real_node.cluster.name)
    assert leftovers(real_node.layout) == []
    assert not [p for p in pids if alive(p)]
    assert not [c for c in cgroups if c.exists()]
    assert not real_node.core.list_node(field_selector=f"metadata.name={real_node.name}").items
    assert not real_node.core.list_namespaced_pod("default",
                                                  field_selector="metadata.name=rn-stop").items


def test_failed_start_leaves_nothing(real_node_cluster: Cluster) -> None:
    realnode.stop(real_node_cluster.name)
    with pytest.raises(realnode.RealNodeError, match="Ready"):
        realnode.start(real_node_cluster.name, ready_timeout_s=0, wait_s=MACHINE_WAIT_S)
    assert leftovers(default_layout()) == []


def test_crashed_node_is_cleaned_by_the_next_start(real_node: RealNode,
                                                   make_pod: PodMaker) -> None:
    _sleeping_pod(real_node, make_pod, "rn-crash")
    pids, _ = _running_containers(real_node)
    owner = realnode.read_owner(real_node.layout)
    assert owner
    for pid in (owner.kubelet_pid, owner.containerd_pid):
        os.kill(pid, signal.SIGKILL)
    wait_for("kubelet and containerd gone",
             lambda: not alive(owner.kubelet_pid) and not alive(owner.containerd_pid))
    shims = [p for p, name in our_processes(real_node.layout).items()
             if name == "containerd-shim-runc-v2"]
    assert shims and all(alive(p) for p in pids)  # what a crash leaves behind

    assert realnode.running_owner() is None
    realnode.start(real_node.cluster.name)
    assert not [p for p in [*shims, *pids] if alive(p)]
    assert realnode.running_owner() is not None


def test_one_real_node_per_machine(real_node: RealNode) -> None:
    with pytest.raises(realnode.RealNodeError, match="already runs"):
        realnode.start(real_node.cluster.name)


def test_cli_up_with_real_node_and_down(real_node_cluster: Cluster,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    realnode.stop(real_node_cluster.name)  # the machine's one real node is needed here
    wait_for("the machine's real node free (another test run may hold it)",
             lambda: realnode.running_owner() is None, timeout=MACHINE_WAIT_S, interval=1)
    name = f"{real_node_cluster.name}-rn"[:32]
    try:
        assert main(["cluster", "up", "--name", name, "--profile", "hgx-h100=1",
                     "--real-node"]) == 0
        assert main(["cluster", "status"]) == 0
        line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith(f"{name}:"))
        assert "2/2 nodes Ready" in line and "real node 127.0.0.1 (kubelet)" in line
    finally:
        assert main(["cluster", "down", "--name", name]) == 0
    assert name not in running_clusters()
    assert leftovers(default_layout()) == []
