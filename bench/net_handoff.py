"""What the NIC hand-off adds to a pod sandbox's start: each "pod" is a
network namespace made as containerd makes one, then the real node's CNI
chain run as containerd runs it (each plugin exec'd, config on stdin,
``CNI_*`` in the environment): our pod network (``toposerve-veth``), then
the hand-off (``toposerve-nic``, the Go forwarder, its calls done by a
resident ``handoff.server``). Timed from the namespace's creation to the
chain's return, when the NIC is in the namespace renamed, addressed, at its
MTU and up; alternately a pod with a one-NIC claim (a hand-off record names
its UID) and one without. Beside it: the hand-off's exec alone, the same
move in the resident process without the exec and the socket (what an NRI
plugin would pay), the DEL, and the forwarder's bare exec (VERSION).

The NIC is a veth stand-in in a "host" namespace of the benchmark's own
(the plugins run there through ``ip netns exec``, in both columns alike);
addresses from 198.18.0.0/15; nothing leaves the machine. Needs root."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.flags import count
from bench.report import latency_table
from harness.handoff_netns import NetEnv, net_env
from toposerve.dra_driver.kubeletplugin import parse_opaque
from toposerve.dra_driver.net.config import NetConfig
from toposerve.dra_driver.net.handoff.cni import PLUGIN_TYPE as NIC_PLUGIN
from toposerve.dra_driver.net.handoff.server import HandoffServer
from toposerve.dra_driver.net.records import ClaimRecord, NicHandoff, write_record
from toposerve.localcluster.realnode import cni as pod_cni
from toposerve.localcluster.realnode import forwarder
from toposerve.localcluster.results import write
from toposerve.localcluster.scale.measure import latency_ms

REPO = Path(__file__).resolve().parent.parent
CONFIG = parse_opaque({"apiVersion": "net.toposerve.io/v1", "kind": "NetConfig",
                       "interfaceName": "net1", "addresses": ["198.18.0.2/24"], "mtu": 1400},
                      NetConfig)


@dataclass
class Samples:
    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, what: str, seconds: float) -> None:
        self.values.setdefault(what, []).append(seconds)


def _run(argv: list[str], env: Mapping[str, str], stdin: str) -> tuple[float, dict[str, Any]]:
    t0 = time.perf_counter()
    p = subprocess.run(argv, input=stdin, env=dict(env), capture_output=True, text=True,
                       check=False)
    took = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"{argv[-1]} {env.get('CNI_COMMAND')}: {p.stdout} {p.stderr[-500:]}")
    return took, json.loads(p.stdout) if p.stdout.strip() else {}


class Chain:
    """The node's two plugins, exec'd in the benchmark's host namespace."""

    def __init__(self, net: NetEnv, work: Path) -> None:
        self.net, self.work = net, work
        self.socket = work / "handoff.sock"
        bindir = work / "bin"
        bindir.mkdir()
        pod_net = bindir / pod_cni.PLUGIN_TYPE
        pod_net.write_text(pod_cni.launcher(sys.executable, "toposerve.localcluster.realnode.cni"))
        pod_net.chmod(0o755)
        (bindir / NIC_PLUGIN).symlink_to(forwarder.build())
        self.bin = bindir
        self.pod_conf = {"cniVersion": "1.0.0", "name": "bench", "type": pod_cni.PLUGIN_TYPE,
                         "subnet": "127.77.0.0/16", "dataDir": str(work / "ipam")}
        # our own socket, so a server of the machine's is never used
        self.nic_conf = {"cniVersion": "1.0.0", "name": "bench", "type": NIC_PLUGIN,
                         "stateDir": str(work / "records"), "journalDir": str(work / "journal"),
                         "serverSocket": str(self.socket)}

    def argv(self, plugin: str) -> list[str]:
        return ["ip", "netns", "exec", Path(self.net.host).name, str(self.bin / plugin)]

    def env(self, command: str, sandbox: str, netns: str, pod_uid: str) -> dict[str, str]:
        return {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(REPO),
                "CNI_COMMAND": command, "CNI_CONTAINERID": sandbox, "CNI_NETNS": netns,
                "CNI_IFNAME": "eth0", "CNI_PATH": str(self.bin),
                "CNI_ARGS": f"IgnoreUnknown=1;K8S_POD_NAMESPACE=bench;K8S_POD_UID={pod_uid}"}

    def add(self, sandbox: str, netns: str, pod_uid: str) -> tuple[float, dict[str, Any]]:
        """Both ADDs; the hand-off's own exec time and its result."""
        env = self.env("ADD", sandbox, netns, pod_uid)
        _, prev = _run(self.argv(pod_cni.PLUGIN_TYPE), env, json.dumps(self.pod_conf))
        return _run(self.argv(NIC_PLUGIN), env,
                    json.dumps({**self.nic_conf, "prevResult": prev}))

    def delete(self, sandbox: str, netns: str, pod_uid: str) -> float:
        """Both DELs, in reverse order; the hand-off's own exec time."""
        env = self.env("DEL", sandbox, netns, pod_uid)
        took, _ = _run(self.argv(NIC_PLUGIN), env, json.dumps(self.nic_conf))
        _run(self.argv(pod_cni.PLUGIN_TYPE), env, json.dumps(self.pod_conf))
        return took


