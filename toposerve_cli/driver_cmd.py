"""``toposerve driver``: the DRA drivers as kubelet plugins."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from topology.labels import DialectName
from toposerve_cli import logs

log = structlog.get_logger("toposerve.driver")


def _fail(msg: str) -> int:
    print(f"error: {msg}", file=sys.stderr)
    return 2


def _api(kubeconfig: str | None) -> Any:
    """A client from the kubeconfig (``--kubeconfig``, ``$KUBECONFIG`` or
    ``~/.kube/config``), in-cluster config only when there is none."""
    from kubernetes import client, config

    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG") or str(Path.home() / ".kube/config")
    if kubeconfig or Path(path).exists():
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=path, client_configuration=cfg)
    else:
        config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=cfg)
    return client.ApiClient(cfg)


def _address(value: str) -> tuple[str, int]:
    host, _, port = value.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"{value!r}: give host:port, e.g. 127.0.0.1:9465")
    return host, int(port)


def _gpu(args: argparse.Namespace) -> int:
    from dra_driver.framework.checkpoint import CorruptCheckpoint
    from dra_driver.framework.liveness import HttpEndpoints, healthz_route, metrics_route
    from dra_driver.gpu.driver import GpuDriver, GpuDriverOptions

    if not args.node_name:
        return _fail("--node-name is required (or set NODE_NAME)")
    opts = GpuDriverOptions(
        node_name=args.node_name, plugin_dir=args.plugin_dir, registry_dir=args.registry_dir,
        cdi_root=args.cdi_root, sysfs_root=args.sysfs_root, dev_root=args.dev_root,
        pod_uid=args.pod_uid or None, dialect=DialectName(args.dialect),
        health_interval_s=args.health_interval)
    if not (opts.sysfs_root / "bus/pci/devices").is_dir():
        return _fail(f"--sysfs-root {opts.sysfs_root}: no bus/pci/devices there")
    api = _api(args.kubeconfig)
    driver = GpuDriver(api, opts)
    if args.uninstall:
        n = driver.publisher.uninstall()
        print(f"deleted {n} ResourceSlices of {driver.kind.driver} on {opts.node_name}")
        return 0
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        driver.start()
    except CorruptCheckpoint as err:
        driver.stop()
        return _fail(str(err))
    http = None
    if args.http_address:
        host, port = args.http_address
        http = HttpEndpoints(host, port, {
            "/healthz": healthz_route(driver.plugin.cfg.paths.registration_socket,
                                      driver.kind.driver),
            "/metrics": metrics_route})
        http.start()
    stop.wait()
    log.info("shutting down", driver=driver.kind.driver)
    if http is not None:
        http.stop()
    driver.stop()
    return 0


def _simulate(args: argparse.Namespace) -> int:
    from dra_driver.simulate import run

    if args.cluster:
        from localcluster.cluster import ClusterError, api_client

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
                   uninstall=args.uninstall, stop=stop)
    except ValueError as err:
        return _fail(str(err))


def register(sub: Any) -> None:
    p = sub.add_parser("driver", help="run a DRA driver (kubelet plugin) on this node")
    dsub = p.add_subparsers(dest="driver_command", required=True, metavar="DRIVER")

    g = dsub.add_parser("gpu", help="the GPU driver gpu.toposerve.io")
    g.add_argument("--node-name", default=os.environ.get("NODE_NAME"),
                   help="this node's name (default $NODE_NAME)")
    g.add_argument("--kubeconfig", help="default $KUBECONFIG, ~/.kube/config, else in-cluster")
    g.add_argument("--plugin-dir", type=Path,
                   help="DRA socket, checkpoint and lock (default "
                        "/var/lib/kubelet/plugins/gpu.toposerve.io)")
    g.add_argument("--registry-dir", type=Path, default=Path("/var/lib/kubelet/plugins_registry"),
                   help="the kubelet's plugin registry (default %(default)s)")
    g.add_argument("--cdi-root", type=Path, default=Path("/var/run/cdi"),
                   help="where CDI specs go; the runtime must read it (default %(default)s)")
    g.add_argument("--sysfs-root", type=Path, default=Path("/sys"),
                   help="sysfs to discover GPUs in (default %(default)s)")
    g.add_argument("--dev-root", type=Path, default=Path("/dev"),
                   help="where the GPUs' device nodes are on the host (default %(default)s)")
    g.add_argument("--pod-uid", default=os.environ.get("POD_UID"),
                   help="rolling-update mode: sockets named with this pod UID (default $POD_UID)")
    g.add_argument("--dialect", default=DialectName.TOPOSERVE.value,
                   choices=[d.value for d in DialectName],
                   help="node labels that carry the domain path (default %(default)s)")
    g.add_argument("--http-address", type=_address, default=_address("127.0.0.1:9465"),
                   help="/healthz and /metrics (default 127.0.0.1:9465)")
    g.add_argument("--health-interval", type=float, default=10.0,
                   help="seconds between device health checks (default %(default)s)")
    g.add_argument("--uninstall", action="store_true",
                   help="delete this driver's ResourceSlices of the node and exit")
    g.set_defaults(handler=_gpu)

    s = dsub.add_parser("simulate", help="publish GPU and NIC slices for every kwok fake node")
    where = s.add_mutually_exclusive_group()
    where.add_argument("--kubeconfig", help="default $KUBECONFIG, ~/.kube/config, else in-cluster")
    where.add_argument("--cluster", help="a local cluster made by `toposerve cluster up`")
    s.add_argument("--profile", help="profile for every fake node (default: each node's "
                                     "topology.toposerve.io/profile label)")
    s.add_argument("--dialect", default=DialectName.TOPOSERVE.value,
                   choices=[d.value for d in DialectName],
                   help="node labels that carry the domain path (default %(default)s)")
    s.add_argument("--workers", type=int, default=8,
                   help="concurrent slice writes per driver (default %(default)s)")
    s.add_argument("--http-address", type=_address, default=_address("127.0.0.1:9466"),
                   help="/healthz, /readyz, /status and /metrics (default 127.0.0.1:9466)")
    s.add_argument("--uninstall", action="store_true",
                   help="delete every simulated ResourceSlice and exit")
    s.set_defaults(handler=_simulate)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m toposerve_cli.driver_cmd driver gpu ...``: the same
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
