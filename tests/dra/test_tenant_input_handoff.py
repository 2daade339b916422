"""What a pod with a NIC can leave behind must not stop the hand-off of
every other pod on the node: the CNI plugin is chained after the pod
network, so each ADD of any pod first repairs the journal, and one entry
whose NIC cannot be brought back (its host name taken meanwhile, e.g. by
another NIC a tenant renamed in its pod and that came home under that
name) failed every pod's ADD, and the driver's start-up repair with it.
Needs root for network namespaces made and removed by the test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.handoff_netns import NetEnv, net_env
from toposerve.dra_driver.kubeletplugin import parse_opaque
from toposerve.dra_driver.net.config import NetConfig
from toposerve.dra_driver.net.handoff import cni
from toposerve.dra_driver.net.handoff.journal import Step
from toposerve.dra_driver.net.handoff.links import Namespace
from toposerve.dra_driver.net.handoff.mover import repair_journal
from toposerve.dra_driver.net.records import ClaimRecord, NicHandoff, write_record

CONFIG = parse_opaque({"apiVersion": "net.toposerve.io/v1", "kind": "NetConfig",
                       "interfaceName": "net1"}, NetConfig)
UID = "11111111-2222-4333-8444-555555555555"


@pytest.fixture
def env(tmp_path: Path) -> Iterator[NetEnv]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (run the tests as root)")
    with net_env(tmp_path) as e:
        yield e


def _call(env: NetEnv, tmp: Path, command: str, sandbox: str, netns: str, pod: str) -> None:
    conf = {"cniVersion": "1.0.0", "stateDir": str(tmp / "state"),
            "journalDir": str(env.journal.folder)}
    cni.run({"CNI_COMMAND": command, "CNI_CONTAINERID": sandbox, "CNI_NETNS": netns,
             "CNI_ARGS": f"K8S_POD_UID={pod}"}, conf, env.host)


def test_a_nic_that_cannot_come_home_blocks_only_its_own_pod(env: NetEnv,
                                                             tmp_path: Path) -> None:
    write_record(tmp_path / "state", ClaimRecord(
        claimUid=UID, claim="t2/c", podUids=["pod-b"],
        nics=[NicHandoff(device="pci-x", hostIfName="nic0", config=CONFIG)]))
    _call(env, tmp_path, "ADD", "sb-b", env.pod, "pod-b")
    with Namespace(env.host) as host, Namespace(env.fabric) as fabric:
        host.add_veth("nic0", "02:11:22:33:44:55", 1500, "fabx", fabric)  # nic0's name, taken
    with pytest.raises(Exception, match="File exists"):  # its own DEL cannot finish
        _call(env, tmp_path, "DEL", "sb-b", env.pod, "pod-b")
    other = env.new_pod("other")
    try:
        _call(env, tmp_path, "ADD", "sb-c", other, "pod-c")  # any other pod: unaffected
        _call(env, tmp_path, "DEL", "sb-c", other, "pod-c")
    finally:
        env.remove_pod(other)
    assert repair_journal(env.journal, env.host) == []  # the driver still starts
    [entry] = env.journal.entries()  # kept for a later retry, not forgotten
    assert (entry.hostIfName, entry.sandbox, entry.step) == ("nic0", "sb-b", Step.DETACHING)
