"""``toposerve driver``: the DRA drivers as kubelet plugins."""

from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import structlog

from toposerve import logs
from toposerve.dra_driver.net.handoff import DEFAULT_PLUGIN
from toposerve.kubeapi import connect
from toposerve.topology.labels import DialectName

log = structlog.get_logger("toposerve.driver")


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def _api(kubeconfig: str | None) -> Any:
    return connect(kubeconfig)


def _path(value: str) -> Path:
    """A path flag's value, from / : gRPC reads unix://d/p as host d, and
    the kubelet and the CNI plugin are handed these paths from elsewhere."""
    return Path(value).absolute()


def _path_line(err: OSError, flags: dict[str, Path | None]) -> str:
    """The line for ``err``, about a path under one of ``flags``' values or
    in the way of one (the first flag that fits, so the most specific
    first): what to change."""
    why = err.strerror or str(err)
    if not err.filename:
        return why
    path = Path(err.filename)
    flag = next((f for f, given in flags.items() if given is not None and (
        path.is_relative_to(given) or given.is_relative_to(path))), None)
    return f"{path}: {why}" + (f"; change {flag}" if flag else "")


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: give host:port, e.g. 127.0.0.1:9465")
    if int(port) > 65535:
        raise argparse.ArgumentTypeError(f"{value!r}: the port must be 0 to 65535")
    return host, int(port)


class _Driver(Protocol):
    """What ``_serve`` needs of ``GpuDriver`` / ``NetDriver``."""

    @property
    def kind(self) -> Any: ...
    @property
    def publisher(self) -> Any: ...
    @property
    def plugin(self) -> Any: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


def _common(args: argparse.Namespace, interval: tuple[str, float]) -> dict[str, Any] | str:
    """The options every driver shares, or the error to print; ``interval``:
    the driver's flag of seconds between its checks, and its value."""
    flag, seconds = interval
    if not 0 < seconds < math.inf:  # 0 would check without a pause
        return f"{flag} {seconds:g}: give seconds over 0"
    if not args.node_name:
        return "--node-name is required (or set NODE_NAME)"
    if not (args.sysfs_root / "bus/pci/devices").is_dir():
        return f"--sysfs-root {args.sysfs_root}: no bus/pci/devices there"
    if not 0 <= args.binding_failure_after <= 3600:
        return (f"--binding-failure-after {args.binding_failure_after:g}: give 0 to 3600 "
                "seconds, under the scheduler's binding timeout (600 by default)")
    return dict(node_name=args.node_name, plugin_dir=args.plugin_dir,
                registry_dir=args.registry_dir, cdi_root=args.cdi_root,
                sysfs_root=args.sysfs_root, dev_root=args.dev_root,
                pod_uid=args.pod_uid or None, dialect=DialectName(args.dialect),
                binding_conditions=args.binding_conditions,
                binding_failure_after_s=args.binding_failure_after)


def _gpu(args: argparse.Namespace) -> int:
    from toposerve.dra_driver.gpu.driver import GpuDriver, GpuDriverOptions

    common = _common(args, ("--health-interval", args.health_interval))
    if isinstance(common, str):
        return _fail(common)
    opts = GpuDriverOptions(**common, health_interval_s=args.health_interval,
                            nvml=not args.no_nvml, nvml_library=args.nvml_library,
                            nvidia_driver_root=args.nvidia_driver_root,
                            allow_shared_with_nvidia=args.allow_shared_with_nvidia,
                            memory_shares=args.memory_shares)
    return _serve(GpuDriver(_api(args.kubeconfig), opts), args)


def _net(args: argparse.Namespace) -> int:
    from toposerve.dra_driver.net.discovery import NetFilters
    from toposerve.dra_driver.net.driver import NetDriver, NetDriverOptions

    common = _common(args, ("--rescan-interval", args.rescan_interval))
    if isinstance(common, str):
        return _fail(common)
    for flag, pattern in (("--interfaces", args.interfaces),
                          ("--exclude-interfaces", args.exclude_interfaces)):
        try:
            re.compile(pattern or "")
        except re.error as err:
            return _fail(f"{flag} {pattern!r}: not a regular expression: {err}")
    filters = NetFilters(loopback=args.keep_loopback, default_route=args.keep_default_route,
                         virtual=args.keep_virtual, include=args.interfaces,
                         exclude=args.exclude_interfaces)
    opts = NetDriverOptions(**common, state_dir=args.state_dir, netns=args.netns,
                            filters=filters, rescan_interval_s=args.rescan_interval,
                            journal_dir=args.journal_dir,
                            handoff_socket=None if args.no_handoff_server
                            else args.handoff_socket)
    return _serve(NetDriver(_api(args.kubeconfig), opts), args)


