"""The NIC mover against real netlink, in namespaces the test makes: a NIC
stand-in (veth) goes into a pod namespace renamed, addressed, with its MTU
and routes, answers a ping from the fabric, and comes back as it was;
every call is idempotent; the CNI calls do the same from a driver's
record, served by a resident server to the Go forwarder containerd execs."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from ipaddress import ip_interface
from pathlib import Path
from typing import Any

import pytest

from harness.handoff_netns import NetEnv, net_env
from toposerve.dra_driver.kubeletplugin import parse_opaque
from toposerve.dra_driver.net.config import NetConfig
from toposerve.dra_driver.net.handoff import cni
from toposerve.dra_driver.net.handoff.journal import Step
from toposerve.dra_driver.net.handoff.links import Namespace
from toposerve.dra_driver.net.handoff.mover import HandoffError, repair_journal
from toposerve.dra_driver.net.records import ClaimRecord, NicHandoff, write_record
from toposerve.localcluster.realnode import forwarder

CONFIG = parse_opaque({
    "apiVersion": "net.toposerve.io/v1", "kind": "NetConfig", "interfaceName": "net1",
    "addresses": ["198.18.0.2/24"], "mtu": 1400,
    "routes": [{"destination": "198.19.0.0/24", "gateway": "198.18.0.1"}]}, NetConfig)


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
    assert link.name == config.interface_name and link.up and link.mtu == config.mtu
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


DUAL = parse_opaque({
    "apiVersion": "net.toposerve.io/v1", "kind": "NetConfig", "interfaceName": "net1",
    "addresses": ["198.18.0.2/24", "2001:db8:18::2/64"], "mtu": 1400,
    "routes": [{"destination": "2001:db8:19::/64", "gateway": "2001:db8:18::1"}]}, NetConfig)


def test_ipv6_addresses_and_routes_in_the_pod(env: NetEnv) -> None:
    """Dual stack from the documentation range (2001:db8::/32), only inside the
    test's namespaces: the v6 address is usable at once (no DAD wait), its
    route is there, the fabric reaches it; back on the host nothing is left
    (the kernel's own fe80:: aside)."""
    with Namespace(env.fabric) as fabric:
        far = fabric.find("fab0")
        assert far is not None
        fabric.set_addresses(far, [*far.addresses, ip_interface("2001:db8:18::1/64")])
    mover = env.mover()
    mover.attach("sb1", env.pod, "nic0", DUAL)
    [(where, link)] = env.where(env.nics[0])
    assert where == env.pod and link.up and link.mtu == 1400
    assert {a for a in link.addresses if not a.ip.is_link_local} == set(DUAL.addresses)
    with Namespace(env.pod) as pod:
        assert ("2001:db8:19::/64", "2001:db8:18::1") in pod.routes_of(link)
    ping = subprocess.run(["ip", "netns", "exec", Path(env.fabric).name, "busybox", "ping",
                           "-6", "-c1", "-W2", "2001:db8:18::2"], capture_output=True,
                          text=True, check=False)
    assert ping.returncode == 0, ping.stdout + ping.stderr
    mover.detach_sandbox("sb1")
    [(where, link)] = env.where(env.nics[0])
    assert where == env.host and not any(a.version == 6 and not a.ip.is_link_local
                                         for a in link.addresses)
    _assert_on_host(env)


def test_a_link_gone_between_lookup_and_read_is_not_found(env: NetEnv) -> None:
    """A namespace torn down meanwhile deletes links under a reader's feet:
    a link looked up by name and gone before it is read counts as absent."""
    with Namespace(env.pod) as pod, Namespace(env.fabric) as fabric:
        link = pod.add_veth("gone0", "02:00:00:00:0a:01", 1500, "gone0-far", fabric)
        pod.delete(link)
        assert pod._still_there(link.index) is None
        assert pod.find("gone0", "02:00:00:00:0a:01") is None


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
    mover.attach("sb1", env.pod, "nic1", NetConfig(interface_name="net1"))
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


CLAIM_UID = "0b7c5a56-0d0e-4f43-9a57-4f1d0a6f2a01"


def _record(env: NetEnv, state: Path, pod_uid: str, config: NetConfig = CONFIG) -> None:
    write_record(state, ClaimRecord(claimUid=CLAIM_UID, claim="default/nic", podUids=[pod_uid],
                                    nics=[NicHandoff(device="nic-0", hostIfName="nic0",
                                                     pciAddress=None, config=config)]))


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
    (tmp_path / "records" / f"{CLAIM_UID}.json").unlink()
    assert cni.run({**base, "CNI_COMMAND": "DEL", "CNI_NETNS": ""}, _conf(tmp_path), host) is None
    _assert_on_host(env)


def test_the_plugins_default_paths_are_the_drivers_and_the_forwarders() -> None:
    from toposerve.dra_driver.net.handoff.journal import DEFAULT_JOURNAL_DIR
    from toposerve.dra_driver.net.records import DEFAULT_STATE_DIR

    assert (cni.STATE_DIR, cni.JOURNAL_DIR) == (DEFAULT_STATE_DIR, DEFAULT_JOURNAL_DIR)
    go = (forwarder.SOURCE / "main.go").read_text()
    consts = dict(re.findall(r'default(\w+)\s*=\s*"([^"]+)"', go))
    assert consts == {"StateDir": str(cni.STATE_DIR), "JournalDir": str(cni.JOURNAL_DIR),
                      "Socket": str(cni.SERVER_SOCKET)}


@pytest.fixture(scope="module")
def plugin_exe() -> Path:
    """The Go forwarder containerd would exec (built once, cached by source hash)."""
    return forwarder.build()


def _exec(exe: Path, env: NetEnv, conf: dict[str, Any], command: str, **over: str
          ) -> tuple[int, dict[str, Any] | None]:
    """The plugin as containerd runs it (config on stdin, CNI_* only), in the
    test's "host" namespace; (exit code, stdout's JSON)."""
    cni_env = {"CNI_COMMAND": command, "CNI_CONTAINERID": "sb1", "CNI_NETNS": env.pod,
               "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent",
               "CNI_ARGS": "IgnoreUnknown=1;K8S_POD_UID=pod-1", **over}
    out = subprocess.run(["ip", "netns", "exec", Path(env.host).name, str(exe)],
                         input=json.dumps(conf), env={"PATH": os.environ["PATH"], **cni_env},
                         capture_output=True, text=True, check=False)
    assert out.stderr == "" or out.returncode != 0, out.stderr
    return out.returncode, json.loads(out.stdout) if out.stdout else None


def test_the_forwarder_has_the_resident_server_do_each_call(
        env: NetEnv, tmp_path: Path, plugin_exe: Path) -> None:
    """The record is all the server needs (a driver restarted between prepare
    and ADD serves it); its results and its CNI errors come back verbatim."""
    from toposerve.dra_driver.net.handoff.server import HandoffServer

    _record(env, tmp_path / "records", "pod-1")
    sock = tmp_path / "handoff.sock"
    conf = {**_conf(tmp_path, PREV), "serverSocket": str(sock)}
    server = HandoffServer(sock, host_netns=env.host).start()
    try:
        assert _exec(plugin_exe, env, conf, "VERSION") == (
            0, {"cniVersion": "1.0.0", "supportedVersions": ["0.4.0", "1.0.0"]})
        rc, added = _exec(plugin_exe, env, conf, "ADD")
        assert rc == 0 and added is not None and added == cni.run(
            {"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "sb1", "CNI_NETNS": env.pod,
             "CNI_ARGS": "K8S_POD_UID=pod-1"}, _conf(tmp_path, PREV), env.host)  # ADD twice
        assert [i["name"] for i in added["interfaces"]] == ["eth0", "net1"]
        _assert_in_pod(env)
        assert _exec(plugin_exe, env, {**conf, "prevResult": added}, "CHECK") == (0, None)
        rc, bad = _exec(plugin_exe, env, conf, "ADD", CNI_NETNS="/nonexistent")
        assert rc == 1 and bad is not None and "does not exist" in bad["msg"]
        assert _exec(plugin_exe, env, conf, "DEL", CNI_NETNS="") == (0, None)
        _assert_on_host(env)
        assert server.served == 3  # ADD, CHECK, DEL (the in-process ADD and the error not)
    finally:
        server.stop()


def test_without_the_server_the_forwarder_decides_only_what_is_safe(
        env: NetEnv, tmp_path: Path, plugin_exe: Path) -> None:
    """No server: a pod without NICs still gets its network, a pod with one
    fails (code 11, "try again later", naming the socket) and so does a DEL
    of a sandbox that holds a NIC; a DEL with nothing to undo succeeds."""
    from toposerve.dra_driver.net.handoff.server import HandoffServer

    _record(env, tmp_path / "records", "pod-1")
    sock = tmp_path / "handoff.sock"
    conf = {**_conf(tmp_path, PREV), "serverSocket": str(sock)}
    rc, out = _exec(plugin_exe, env, conf, "ADD", CNI_ARGS="K8S_POD_UID=pod-2",
                    CNI_CONTAINERID="sb2")
    assert rc == 0 and out == PREV  # no record mentions pod-2: passed on
    rc, out = _exec(plugin_exe, env, conf, "ADD")
    assert rc == 1 and out is not None and out["code"] == 11
    assert f"does not answer on {sock}" in out["msg"] and "pod pod-1 has NICs" in out["msg"]
    _assert_on_host(env)
    assert _exec(plugin_exe, env, conf, "DEL") == (0, None)  # nothing of sb1 in the journal

    server = HandoffServer(sock, host_netns=env.host).start()
    try:
        assert _exec(plugin_exe, env, conf, "ADD")[0] == 0
    finally:
        server.stop()
    _assert_in_pod(env)
    sock.touch()  # a dead server's socket file: nobody listens
    rc, out = _exec(plugin_exe, env, conf, "DEL")
    assert rc == 1 and out is not None and out["code"] == 11
    assert "sandbox sb1 holds nic0" in out["msg"]
    _assert_in_pod(env)  # left where it is, configured, until the driver is back
    assert _exec(plugin_exe, env, conf, "DEL", CNI_CONTAINERID="sb9") == (0, None)
    server = HandoffServer(sock, host_netns=env.host).start()
    try:
        assert _exec(plugin_exe, env, conf, "DEL") == (0, None)  # the runtime's retry
    finally:
        server.stop()
    _assert_on_host(env)
    rc, out = _exec(plugin_exe, env, conf, "BOGUS")
    assert rc == 1 and out is not None and out["code"] == 4


def test_the_forwarders_result_has_the_pods_ipv6_address(
        env: NetEnv, tmp_path: Path, plugin_exe: Path) -> None:
    from toposerve.dra_driver.net.handoff.server import HandoffServer

    _record(env, tmp_path / "records", "pod-1", DUAL)
    sock = tmp_path / "handoff.sock"
    conf = {**_conf(tmp_path, PREV), "serverSocket": str(sock)}
    server = HandoffServer(sock, host_netns=env.host).start()
    try:
        rc, out = _exec(plugin_exe, env, conf, "ADD")
        assert rc == 0 and out is not None
        assert out["ips"][1:] == [{"address": "198.18.0.2/24", "interface": 1},
                                  {"address": "2001:db8:18::2/64", "interface": 1}]
        [(where, link)] = env.where(env.nics[0])
        assert where == env.pod and ip_interface("2001:db8:18::2/64") in link.addresses
        assert _exec(plugin_exe, env, conf, "DEL") == (0, None)
    finally:
        server.stop()
    _assert_on_host(env)


# What a pod with a NIC can leave behind must not stop the hand-off of every
# other pod on the node: the CNI plugin is chained after the pod network, so
# each ADD of any pod first repairs the journal, and one entry whose NIC
# cannot be brought back (its host name taken meanwhile, e.g. by another NIC
# a tenant renamed in its pod that came home under that name) failed every
# pod's ADD, and the driver's start-up repair with it.
BARE = parse_opaque({"apiVersion": "net.toposerve.io/v1", "kind": "NetConfig",
                     "interfaceName": "net1"}, NetConfig)
TENANT_UID = "11111111-2222-4333-8444-555555555555"


def _tenant_call(env: NetEnv, tmp: Path, command: str, sandbox: str, netns: str, pod: str) -> None:
    conf = {"cniVersion": "1.0.0", "stateDir": str(tmp / "state"),
            "journalDir": str(env.journal.folder)}
    cni.run({"CNI_COMMAND": command, "CNI_CONTAINERID": sandbox, "CNI_NETNS": netns,
             "CNI_ARGS": f"K8S_POD_UID={pod}"}, conf, env.host)


def test_a_nic_that_cannot_come_home_blocks_only_its_own_pod(env: NetEnv,
                                                             tmp_path: Path) -> None:
    write_record(tmp_path / "state", ClaimRecord(
        claimUid=TENANT_UID, claim="t2/c", podUids=["pod-b"],
        nics=[NicHandoff(device="pci-x", hostIfName="nic0", config=BARE)]))
    _tenant_call(env, tmp_path, "ADD", "sb-b", env.pod, "pod-b")
    with Namespace(env.host) as host, Namespace(env.fabric) as fabric:
        host.add_veth("nic0", "02:11:22:33:44:55", 1500, "fabx", fabric)  # nic0's name, taken
    with pytest.raises(Exception, match="File exists"):  # its own DEL cannot finish
        _tenant_call(env, tmp_path, "DEL", "sb-b", env.pod, "pod-b")
    other = env.new_pod("other")
    try:
        _tenant_call(env, tmp_path, "ADD", "sb-c", other, "pod-c")  # any other pod: unaffected
        _tenant_call(env, tmp_path, "DEL", "sb-c", other, "pod-c")
    finally:
        env.remove_pod(other)
    assert repair_journal(env.journal, env.host) == []  # the driver still starts
    [entry] = env.journal.entries()  # kept for a later retry, not forgotten
    assert (entry.hostIfName, entry.sandbox, entry.step) == ("nic0", "sb-b", Step.DETACHING)
