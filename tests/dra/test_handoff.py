"""The NIC mover against real netlink, in namespaces the test makes: a NIC
stand-in (veth) goes into a pod namespace renamed, addressed, with its MTU
and routes, answers a ping from the fabric, and comes back as it was;
every call is idempotent; the CNI plugin does the same from a driver's
record, in its own process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from ipaddress import ip_interface
from pathlib import Path
from typing import Any

import pytest

from dra_driver.net.config import NetConfig, parse_net_config
from dra_driver.net.handoff import cni
from dra_driver.net.handoff.journal import Step
from dra_driver.net.handoff.links import Namespace
from dra_driver.net.handoff.mover import HandoffError
from dra_driver.net.records import ClaimRecord, NicHandoff, write_record
from harness.handoff_netns import NetEnv, net_env

CONFIG = parse_net_config({
    "apiVersion": "net.toposerve.io/v1", "kind": "NetConfig", "interfaceName": "net1",
    "addresses": ["198.18.0.2/24"], "mtu": 1400,
    "routes": [{"destination": "198.19.0.0/24", "gateway": "198.18.0.1"}]})


@pytest.fixture
def env(tmp_path: Path) -> Iterator[NetEnv]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (run the tests as root)")
    with net_env(tmp_path) as e:
        yield e


def _assert_in_pod(env: NetEnv, config: NetConfig = CONFIG) -> None:
    nic = env.nics[0]
    [(where, link)] = env.where(nic)
    assert where == env.pod
    assert link.name == config.interfaceName and link.up and link.mtu == config.mtu
    assert {a for a in link.addresses if not a.ip.is_link_local} == set(config.addresses)
    with Namespace(env.pod) as pod:
        assert ("198.19.0.0/24", "198.18.0.1") in pod.routes_of(link)


def _assert_on_host(env: NetEnv) -> None:
    nic = env.nics[0]
    [(where, link)] = env.where(nic)
    assert where == env.host
    assert (link.name, link.mtu, link.up, link.addresses) == (nic.host_name, nic.mtu, False,
                                                              frozenset())


def test_attach_configures_the_nic_in_the_pod_and_detach_restores_it(env: NetEnv) -> None:
    mover = env.mover()
    got = mover.attach("sb1", env.pod, "nic0", CONFIG)
    assert (got.pod_name, got.mac) == ("net1", env.nics[0].mac)
    _assert_in_pod(env)
    entry = env.journal.read("nic0")
    assert entry is not None and entry.step == Step.ATTACHED and entry.hostMtu == 1500
    # the fabric end reaches the pod's address: the NIC really works in there
    ping = subprocess.run(["ip", "netns", "exec", Path(env.fabric).name, "busybox", "ping",
                           "-c1", "-W2", "198.18.0.2"], capture_output=True, text=True,
                          check=False)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    assert mover.detach_sandbox("sb1") == ["nic0"]
    _assert_on_host(env)
    assert env.journal.entries() == []


def test_every_call_is_idempotent(env: NetEnv) -> None:
    mover = env.mover()
    assert mover.detach_sandbox("sb1") == []  # DEL without ADD
    mover.attach("sb1", env.pod, "nic0", CONFIG)
    mover.attach("sb1", env.pod, "nic0", CONFIG)  # ADD twice
    _assert_in_pod(env)
    mover.detach_sandbox("sb1")
    assert mover.detach_sandbox("sb1") == []  # DEL twice
    _assert_on_host(env)


def test_a_changed_config_is_applied_and_the_host_name_kept(env: NetEnv) -> None:
    mover = env.mover()
    mover.attach("sb1", env.pod, "nic0", CONFIG)
    plain = NetConfig(addresses=[ip_interface("198.18.0.3/24")])
    mover.attach("sb1", env.pod, "nic0", plain)
    [(where, link)] = env.where(env.nics[0])
    assert (where, link.name, link.mtu) == (env.pod, "nic0", 1500)
    mover.detach_sandbox("sb1")
    _assert_on_host(env)


def test_a_nic_in_one_pod_is_refused_to_another(env: NetEnv) -> None:
    mover = env.mover()
    mover.attach("sb1", env.pod, "nic0", CONFIG)
    other = env.new_pod("other")
    with pytest.raises(HandoffError, match="in use by pod sandbox sb1"):
        mover.attach("sb2", other, "nic0", CONFIG)
    _assert_in_pod(env)


def test_a_name_taken_in_the_pod_fails_and_leaves_the_nic_on_the_host(env: NetEnv) -> None:
    mover = env.mover()
    mover.attach("sb1", env.pod, "nic1", NetConfig(interfaceName="net1"))
    with pytest.raises(HandoffError, match="already has an interface named net1"):
        mover.attach("sb1", env.pod, "nic0", CONFIG)
    assert [w for w, _ in env.where(env.nics[0])] == [env.host]
    mover.detach_sandbox("sb1")  # what the runtime does after a failed ADD
    _assert_on_host(env)
    assert env.journal.entries() == []


def test_repair_takes_back_a_nic_whose_pod_namespace_is_gone(env: NetEnv) -> None:
    mover = env.mover()
    gone = env.new_pod("gone")
    mover.attach("sb1", gone, "nic0", CONFIG)
    # a physical NIC returns to the host when its namespace goes; a veth
    # stand-in goes with it, so move it out the way the kernel would
    with Namespace(gone) as pod, Namespace(env.host) as host:
        link = pod.find("net1")
        assert link is not None
        pod.move(link, host, "dev7")
    env.remove_pod(gone)
    assert mover.repair() == ["nic0"]
    _assert_on_host(env)


def _record(env: NetEnv, state: Path, pod_uid: str) -> None:
    write_record(state, ClaimRecord(claimUid="c-1", claim="default/nic", podUids=[pod_uid],
                                    nics=[NicHandoff(device="nic-0", hostIfName="nic0",
                                                     pciAddress=None, config=CONFIG)]))


def _conf(tmp: Path, prev: dict[str, Any] | None = None) -> dict[str, Any]:
    conf: dict[str, Any] = {"cniVersion": "1.0.0", "name": "t", "type": cni.PLUGIN_TYPE,
                               "stateDir": str(tmp / "records"),
                               "journalDir": str(tmp / "journal")}
    if prev is not None:
        conf["prevResult"] = prev
    return conf


PREV: dict[str, Any] = {
    "cniVersion": "1.0.0", "interfaces": [{"name": "eth0", "mac": "aa", "sandbox": "x"}],
    "ips": [{"address": "127.9.0.2/32", "interface": 0}], "routes": [], "dns": {}}


def test_cni_add_moves_the_pods_nics_and_passes_the_result_on(env: NetEnv, tmp_path: Path
                                                              ) -> None:
    _record(env, tmp_path / "records", "pod-1")
    host = env.host
    base = {"CNI_CONTAINERID": "sb1", "CNI_NETNS": env.pod, "CNI_IFNAME": "eth0",
            "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_UID=pod-1"}
    out = cni.run({**base, "CNI_COMMAND": "ADD"}, _conf(tmp_path, PREV), host)
    assert out is not None
    assert [i["name"] for i in out["interfaces"]] == ["eth0", "net1"]
    assert out["ips"][1] == {"address": "198.18.0.2/24", "interface": 1}
    _assert_in_pod(env)
    assert cni.run({**base, "CNI_COMMAND": "CHECK"}, _conf(tmp_path, out), host) is None
    other = {**base, "CNI_ARGS": "K8S_POD_UID=pod-2", "CNI_CONTAINERID": "sb2"}
    out2 = cni.run({**other, "CNI_COMMAND": "ADD", "CNI_NETNS": env.new_pod("p2")},
                   _conf(tmp_path, PREV), host)
    assert out2 is not None and out2["interfaces"] == PREV["interfaces"]  # no claim: as it was
    # DEL finds the NIC from the journal: no record, no namespace path needed
    (tmp_path / "records" / "c-1.json").unlink()
    assert cni.run({**base, "CNI_COMMAND": "DEL", "CNI_NETNS": ""}, _conf(tmp_path), host) is None
    _assert_on_host(env)


def test_cni_plugin_process_after_a_driver_restart(env: NetEnv, tmp_path: Path) -> None:
    """The record is all the plugin needs: written by a driver that has since
    gone, read by the plugin in a fresh process (as containerd runs it),
    moving the NIC in the host namespace it runs in."""
    _record(env, tmp_path / "records", "pod-1")
    conf = json.dumps(_conf(tmp_path, PREV))
    base = {**os.environ, "CNI_CONTAINERID": "sb1", "CNI_NETNS": env.pod, "CNI_IFNAME": "eth0",
            "CNI_ARGS": "K8S_POD_UID=pod-1", "CNI_PATH": "/nonexistent"}
    plugin = ["ip", "netns", "exec", Path(env.host).name, sys.executable, "-m",
              "dra_driver.net.handoff.cni"]
    add = subprocess.run(plugin, input=conf, env={**base, "CNI_COMMAND": "ADD"},
                         capture_output=True, text=True, check=False)
    assert add.returncode == 0, add.stdout + add.stderr
    assert json.loads(add.stdout)["interfaces"][1]["name"] == "net1"
    _assert_in_pod(env)
    delete = subprocess.run(plugin, input=conf, env={**base, "CNI_COMMAND": "DEL"},
                            capture_output=True, text=True, check=False)
    assert delete.returncode == 0, delete.stdout + delete.stderr
    _assert_on_host(env)
    bad = subprocess.run(plugin, input=conf, env={**base, "CNI_COMMAND": "ADD",
                                                  "CNI_NETNS": "/nonexistent"},
                         capture_output=True, text=True, check=False)
    assert bad.returncode == 1 and "does not exist" in json.loads(bad.stdout)["msg"]


def test_the_plugins_default_paths_are_the_drivers() -> None:
    from dra_driver.net.handoff.journal import DEFAULT_JOURNAL_DIR
    from dra_driver.net.records import DEFAULT_STATE_DIR

    assert (cni.STATE_DIR, cni.JOURNAL_DIR) == (DEFAULT_STATE_DIR, DEFAULT_JOURNAL_DIR)



def test_a_resident_server_does_the_call_and_its_absence_changes_nothing(
        env: NetEnv, tmp_path: Path) -> None:
    from dra_driver.net.handoff.server import HandoffServer

    _record(env, tmp_path / "records", "pod-1")
    sock = tmp_path / "handoff.sock"
    conf = json.dumps({**_conf(tmp_path, PREV), "serverSocket": str(sock)})
    base = {**os.environ, "CNI_CONTAINERID": "sb1", "CNI_NETNS": env.pod, "CNI_IFNAME": "eth0",
            "CNI_ARGS": "K8S_POD_UID=pod-1", "CNI_PATH": "/nonexistent"}
    plugin = ["ip", "netns", "exec", Path(env.host).name, sys.executable, "-m",
              "dra_driver.net.handoff.cni"]
    server = HandoffServer(sock, host_netns=env.host).start()
    try:
        add = subprocess.run(plugin, input=conf, env={**base, "CNI_COMMAND": "ADD"},
                             capture_output=True, text=True, check=False)
        assert add.returncode == 0, add.stdout + add.stderr
        assert json.loads(add.stdout)["interfaces"][1]["name"] == "net1"
        assert server.served == 1
        _assert_in_pod(env)
        bad = subprocess.run(plugin, input=conf, env={**base, "CNI_COMMAND": "ADD",
                                                      "CNI_NETNS": "/nonexistent"},
                             capture_output=True, text=True, check=False)
        assert bad.returncode == 1 and "does not exist" in json.loads(bad.stdout)["msg"]
    finally:
        server.stop()
    sock.touch()  # a dead server's socket file: nobody answers, the plugin does it itself
    delete = subprocess.run(plugin, input=conf, env={**base, "CNI_COMMAND": "DEL"},
                            capture_output=True, text=True, check=False)
    assert delete.returncode == 0, delete.stdout + delete.stderr
    _assert_on_host(env)
