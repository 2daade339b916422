"""Start and stop the real node of a local cluster: containerd, our images,
and a kubelet that registers as node ``127.0.0.1`` (its only address is
loopback). One per machine; the owner record says which cluster has it."""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from toposerve.dra_driver.net.handoff import cni as nic_cni
from toposerve.dra_driver.net.handoff.install import install as install_nic_cni
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster.clusters import ClusterError, api_client, cluster_dir, kubeconfig_path
from toposerve.localcluster.realnode import cni, config, images, teardown
from toposerve.localcluster.realnode.forwarder import build as build_forwarder
from toposerve.localcluster.realnode.paths import (
    BUSYBOX_IMAGE,
    KUBELET_HEALTHZ_PORT,
    KUBELET_PORT,
    NODE_NAME,
    PAUSE_IMAGE,
    POD_SUBNET,
    REAL_NODE_LABEL,
    Layout,
    default_layout,
)
from toposerve.localcluster.realnode.tools import NodeTools, find_node_tools

Progress = Callable[[str], None]


class RealNodeError(RuntimeError):
    """Starting or stopping the real node failed; one line for a person."""


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Owner:
    cluster: str
    node: str
    kubelet_pid: int
    containerd_pid: int


def read_owner(layout: Layout) -> Owner | None:
    try:
        return Owner(**json.loads(layout.owner_file.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def running_owner(layout: Layout | None = None) -> Owner | None:
    """The owner record, if its kubelet or containerd still runs."""
    layout = layout or default_layout()
    owner = read_owner(layout)
    if owner and (teardown.alive(owner.kubelet_pid) or teardown.alive(owner.containerd_pid)):
        return owner
    return None


@contextlib.contextmanager
def machine_lock(layout: Layout, timeout_s: float = 120) -> Iterator[None]:
    """Only one start or stop of the real node at a time on this machine."""
    layout.lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(layout.lock_file, "a+") as f:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise RealNodeError(f"{layout.lock_file} stays locked: another start or "
                                        "stop of the real node is running") from None
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _check_ports() -> None:
    for port in (KUBELET_PORT, KUBELET_HEALTHZ_PORT):
        if not _port_free(port):
            raise RealNodeError(f"127.0.0.1:{port} is taken: another kubelet runs here")


def _last_lines(path: Path, n: int = 3) -> str:
    try:
        lines = [x.strip() for x in path.read_text(errors="replace").splitlines() if x.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(lines[-n:])[-600:] or "(empty log)"


def _run(cmd: list[str], what: str, timeout: float = 60) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise RealNodeError(f"{what} failed: {(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc.stdout


def _spawn(cmd: list[str], log: Path, append: bool = False) -> subprocess.Popen[bytes]:
    """Start a daemon in its own session, logging to ``log``; it outlives us."""
    with open(log, "ab" if append else "wb") as out:
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def _wait(what: str, check: Callable[[], bool], timeout_s: float,
          proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if proc.poll() is not None:
            raise RealNodeError(f"{what}: the process exited with {proc.returncode}: "
                                f"{_last_lines(log)}")
        if time.monotonic() > deadline:
            raise RealNodeError(f"{what}: not after {timeout_s:.0f}s: {_last_lines(log)}")
        time.sleep(0.1)


def _node_credentials(layout: Layout, pki: Path) -> tuple[Path, Path]:
    """A client certificate for ``system:node:127.0.0.1`` signed by the
    cluster's CA: the kubelet is then a node to the Node authorizer and
    NodeRestriction, as on a real cluster."""
    key, csr, crt = (layout.config / f"kubelet.{x}" for x in ("key", "csr", "crt"))
    subj = f"/O=system:nodes/CN=system:node:{NODE_NAME}"
    _run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
          "-out", str(key)], "openssl genpkey")
    _run(["openssl", "req", "-new", "-key", str(key), "-subj", subj, "-out", str(csr)],
         "openssl req")
    _run(["openssl", "x509", "-req", "-in", str(csr), "-CA", str(pki / "ca.crt"),
          "-CAkey", str(pki / "ca.key"), "-set_serial", str(time.time_ns()), "-days", "30",
          "-out", str(crt)], "openssl x509")
    return crt, key


def _write_configs(layout: Layout, tools: NodeTools, cluster_kubeconfig: Path,
                   pki: Path) -> Path:
    """containerd.toml, the CNI config and plugin, kubelet.yaml and its
    kubeconfig (where ``_kubelet_command`` expects them); returns containerd's."""
    for d in (layout.config, layout.logs, layout.cni_bin, layout.cni_conf, layout.run,
              layout.containerd_root):
        d.mkdir(parents=True, exist_ok=True)
    ctd = layout.config / "containerd.toml"
    ctd.write_text(config.to_toml(config.containerd_config(layout, tools.runc)))
    plugin = layout.cni_bin / cni.PLUGIN_TYPE
    plugin.write_text(cni.launcher(sys.executable, "toposerve.localcluster.realnode.cni"))
    plugin.chmod(0o755)
    # the NIC hand-off as a real node has it: the static Go forwarder
    install_nic_cni(layout.cni_bin, build_forwarder())
    netconf = cni.NetConf(subnet=ipaddress.IPv4Network(POD_SUBNET),
                          data_dir=layout.cni_ipam)
    # The NIC hand-off is always chained: a DEL must find it even if the NIC
    # driver stopped since the ADD (a pod without NICs costs it one exec).
    (layout.cni_conf / "10-toposerve.conflist").write_text(json.dumps(
        cni.conflist(netconf, chained=({"type": nic_cni.PLUGIN_TYPE},))))
    resolv = layout.config / "resolv.conf"
    resolv.write_text(config.RESOLV_CONF)
    crt, key = _node_credentials(layout, pki)
    server = yaml.safe_load(cluster_kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
    kubeconfig = layout.config / "kubelet.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config.kubeconfig(
        server, pki / "ca.crt", crt, key, user=f"system:node:{NODE_NAME}")))
    kubelet_yaml = layout.config / "kubelet.yaml"
    kubelet_yaml.write_text(yaml.safe_dump(config.kubelet_config(layout, pki / "ca.crt", resolv)))
    return ctd


def _kubelet_command(layout: Layout, tools: NodeTools) -> list[str]:
    c = layout.config
    return [str(tools.kubelet), f"--config={c / 'kubelet.yaml'}",
            f"--kubeconfig={c / 'kubelet.kubeconfig'}", f"--hostname-override={NODE_NAME}",
            f"--node-labels={REAL_NODE_LABEL}=real", "--v=2"]


def _write_owner(layout: Layout, owner: Owner) -> None:
    layout.owner_file.write_text(json.dumps(vars(owner)))


def _kubelet_healthy() -> bool:
    try:
        with urllib.request.urlopen(  # loopback only: the kubelet's healthz address
                f"http://127.0.0.1:{KUBELET_HEALTHZ_PORT}/healthz", timeout=2) as r:
            return bool(r.read() == b"ok")
    except OSError:
        return False


def _restart(layout: Layout, what: str, pid_field: str, argv: list[str], ready: str,
             check: Callable[[], bool], timeout_s: float, progress: Progress) -> None:
    """SIGTERM one daemon of the node and start it again (containers left
    running); returns once ``check`` holds."""
    with machine_lock(layout):
        owner = running_owner(layout)
        if owner is None or not teardown.alive(getattr(owner, pid_field)):
            raise RealNodeError(f"no running real node to restart {what} of")
        teardown.signal_and_wait([getattr(owner, pid_field)], grace_s=10)
        log = layout.logs / f"{what}.log"
        with open(log, "ab") as out:
            out.write(f"---- {what} restarted ----\n".encode())
        proc = _spawn(argv, log, append=True)
        _write_owner(layout, Owner(**{**vars(owner), pid_field: proc.pid}))
        _wait(f"{what} {ready} after restart", check, timeout_s, proc, log)
    progress(f"{what} of {NODE_NAME} restarted")


def restart_kubelet(progress: Progress = _stderr, timeout_s: float = 60,
                    layout: Layout | None = None) -> None:
    """Stop the kubelet (SIGTERM) and start it again, containers left running,
    as an upgrade or a crash-restart would; returns once it is healthy."""
    layout = layout or default_layout()
    _restart(layout, "kubelet", "kubelet_pid", _kubelet_command(layout, find_node_tools()),
             "healthy", _kubelet_healthy, timeout_s, progress)


def _containerd_answers(layout: Layout, tools: NodeTools) -> bool:
    return subprocess.run(
        [str(tools.ctr), "--address", str(layout.containerd_socket), "version"],
        capture_output=True, check=False, timeout=10).returncode == 0


def restart_containerd(progress: Progress = _stderr, timeout_s: float = 30,
                       layout: Layout | None = None) -> None:
    """Stop containerd (SIGTERM) and start it again with the same config,
    the shims and containers left running, as a runtime upgrade would;
    returns once it answers."""
    layout = layout or default_layout()
    tools = find_node_tools()
    _restart(layout, "containerd", "containerd_pid",
             [str(tools.containerd), "--config", str(layout.config / "containerd.toml")],
             "answering", lambda: _containerd_answers(layout, tools), timeout_s, progress)


def _import_images(layout: Layout, tools: NodeTools) -> None:
    specs = [images.pause_image(PAUSE_IMAGE, tools.pause),
             images.busybox_image(BUSYBOX_IMAGE, tools.busybox,
                                  _run([str(tools.busybox), "--list"], "busybox --list").split())]
    for spec in specs:
        archive = layout.config / (spec.name.replace("/", "_").replace(":", "_") + ".tar")
        archive.write_bytes(images.oci_archive(spec))
        _run([str(tools.ctr), "--address", str(layout.containerd_socket), "-n", "k8s.io",
              "images", "import", "--local", str(archive)], f"importing {spec.name}")


def _node_ready(api: Any) -> bool:
    try:
        node = JsonApi(api).request("GET", f"/api/v1/nodes/{NODE_NAME}", timeout=5)
    except ApiError:
        return False
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (node.get("status") or {}).get("conditions") or [])


