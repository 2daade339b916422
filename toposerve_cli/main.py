"""``toposerve``: one command, a subcommand per part."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import kubeapi
from toposerve_cli import (
    cluster_cmd,
    driver_cmd,
    extender_cmd,
    logs,
    manifests_cmd,
    router_cmd,
    scale_cmd,
    sim_cmd,
    topology_cmd,
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="toposerve",
        description="Topology-aware serving for large-model inference on Kubernetes.")
    parser.add_argument("--log-level", default="info",
                        choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    topology_cmd.register(sub)
    cluster_cmd.register(sub)
    sim_cmd.register(sub)
    router_cmd.register(sub)
    extender_cmd.register(sub)
    manifests_cmd.register(sub)
    driver_cmd.register(sub)
    scale_cmd.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.configure(args.log_level)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except kubeapi.ConfigError as err:  # no credentials, from any subcommand
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
