"""``toposerve driver net`` as the node's resident hand-off process, on a
kwok node whose NICs are stand-ins: at start-up it repairs what a crashed
mover left in the journal (a half-moved NIC goes back to the host, one
attached to a live pod stays), then serves the CNI plugin's ADD and DEL on
its socket; after SIGTERM the socket is gone and the plugin's DEL fails
until the driver is back. The plugin (the Go forwarder) always runs in the
stand-ins' namespace (the node's "host"), as containerd would run it."""

from __future__ import annotations

import json
import subprocess
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.dra_net import (
    DRIVER,
    NetDriverProc,
    NetEnv,
    create_claim,
    net_config,
    published,
    setup_env,
    teardown_env,
)
from harness.net_standins import StandIns, stand_ins
from harness.waiting import wait_for
from tests.conftest import Cluster
from toposerve.dra_driver.kubeletplugin import parse_opaque
from toposerve.dra_driver.net.config import NetConfig
from toposerve.dra_driver.net.handoff.journal import Entry, Journal, Step
from toposerve.dra_driver.net.handoff.links import Namespace
from toposerve.dra_driver.net.records import read_record
from toposerve.localcluster.realnode import forwarder
from toposerve.topology.profiles import load_profile

pytestmark = pytest.mark.cluster
HW = load_profile("hgx-h100").hardware()
NETNS_DIR = Path("/var/run/netns")
POD_CONFIG = parse_opaque(net_config(interfaceName="net1"), NetConfig)