def _pods_on_node(rest: JsonApi) -> list[tuple[str, str]]:
    """(namespace, name) of every pod bound to the real node."""
    pods = rest.request("GET", "/api/v1/pods", [("fieldSelector", f"spec.nodeName={NODE_NAME}")],
                        timeout=5).get("items") or []
    return [(str(p["metadata"]["namespace"]), str(p["metadata"]["name"])) for p in pods]


def _delete_pod(rest: JsonApi, namespace: str, name: str, grace_s: int) -> None:
    with contextlib.suppress(ApiError):
        rest.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}",
                     [("gracePeriodSeconds", grace_s)], timeout=5)


def start(cluster: str, progress: Progress = _stderr, ready_timeout_s: float = 90,
          wait_s: float = 0, layout: Layout | None = None) -> str:
    """Add the real node to ``cluster``; returns the node name once it is
    Ready. While another cluster has the machine's real node, waits up to
    ``wait_s`` for it to be released (another test run, say). A failed start
    tears down whatever it had started."""
    layout = layout or default_layout()
    tools = find_node_tools()
    api = api_client(cluster)
    deadline = time.monotonic() + wait_s
    while True:
        with machine_lock(layout):
            owner = running_owner(layout)
            if owner is not None and not kubeconfig_path(owner.cluster).exists():
                progress(f"removing the real node left running by deleted cluster "
                         f"{owner.cluster!r}")
                owner = None  # cleaned up by the start below
            if owner is None:
                return _start_locked(cluster, api, tools, layout, progress, ready_timeout_s)
            if owner.cluster == cluster or time.monotonic() > deadline:
                raise RealNodeError(
                    f"the real node already runs for cluster {owner.cluster!r} (one per "
                    f"machine): `toposerve cluster down --name {owner.cluster}`")
        time.sleep(1)


