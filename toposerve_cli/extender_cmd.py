"""``toposerve extender``: the kube-scheduler extender, and the scheduler
configuration that calls it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import structlog
from pydantic import ValidationError

from toposerve.listen import listen
from toposerve.topology.config_file import ConfigError, explain
from toposerve.wire.addresses import dialable


def _run(args: argparse.Namespace) -> int:
    from toposerve.scheduler_ext.config import ExtenderConfig, ServerConfig, load_extender_config

    try:
        cfg = load_extender_config(args.config) if args.config else ExtenderConfig()
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    server = cfg.server.model_dump(by_alias=True)
    if args.host is not None:
        server["host"] = args.host
    if args.port is not None:
        server["port"] = args.port
    try:  # the file's server section is valid: what fails here is a flag
        cfg = cfg.model_copy(update={"server": ServerConfig.model_validate(server)})
    except ValidationError as err:
        print(f"error: {explain(err, 'toposerve extender', name=lambda loc: f'--{loc[-1]}')}",
              file=sys.stderr)
        return 2
    from toposerve.scheduler_ext.server import api_client, serve

    api = api_client(args.kubeconfig)  # no credentials: one line, before anything serves
    sock = listen(cfg.server.host, cfg.server.port,
                  "--host or --port" + (f" (server.host, server.port in {args.config})"
                                        if args.config else ""))
    scheme = "https" if cfg.server.cert_file else "http"
    url = f"{scheme}://{cfg.server.host}:{sock.getsockname()[1]}"
    try:
        serve(cfg, api, sock=sock,
              listening=lambda: structlog.get_logger("toposerve.extender").info(
                  "serving", url=url, kubeconfig=args.kubeconfig or "(in-cluster)"))
    except OSError as err:  # the port is taken, the address not ours, ...
        print(f"error: cannot listen on {url}: {err.strerror or err}", file=sys.stderr)
        return 1
    return 0


def _scheduler_config(args: argparse.Namespace) -> int:
    from toposerve.scheduler_ext.scheduler_config import (
        MAX_TIMEOUT_S,
        MIN_TIMEOUT_S,
        render,
        scheduler_config,
    )

    try:
        if not args.url.startswith(("http://", "https://")):
            raise ValueError("not http:// or https://")
        dialable(args.url)
    except ValueError as err:
        print(f"error: --url {args.url}: {err}; give the extender's URL prefix, "
              "e.g. http://127.0.0.1:8888", file=sys.stderr)
        return 2
    # what kube-scheduler refuses to start with, and the chart's values for
    # the same fields (scheduler.extenderWeight, extenderTimeoutSeconds) refuse
    for flag, value, ok, allowed in (
            ("--weight", args.weight, args.weight >= 1, "1 or more"),
            ("--timeout", f"{args.timeout:g}", MIN_TIMEOUT_S <= args.timeout <= MAX_TIMEOUT_S,
             f"{MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:g} seconds"),
            # qps is the burst too, an int32 there; none: the scheduler's default
            ("--qps", args.qps, args.qps is None or 1 <= args.qps <= 2**31 - 1,
             f"1 to {2**31 - 1}, or leave it out for the scheduler's default")):
        if not ok:
            print(f"error: {flag} {value}: give {allowed}", file=sys.stderr)
            return 2
    try:
        cfg = scheduler_config(args.url, weight=args.weight, timeout_s=args.timeout,
                               scheduler_name=args.scheduler_name, qps=args.qps,
                               kubeconfig=args.kubeconfig,
                               ungrouped_scheduler_name=args.ungrouped_scheduler_name,
                               percentage_of_nodes_to_score=None if args.sampled else 100)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(render(cfg), end="")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("extender", help="run the topology-aware kube-scheduler extender")
    p.add_argument("--config", help="an ExtenderConfig YAML file (see docs/extender.md)")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster config)")
    p.add_argument("--host", help="address to listen on (default: the config's, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (default: the config's, 8888)")
    p.set_defaults(handler=_run)
    inner = p.add_subparsers(dest="extender_command", metavar="COMMAND")
    sc = inner.add_parser("scheduler-config",
                          help="print the KubeSchedulerConfiguration that calls the extender")
    sc.add_argument("--url", required=True, help="the extender's URL prefix")
    sc.add_argument("--weight", type=int, default=1,
                    help="weight of its scores, 1 or more (default 1)")
    sc.add_argument("--timeout", type=float, default=5.0,
                    help="seconds per call, over 0, before the scheduler ignores it "
                         "(default 5)")
    sc.add_argument("--scheduler-name", help="profile schedulerName (default: the default "
                                             "scheduler's profile)")
    sc.add_argument("--ungrouped-scheduler-name",
                    help="also a profile of this name for pods of no group: the extender "
                         "keeps them off what groups were promised, and the scheduler "
                         "samples nodes as the stock one does rather than filtering every "
                         "node")
    sc.add_argument("--qps", type=int, help="the scheduler's client QPS and burst, 1 or more "
                                            "(default: the scheduler's)")
    sc.add_argument("--kubeconfig", help="clientConnection.kubeconfig of the scheduler")
    sc.add_argument("--sampled", action="store_true",
                    help="leave percentageOfNodesToScore to the scheduler (a sample of the "
                         "nodes at scale, not every one); run the extender with "
                         "placement.sampledNodes: true")
    sc.set_defaults(handler=_scheduler_config)