def _pod(chain: Chain, s: Samples, i: int, with_nic: bool) -> None:
    kind = "NIC claim" if with_nic else "no NIC claim"
    uid = str(uuid.uuid4())
    claim_uid = f"00000000-0000-4000-8000-{i:012d}"  # a record is named by a real claim's UID
    if with_nic:
        write_record(chain.work / "records", ClaimRecord(
            claimUid=claim_uid, claim=f"bench/c{i}", podUids=[uid],
            nics=[NicHandoff(device="nic-0", hostIfName="nic0", pciAddress=None,
                             config=CONFIG)]))
    t0 = time.perf_counter()
    netns = chain.net.new_pod(f"p{i}")
    nic_s, result = chain.add(f"sb{i}", netns, uid)
    s.add(f"sandbox created -> network ready, {kind}", time.perf_counter() - t0)
    s.add(f"toposerve-nic ADD exec, {kind}", nic_s)
    names = [x["name"] for x in result.get("interfaces", [])]
    if with_nic != ("net1" in names):
        raise RuntimeError(f"pod {i}: interfaces {names}")
    s.add(f"toposerve-nic DEL exec, {kind}", chain.delete(f"sb{i}", netns, uid))
    chain.net.remove_pod(netns)
    (chain.work / "records" / f"{claim_uid}.json").unlink(missing_ok=True)


def _resident(net: NetEnv, s: Samples, pods: int) -> None:
    """The same moves in one long-lived process without the exec and the
    socket."""
    mover = net.mover()
    try:
        for i in range(pods):
            netns = net.new_pod(f"r{i}")
            with net.journal.lock():
                t0 = time.perf_counter()
                mover.attach(f"rsb{i}", netns, "nic0", CONFIG)
                s.add("resident mover attach (no exec), NIC claim", time.perf_counter() - t0)
                t0 = time.perf_counter()
                mover.detach_sandbox(f"rsb{i}")
                s.add("resident mover detach (no exec), NIC claim", time.perf_counter() - t0)
            net.remove_pod(netns)
    finally:
        mover.close()


def _exec_floor(chain: Chain, s: Samples, n: int) -> None:
    for _ in range(n):
        t0 = time.perf_counter()
        _run(chain.argv(NIC_PLUGIN), {"CNI_COMMAND": "VERSION"}, "")
        s.add("ip netns exec + toposerve-nic VERSION (no socket)", time.perf_counter() - t0)


def table(s: Samples) -> tuple[str, list[dict[str, Any]]]:
    ms = {what: latency_ms(v) for what, v in s.values.items()}
    return latency_table(ms), [{"what": what, **v} for what, v in ms.items()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.net_handoff",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=count, default=100, help="pods of each kind")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.net_handoff needs root (network namespaces)", file=sys.stderr)
        return 2
    s = Samples()
    with tempfile.TemporaryDirectory(prefix="net-handoff-") as tmp, \
            net_env(Path(tmp), nics=1) as net:
        chain = Chain(net, Path(tmp))
        server = HandoffServer(chain.socket, host_netns=net.host).start()
        try:
            if args.pods >= 10:  # warm the page cache first; a smoke run skips it
                _pod(chain, Samples(), -1, True)
            for i in range(args.pods * 2):
                _pod(chain, s, i, with_nic=i % 2 == 0)
        finally:
            server.stop()
        _resident(net, s, args.pods)
        _exec_floor(chain, s, min(args.pods, 30))
    md, rows = table(s)
    load = os.getloadavg()[0]
    md += f"\n\n{args.pods} pods of each kind, load average {load:.1f} at the end"
    write(args.out, "net_handoff", md, {"pods": args.pods, "load1": load, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