def _start_locked(cluster: str, api: Any, tools: NodeTools, layout: Layout,
                  progress: Progress, ready_timeout_s: float) -> str:
    if not teardown.our_processes(layout):
        _check_ports()  # before touching the kubelet's paths: is another kubelet here?
    try:
        _clean(layout, tools, progress, api=None)  # whatever a crashed run left behind
    except teardown.TeardownError as err:
        raise RealNodeError(f"could not remove a previous real node: {err}") from None
    _check_ports()
    started = time.monotonic()
    try:
        ctd_conf = _write_configs(
            layout, tools, kubeconfig_path(cluster), cluster_dir(cluster) / "pki")
        ctd_log = layout.logs / "containerd.log"
        ctd = _spawn([str(tools.containerd), "--config", str(ctd_conf)], ctd_log)
        _wait("containerd answering", lambda: _containerd_answers(layout, tools), 30, ctd,
              ctd_log)
        _import_images(layout, tools)
        progress(f"containerd up, images imported in {time.monotonic() - started:.1f}s")
        kubelet_log = layout.logs / "kubelet.log"
        kubelet = _spawn(_kubelet_command(layout, tools), kubelet_log)
        _write_owner(layout, Owner(cluster=cluster, node=NODE_NAME, kubelet_pid=kubelet.pid,
                                   containerd_pid=ctd.pid))
        _wait(f"node {NODE_NAME} Ready", lambda: _node_ready(api), ready_timeout_s,
              kubelet, kubelet_log)
    except BaseException:
        progress("the real node failed to start; removing what was started")
        try:
            _clean(layout, tools, progress, api=api)
        except teardown.TeardownError as err:  # said, but the start's own error is the news
            progress(f"real node teardown incomplete: {err}")
        raise
    progress(f"real node {NODE_NAME} Ready in {time.monotonic() - started:.1f}s")
    return NODE_NAME


