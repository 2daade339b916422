"""The NIC hand-off as a CNI plugin (spec 1.0.0), chained after the pod
network: ADD moves the NICs of the claims reserved for the pod
(``K8S_POD_UID`` in ``CNI_ARGS``, the driver's hand-off records) into the
sandbox's network namespace and passes the previous result on with those
interfaces added; DEL brings back whatever the journal says is in the
sandbox (it needs no record, and no namespace); CHECK verifies them.

Network config of the plugin (one entry of a conflist's ``plugins``)::

    {"type": "toposerve-nic",
     "stateDir": "/var/lib/kubelet/plugins/net.toposerve.io/handoff",
     "journalDir": "/var/lib/kubelet/plugins/net.toposerve.io/journal",
     "serverSocket": "/var/lib/kubelet/plugins/net.toposerve.io/handoff.sock"}

The resident hand-off server (``server``) runs these calls; containerd
execs the Go forwarder (``cni-forwarder/``, ``forwarder``), which sends it
each call over ``serverSocket``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from toposerve.dra_driver.net.handoff.journal import Journal, Step
from toposerve.dra_driver.net.handoff.links import Namespace
from toposerve.dra_driver.net.handoff.mover import Attached, Mover
from toposerve.dra_driver.net.records import records_for_pod

CNI_VERSION = "1.0.0"
SUPPORTED = ["0.4.0", "1.0.0"]
PLUGIN_TYPE = "toposerve-nic"
# the defaults of toposerve.dra_driver.net.records and .journal, and of the Go
# forwarder (tests hold them equal)
STATE_DIR = Path("/var/lib/kubelet/plugins/net.toposerve.io/handoff")
JOURNAL_DIR = Path("/var/lib/kubelet/plugins/net.toposerve.io/journal")
# the resident server's socket (``server``)
SERVER_SOCKET = Path("/var/lib/kubelet/plugins/net.toposerve.io/handoff.sock")


class PluginError(Exception):
    """A CNI error result: ``code`` (spec's well-known codes) and message."""

    def __init__(self, code: int, msg: str) -> None:
        super().__init__(msg)
        self.code = code


def cni_args(raw: str) -> dict[str, str]:
    """``CNI_ARGS``: ``K=V`` pairs separated by ``;``."""
    pairs = (p.split("=", 1) for p in raw.split(";") if "=" in p)
    return {k.strip(): v.strip() for k, v in pairs}


def with_nics(prev: Mapping[str, Any] | None, version: str, netns: str,
              nics: list[Attached]) -> dict[str, Any]:
    """The previous plugin's result with our interfaces and addresses added
    (the pod's own interface, ``eth0``, stays first: the runtime takes the
    pod IP from it)."""
    out: dict[str, Any] = dict(prev or {})
    out["cniVersion"] = version
    interfaces = list(out.get("interfaces") or [])
    ips = list(out.get("ips") or [])
    for nic in nics:
        interfaces.append({"name": nic.pod_name, "mac": nic.mac, "sandbox": netns})
        ips += [{"address": str(a), "interface": len(interfaces) - 1}
                for a in nic.config.addresses]
    out["interfaces"], out["ips"] = interfaces, ips
    out.setdefault("routes", [])
    out.setdefault("dns", {})
    return out


def run(env: Mapping[str, str], conf: Mapping[str, Any], host_netns: str | None = None
        ) -> dict[str, Any] | None:
    """One CNI call; ``host_netns`` is where the NICs live (ours when None)."""
    command = env.get("CNI_COMMAND", "")
    version = str(conf.get("cniVersion", CNI_VERSION))
    if command == "VERSION":
        return {"cniVersion": CNI_VERSION, "supportedVersions": SUPPORTED}
    cid, netns = env.get("CNI_CONTAINERID", ""), env.get("CNI_NETNS", "")
    if not cid:
        raise PluginError(4, "CNI_CONTAINERID is not set")
    state_dir = Path(conf.get("stateDir") or STATE_DIR)
    journal_dir = Path(conf.get("journalDir") or JOURNAL_DIR)
    prev = conf.get("prevResult")
    pod_uid = cni_args(env.get("CNI_ARGS", "")).get("K8S_POD_UID", "")
    if command == "ADD" and not netns:
        raise PluginError(4, "CNI_NETNS is not set")
    if command in ("ADD", "DEL") and not any(journal_dir.glob("*.json")) and \
            not (command == "ADD" and _mentions(state_dir, pod_uid)):
        # nothing of ours in any pod and nothing to move: the common case
        return with_nics(prev, version, netns, []) if command == "ADD" else None
    journal = Journal(journal_dir)
    mover = Mover(journal, host_netns)
    try:
        with journal.lock():
            if command == "ADD":
                mover.repair(keep=lambda e: e.sandbox == cid)  # what dead movers left
                records = records_for_pod(state_dir, pod_uid) if pod_uid else []
                done = [mover.attach(cid, netns, nic.hostIfName, nic.config)
                        for rec in records for nic in rec.nics]
                return with_nics(prev, version, netns, done)
            if command == "DEL":
                mover.repair(keep=lambda e: e.sandbox == cid)
                mover.detach_sandbox(cid)
                return None
            if command == "CHECK":
                _check(journal, cid)
                return None
    finally:
        mover.close()
    raise PluginError(4, f"unknown CNI_COMMAND {command!r}")


def _mentions(state_dir: Path, pod_uid: str) -> bool:
    """Whether any record may be for this pod: its UID appears in the file
    (a pre-filter; ``records_for_pod`` then reads them properly)."""
    if not pod_uid:
        return False
    return any(pod_uid in p.read_text(errors="replace") for p in state_dir.glob("*.json"))


def _check(journal: Journal, cid: str) -> None:
    for entry in journal.entries():
        if entry.sandbox != cid:
            continue
        if entry.step != Step.ATTACHED:
            raise PluginError(11, f"{entry.hostIfName} is {entry.step}, not attached")
        with Namespace(entry.netns) as pod:
            link = pod.find(entry.podIfName, entry.mac)
            if link is None or not link.up or not set(entry.config.addresses) <= link.addresses:
                raise PluginError(11, f"{entry.podIfName} in {entry.netns} is missing, down "
                                      "or has lost its addresses")