def _install_cni(args: argparse.Namespace) -> int:
    from toposerve.dra_driver.net.handoff.install import (
        RECORD,
        InstallError,
        data_dir,
        install,
        plugin_entry,
        uninstall,
    )

    record = data_dir(args.kubelet_dir) / RECORD
    try:
        if args.uninstall:
            changed = uninstall(record)
        else:
            changed = install(args.bin_dir, args.plugin or DEFAULT_PLUGIN, args.conf_dir,
                              args.chain_into, plugin_entry(args.kubelet_dir), record)
    except InstallError as err:
        return _fail(str(err))
    except OSError as err:  # a folder that is a file, one not writable
        return _fail(_path_line(err, {"--bin-dir": args.bin_dir, "--conf-dir": args.conf_dir,
                                      "--kubelet-dir": args.kubelet_dir}))
    log.info("toposerve-nic uninstalled" if args.uninstall else "toposerve-nic installed",
             changed=changed)
    return 0


def _serve(driver: _Driver, args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT, with /healthz and /metrics; or ``--uninstall``."""
    from toposerve.dra_driver.kubeletplugin.checkpoint import CorruptCheckpoint
    from toposerve.dra_driver.kubeletplugin.liveness import (
        HttpEndpoints,
        healthz_route,
        metrics_route,
    )
    from toposerve.dra_driver.kubeletplugin.sockets import PathError
    from toposerve.dra_driver.net.handoff.journal import CorruptJournal

    if args.uninstall:
        n = driver.publisher.uninstall()
        print(f"deleted {n} ResourceSlices of {driver.kind.driver} on {args.node_name}")
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    http = None
    if args.http_address:  # bound first: a taken address fails before the plugin registers
        host, port = args.http_address
        try:
            http = HttpEndpoints(host, port, {
                "/healthz": healthz_route(driver.plugin.cfg.paths.registration_socket,
                                          driver.kind.driver),
                "/metrics": metrics_route})
        except OSError as err:
            return _fail(f"--http-address {host}:{port}: cannot listen: {err.strerror or err}; "
                         "give a free address")
        http.start()  # /healthz fails until the plugin is registered
    try:
        driver.start()
    except (CorruptCheckpoint, CorruptJournal, PathError) as err:
        driver.stop()
        if http is not None:
            http.stop()
        if not isinstance(err, PathError):
            return _fail(str(err))
        paths = driver.plugin.cfg.paths
        return _fail(_path_line(err, {  # the hand-off socket is in the plugin dir by default
            "--handoff-socket": getattr(args, "handoff_socket", None),
            "--plugin-dir": paths.data_dir, "--registry-dir": paths.registry_dir}))
    stop.wait()
    log.info("shutting down", driver=driver.kind.driver)
    if http is not None:
        http.stop()
    driver.stop()
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from toposerve.dra_driver.simulate import run

    if args.cluster:
        from toposerve.localcluster.clusters import ClusterError, api_client

        try:
            api = api_client(args.cluster)
        except ClusterError as err:
            return _fail(str(err))
    else:
        api = _api(args.kubeconfig)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        return run(api, profile=args.profile, dialect=DialectName(args.dialect),
                   workers=args.workers, http_address=args.http_address or None,
                   uninstall=args.uninstall, stop=stop, drivers=args.drivers.split(","))
    except ValueError as err:
        return _fail(str(err))


def _plugin_arguments(p: argparse.ArgumentParser, driver: str, devices: str,
                      port: int) -> None:
    """The options of a kubelet plugin on the framework."""
    p.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                   help="this node's name (default $NODE_NAME)")
    p.add_argument("--kubeconfig", help="default $KUBECONFIG, ~/.kube/config, else in-cluster")
    p.add_argument("--plugin-dir", type=_path,
                   help=f"DRA socket, checkpoint and lock (default /var/lib/kubelet/plugins/"
                        f"{driver})")
    p.add_argument("--registry-dir", type=_path,
                   default=Path("/var/lib/kubelet/plugins_registry"),
                   help="the kubelet's plugin registry (default %(default)s)")
    p.add_argument("--cdi-root", type=_path, default=Path("/var/run/cdi"),
                   help="where CDI specs go; the runtime must read it (default %(default)s)")
    p.add_argument("--sysfs-root", type=_path, default=Path("/sys"),
                   help=f"sysfs to discover {devices} in (default %(default)s)")
    p.add_argument("--dev-root", type=_path, default=Path("/dev"),
                   help=f"where the {devices}' device nodes are on the host "
                        "(default %(default)s)")
    p.add_argument("--pod-uid", default=os.environ.get("POD_UID"),
                   help="rolling-update mode: sockets named with this pod UID (default $POD_UID)")
    p.add_argument("--dialect", default=DialectName.TOPOSERVE.value,
                   choices=[d.value for d in DialectName],
                   help="node labels that carry the domain path (default %(default)s)")
    p.add_argument("--http-address", type=_address, default=_address(f"127.0.0.1:{port}"),
                   help=f"/healthz and /metrics (default 127.0.0.1:{port})")
    p.add_argument("--uninstall", action="store_true",
                   help="delete this driver's ResourceSlices of the node and exit")
    p.add_argument("--binding-conditions", action="store_true",
                   help=f"publish {devices} with binding conditions: the scheduler binds a "
                        "pod only once this driver has marked its allocated devices ready "
                        "(needs list and watch on resourceclaims; DRADeviceBindingConditions)")
    p.add_argument("--binding-failure-after", type=float, default=10.0, metavar="SECONDS",
                   help="a device that failed (gone, a link without carrier, a fabric "
                        "registration that failed) fails its pod's binding once it has stayed "
                        "so this long; one still getting ready waits for the scheduler's "
                        "binding timeout (default %(default)s)")


def register(sub: Any) -> None:
    p = sub.add_parser("driver", help="run a DRA driver (kubelet plugin) on this node")
    dsub = p.add_subparsers(dest="driver_command", required=True, metavar="DRIVER")

    g = dsub.add_parser("gpu", help="the GPU driver gpu.toposerve.io")
    _plugin_arguments(g, "gpu.toposerve.io", "GPUs", 9465)
    g.add_argument("--health-interval", type=float, default=10.0,
                   help="seconds between device health checks (default %(default)s)")
    g.add_argument("--nvidia-driver-root", type=_path, default=None,
                   help="the host's NVIDIA driver root as mounted here (the host's / or the "
                        "GPU Operator's /run/nvidia/driver): libnvidia-ml.so.1 is searched "
                        "in its library dirs; default: the loader's search path")
    g.add_argument("--nvml-library", type=Path, default=None,
                   help="the libnvidia-ml.so.1 to load, over --nvidia-driver-root")
    g.add_argument("--no-nvml", action="store_true",
                   help="discover GPUs from sysfs only, without NVML")
    g.add_argument("--allow-shared-with-nvidia", action="store_true",
                   help="publish GPUs that NVIDIA's device plugin or DRA driver already "
                        "advertise on this node (two allocators may then hand out one GPU)")
    g.add_argument("--memory-shares", action="store_true",
                   help="publish whole GPUs shareable by memory (DRAConsumableCapacity): "
                        "claims asking capacity.requests.memory share a GPU, a claim asking "
                        "none takes all of it; no partitions are published")
    g.set_defaults(handler=_gpu)

    n = dsub.add_parser("net", help="the NIC driver net.toposerve.io")
    _plugin_arguments(n, "net.toposerve.io", "NICs", 9467)
    n.add_argument("--state-dir", type=_path,
                   default=Path("/var/lib/kubelet/plugins/net.toposerve.io/handoff"),
                   help="hand-off records for the CNI plugin (default %(default)s)")
    n.add_argument("--journal-dir", type=_path,
                   default=Path("/var/lib/kubelet/plugins/net.toposerve.io/journal"),
                   help="the mover's journal, repaired at start-up; the CNI plugin's "
                        "journalDir (default %(default)s)")
    n.add_argument("--handoff-socket", type=_path,
                   default=Path("/var/lib/kubelet/plugins/net.toposerve.io/handoff.sock"),
                   help="serve the CNI plugin's calls here, its serverSocket "
                        "(default %(default)s)")
    n.add_argument("--no-handoff-server", action="store_true",
                   help="serve no hand-off socket (the CNI plugin then starts only pods "
                        "without NICs)")
    n.add_argument("--netns", help="read links in this named network namespace "
                                   "(default: the driver's own, the host's)")
    n.add_argument("--keep-loopback", action="store_true", help="publish loopback interfaces")
    n.add_argument("--keep-default-route", action="store_true",
                   help="publish the interfaces that hold a default route (the node's uplink)")
    n.add_argument("--keep-virtual", action="store_true",
                   help="publish interfaces without a PCI device (veth, bridge, ...)")
    n.add_argument("--interfaces", metavar="REGEX",
                   help="publish only interfaces whose whole name matches")
    n.add_argument("--exclude-interfaces", metavar="REGEX",
                   help="never publish interfaces whose whole name matches")
    n.add_argument("--rescan-interval", type=float, default=30.0,
                   help="seconds between rescans of links and device health; netlink "
                        "events rescan at once (default %(default)s)")
    n.set_defaults(handler=_net)

    i = dsub.add_parser("net-install-cni",
                        help="install the NIC hand-off CNI plugin toposerve-nic on this node")
    i.add_argument("--bin-dir", type=_path, default=Path("/opt/cni/bin"),
                   help="the runtime's CNI bin dir (default %(default)s)")
    i.add_argument("--plugin", type=_path,
                   help="the toposerve-nic binary to install (default: where the image "
                        f"has it, {DEFAULT_PLUGIN}; `make nic-cni` builds one)")
    i.add_argument("--conf-dir", type=_path, default=Path("/etc/cni/net.d"),
                   help="the runtime's CNI config dir (default %(default)s)")
    i.add_argument("--chain-into", metavar="FILE",
                   help="conflist in --conf-dir to add toposerve-nic to, last, if absent "
                        "(default: leave the CNI config alone)")
    i.add_argument("--kubelet-dir", type=_path, default=Path("/var/lib/kubelet"),
                   help="the kubelet's root, for the chain entry's paths and the record "
                        "of what was changed (default %(default)s)")
    i.add_argument("--uninstall", action="store_true",
                   help="undo what the installs on this node recorded: the conflist as it "
                        "was, the executable removed if they added it")
    i.set_defaults(handler=_install_cni)

    s = dsub.add_parser("simulate", help="publish GPU and NIC slices for every kwok fake node")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--kubeconfig", help="default $KUBECONFIG, ~/.kube/config, else in-cluster")
    where.add_argument("--cluster", help="a local cluster made by `toposerve cluster up`")
    s.add_argument("--profile", help="profile for every fake node (default: each node's "
                                     "topology.toposerve.io/profile label)")
    s.add_argument("--dialect", default=DialectName.TOPOSERVE.value,
                   choices=[d.value for d in DialectName],
                   help="node labels that carry the domain path (default %(default)s)")
    s.add_argument("--drivers", default="gpu.toposerve.io,net.toposerve.io",
                   help="the drivers to publish for, comma-separated (default %(default)s; "
                        "one alone is a cluster that runs only that driver)")
    s.add_argument("--workers", type=int, default=8,
                   help="concurrent slice writes per driver (default %(default)s)")
    s.add_argument("--http-address", type=_address, default=_address("127.0.0.1:9466"),
                   help="/healthz, /readyz, /status and /metrics (default 127.0.0.1:9466)")
    s.add_argument("--uninstall", action="store_true",
                   help="delete every simulated ResourceSlice and exit")
    s.set_defaults(handler=_simulate)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m toposerve.driver_cmd driver gpu ...``: the same
    command line as ``toposerve``, without loading the other parts' modules
    (a driver is restarted often; each start should be quick)."""
    parser = argparse.ArgumentParser(prog="toposerve")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    register(parser.add_subparsers(dest="command", required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    logs.configure(args.log_level)
    handler: Callable[[argparse.Namespace], int] = args.handler
    return handler(args)


if __name__ == "__main__":
    sys.exit(main())