@pytest.fixture(scope="module")
def net_env(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[NetEnv]:
    env = setup_env(cluster.name, cluster.api, tmp_path_factory.mktemp("net-env"))
    try:
        yield env
    finally:
        teardown_env(cluster.api)


@pytest.fixture
def nics(tmp_path: Path) -> Iterator[StandIns]:
    with stand_ins(tmp_path / "nics", HW) as s:
        yield s


@pytest.fixture
def pods() -> Iterator[list[str]]:
    """Three pod sandboxes' network namespaces (paths)."""
    from pyroute2 import netns  # type: ignore[import-untyped]

    names = [f"ts-pod-{uuid.uuid4().hex[:8]}" for _ in range(3)]
    for n in names:
        netns.create(n)
    try:
        yield [str(NETNS_DIR / n) for n in names]
    finally:
        for n in names:
            netns.remove(n)


def _crashed_move(journal: Journal, host: Namespace, pod: str, ifname: str,
                  step: Step, config: NetConfig = POD_CONFIG) -> None:
    """A mover that moved ``ifname`` into ``pod`` and died with ``step`` journalled."""
    link = host.find(ifname)
    assert link is not None
    journal.write(Entry(hostIfName=ifname, podIfName="net1", mac=link.mac, hostMtu=link.mtu,
                        sandbox=f"sb-{Path(pod).name}", netns=pod, config=config, step=step))
    with Namespace(pod) as target:
        host.move(link, target, "net1")


def _in(path: str, name: str) -> bool:
    with Namespace(path) as ns:
        return ns.find(name) is not None


def _plugin(d: NetDriverProc, command: str, sandbox: str, netns: str,
            pod_uid: str = "", rc: int = 0) -> dict[str, Any] | None:
    """The Go forwarder as containerd execs it, in the node's (stand-ins')
    namespace; stdout's JSON (the result, or the CNI error when ``rc`` is 1)."""
    conf = {"cniVersion": "1.0.0", "name": "pod-net", "type": "toposerve-nic",
            "stateDir": str(d.state_dir), "journalDir": str(d.journal_dir),
            "serverSocket": str(d.handoff_socket)}
    env = {"PATH": "/usr/bin:/bin", "CNI_COMMAND": command, "CNI_CONTAINERID": sandbox,
           "CNI_NETNS": netns, "CNI_IFNAME": "eth0", "CNI_PATH": "/nonexistent",
           "CNI_ARGS": f"K8S_POD_UID={pod_uid}"}
    out = subprocess.run(["ip", "netns", "exec", d.nics.netns, str(forwarder.build())],
                         input=json.dumps(conf), env=env, capture_output=True, text=True,
                         check=False)
    assert out.returncode == rc, out.stdout + out.stderr
    return json.loads(out.stdout) if out.stdout else None


def _served(d: NetDriverProc, command: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{d.port}/metrics", timeout=10) as r:
        text = r.read().decode()
    key = f'toposerve_net_handoff_call_seconds_count{{command="{command}",result="ok"}} '
    return sum(float(line[len(key):]) for line in text.splitlines() if line.startswith(key))


def test_start_repairs_the_journal_then_serves_the_plugin(
        net_env: NetEnv, nics: StandIns, pods: list[str], tmp_path: Path) -> None:
    d = NetDriverProc(net_env, tmp_path / "driver", nics)
    host = str(NETNS_DIR / nics.netns)
    half, attached, target = nics.interfaces[:3]
    crashed, live, new = pods
    journal = Journal(d.journal_dir)
    with Namespace(host) as h:
        _crashed_move(journal, h, crashed, half, Step.ATTACHING)
        _crashed_move(journal, h, live, attached, Step.ATTACHED)
    try:
        d.start()
        # repaired before serving: the half-moved NIC is home, the live pod's stays
        assert _in(host, half) and not _in(crashed, "net1")
        assert journal.read(half) is None
        entry = journal.read(attached)
        assert entry is not None and entry.step == Step.ATTACHED and _in(live, "net1")
        assert d.handoff_socket.is_socket()

        wait_for(f"{target} published", lambda: any(
            x["attributes"]["ifName"] == {"string": target} for x in published(net_env.api)),
                 timeout=30)
        claim, pod_uid = create_claim(
            net_env.api, "handoff", configs=[net_config(interfaceName="net2")],
            selector=f'device.attributes["{DRIVER}"].ifName == "{target}"')
        assert d.kubelet.prepare([claim])[claim.uid].error == ""
        assert read_record(d.state_dir, claim.uid) is not None

        added = _plugin(d, "ADD", "sb-new", new, pod_uid)
        assert added is not None and [i["name"] for i in added["interfaces"]] == ["net2"]
        assert _in(new, "net2") and not _in(host, target)
        assert _plugin(d, "DEL", entry.sandbox, live) is None
        assert _in(host, attached) and not _in(live, "net1")
        assert (_served(d, "ADD"), _served(d, "DEL")) == (1, 1)  # the resident process did both

        assert d.stop() == 0
        assert not d.handoff_socket.exists()
        # no server: the DEL fails ("try again later") and the NIC stays in the pod
        error = _plugin(d, "DEL", "sb-new", new, rc=1)
        assert error is not None and error["code"] == 11 and str(d.handoff_socket) in error["msg"]
        assert _in(new, "net2") and not _in(host, target)
        d.start()  # the driver is back: its repair keeps the live pod's NIC, the retry does it
        assert _in(new, "net2")
        assert _plugin(d, "DEL", "sb-new", new) is None
        assert _in(host, target) and not _in(new, "net2")
        assert journal.entries() == []
    finally:
        d.kill()


def test_a_link_added_is_published_on_its_netlink_event(
        net_env: NetEnv, nics: StandIns, tmp_path: Path) -> None:
    """The timer at five minutes: only the link event can publish the new veth
    (virtual interfaces kept for the test) and unpublish it, each in seconds."""
    d = NetDriverProc(net_env, tmp_path / "driver", nics, rescan_interval_s=300,
                      extra_args=("--keep-virtual",))

    def names() -> set[str]:
        return {x["attributes"]["ifName"]["string"] for x in published(net_env.api)}

    try:
        d.start()
        wait_for("the stand-ins published", lambda: set(nics.interfaces) <= names(), timeout=30)
        subprocess.run(["ip", "-n", nics.netns, "link", "add", "tsw0", "type", "veth", "peer",
                        "name", "tsw1"], check=True)
        wait_for("the new veth published", lambda: {"tsw0", "tsw1"} <= names(), timeout=5)
        subprocess.run(["ip", "-n", nics.netns, "link", "del", "tsw0"], check=True)
        wait_for("the veth unpublished", lambda: not {"tsw0", "tsw1"} & names(), timeout=5)
    finally:
        d.kill()
