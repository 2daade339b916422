"""``toposerve router``: the OpenAI-compatible router."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import structlog

from router.config import RouterConfig, load_router_config, quick_config
from router.scheduling.registry import PluginError
from topology.config_file import ConfigError


def _load(args: argparse.Namespace) -> RouterConfig:
    if args.config:
        if args.endpoint:
            raise ConfigError("give --config or --endpoint, not both")
        return load_router_config(args.config)
    if not args.endpoint:
        raise ConfigError("give --config FILE or at least one --endpoint http://HOST:PORT")
    try:
        return quick_config(args.endpoint, args.host, args.port)
    except ValueError as err:
        raise ConfigError(f"--endpoint: {err}") from None


def _run(args: argparse.Namespace) -> int:
    from router.http.server import Router, serve

    try:
        cfg = _load(args)
        Router(cfg)  # builds the profile: unknown plugins fail here, before binding
    except (ConfigError, PluginError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    structlog.get_logger("toposerve.router").info(
        "serving", url=f"http://{cfg.server.host}:{cfg.server.port}")
    serve(cfg)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("router", help="run the OpenAI-compatible router")
    p.add_argument("--config", help="a RouterConfig YAML file")
    p.add_argument("--endpoint", action="append", help="http://HOST:PORT of a model server "
                   "(repeatable; quick start with the default profile)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.set_defaults(handler=_run)
