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

When a resident process serves the socket (``server``), the call is
forwarded there; otherwise this process does it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

# Only what a pod without NICs needs is imported up front: containerd runs
# this for every sandbox, and pydantic plus netlink cost it ~0.3 s to load.
if TYPE_CHECKING:
    from dra_driver.net.handoff.journal import Journal
    from dra_driver.net.handoff.mover import Attached

CNI_VERSION = "1.0.0"
SUPPORTED = ["0.4.0", "1.0.0"]
PLUGIN_TYPE = "toposerve-nic"
# the defaults of dra_driver.net.records and .journal (a test holds them equal)
STATE_DIR = Path("/var/lib/kubelet/plugins/net.toposerve.io/handoff")
JOURNAL_DIR = Path("/var/lib/kubelet/plugins/net.toposerve.io/journal")
# a resident process's socket (``server``): when it answers, it does the work
SERVER_SOCKET = Path("/var/lib/kubelet/plugins/net.toposerve.io/handoff.sock")
FORWARD_TIMEOUT_S = 40  # under containerd's own CNI timeout; then we do it ourselves


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


def run(env: Mapping[str, str], conf: Mapping[str, Any], host_netns: str | None = None,
        setup_logs: Callable[[], None] = lambda: None) -> dict[str, Any] | None:
    """One CNI call; ``host_netns`` is where the NICs live (ours when None);
    ``setup_logs`` runs only when there is a NIC to deal with."""
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
    setup_logs()
    from dra_driver.net.handoff.journal import Journal
    from dra_driver.net.handoff.mover import Mover
    from dra_driver.net.records import records_for_pod

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
    from dra_driver.net.handoff.journal import Step
    from dra_driver.net.handoff.links import Namespace

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


def _log_to_stderr() -> None:
    """stdout carries the CNI result: log lines (JSON) go to stderr, which
    containerd writes to its own log."""
    import structlog

    structlog.configure(
        processors=[structlog.processors.add_log_level,
                    structlog.processors.TimeStamper(fmt="iso", utc=True),
                    structlog.processors.EventRenamer("msg"),
                    structlog.processors.JSONRenderer()],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr))


def forwarded(path: Path, env: Mapping[str, str], conf: Mapping[str, Any]
              ) -> tuple[bool, dict[str, Any] | None]:
    """(True, result) when the server at ``path`` did the call; (False, None)
    when there is no server or it failed to answer (then the caller does
    it: every step is idempotent and the journal lock is released by a
    server that died mid-call). A CNI error the server answers is raised."""
    import socket

    if not path.exists():
        return False, None
    request = json.dumps({"env": {k: v for k, v in env.items() if k.startswith("CNI_")},
                          "conf": conf}).encode() + b"\n"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(FORWARD_TIMEOUT_S)
            s.connect(str(path))
            s.sendall(request)
            answer = s.makefile("rb").readline()
        doc = json.loads(answer)
    except (OSError, ValueError):
        return False, None
    if "error" in doc:
        raise PluginError(int(doc["error"]["code"]), str(doc["error"]["msg"]))
    return True, doc.get("result")


def main(stdin: TextIO = sys.stdin, stdout: TextIO = sys.stdout) -> int:
    try:
        command = os.environ.get("CNI_COMMAND")
        conf = json.loads((stdin.read() if command != "VERSION" else "{}") or "{}")
        served, out = (False, None) if command == "VERSION" else \
            forwarded(Path(conf.get("serverSocket") or SERVER_SOCKET), os.environ, conf)
        if not served:
            out = run(os.environ, conf, setup_logs=_log_to_stderr)
    except PluginError as err:
        json.dump({"cniVersion": CNI_VERSION, "code": err.code, "msg": str(err)}, stdout)
        return 1
    except Exception as err:  # the runtime shows our message to the kubelet
        json.dump({"cniVersion": CNI_VERSION, "code": 999,
                   "msg": f"{PLUGIN_TYPE}: {type(err).__name__}: {err}"}, stdout)
        return 1
    if out is not None:
        json.dump(out, stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