def _drain(api: Any, grace_s: float, progress: Progress) -> None:
    """Delete the node's pods while the kubelet still runs, so it stops their
    containers and unprepares their claims; bounded, a stuck pod is
    force-deleted after the kubelet is gone."""
    rest = JsonApi(api)
    pods = _pods_on_node(rest)
    for namespace, name in pods:
        _delete_pod(rest, namespace, name, 1)
    deadline = time.monotonic() + grace_s
    while pods and time.monotonic() < deadline:
        time.sleep(0.2)
        pods = _pods_on_node(rest)
    if pods:
        progress(f"{len(pods)} pods still on {NODE_NAME} after {grace_s:.0f}s")


def _forget_node(api: Any) -> None:
    """Force-delete pods left on the node, then the Node object."""
    rest = JsonApi(api)
    for namespace, name in _pods_on_node(rest):
        _delete_pod(rest, namespace, name, 0)
    with contextlib.suppress(ApiError):
        rest.request("DELETE", f"/api/v1/nodes/{NODE_NAME}", timeout=5)


def _clean(layout: Layout, tools: NodeTools, progress: Progress, api: Any | None) -> None:
    owner = read_owner(layout)
    if api is not None:
        try:
            if owner and teardown.alive(owner.kubelet_pid):
                _drain(api, 20, progress)
        except Exception as err:  # the API may be gone already; the host cleanup must go on
            progress(f"could not drain {NODE_NAME}: {type(err).__name__}")
    kubelets = [p for p, name in teardown.our_processes(layout).items() if name == "kubelet"]
    teardown.signal_and_wait(kubelets, grace_s=10)
    if api is not None:
        with contextlib.suppress(Exception):
            _forget_node(api)
    teardown.clean_host(layout, tools.runc, progress)


def _ours_present(layout: Layout) -> bool:
    """An owner record, a process or a directory of ours (the kubelet's fixed
    paths alone are not a sign of ours)."""
    return (layout.owner_file.exists() or bool(teardown.our_processes(layout))
            or any(p.exists() for p in (layout.run, layout.config, layout.containerd_root)))


def stop(cluster: str | None = None, progress: Progress = _stderr,
         layout: Layout | None = None) -> bool:
    """Tear the real node down (only if it belongs to ``cluster``, when one is
    named); True if there was one. Always leaves the host clean."""
    layout = layout or default_layout()
    if not _ours_present(layout):
        return False  # no lock taken: `cluster down` works without root and a real node
    with machine_lock(layout):  # decided again under the lock: a start may be half-way
        owner = read_owner(layout)
        if cluster is not None and owner is not None and owner.cluster != cluster:
            return False
        if owner is None and not _ours_present(layout):
            return False
        api = None
        if owner is not None:
            with contextlib.suppress(ClusterError):
                api = api_client(owner.cluster)
        try:
            _clean(layout, find_node_tools(), progress, api)
        except teardown.TeardownError as err:
            raise RealNodeError(f"real node teardown incomplete: {err}") from None
    progress(f"real node {NODE_NAME} stopped and cleaned up")
    return True
