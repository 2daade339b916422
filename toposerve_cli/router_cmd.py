"""``toposerve router``: the OpenAI-compatible router, standalone or
(``--mode endpoint-picker``) as the endpoint picker a Gateway's proxy asks;
standalone, in ``--workers`` processes on one port."""

from __future__ import annotations

import argparse
import socket
import sys
from typing import Any

import structlog
from pydantic import ValidationError

from toposerve.kubeapi import connect
from toposerve.listen import listen
from toposerve.router.config import (
    MAX_WORKERS,
    RouterConfig,
    ServerConfig,
    quick_document,
)
from toposerve.router.epp.fit import unfit
from toposerve.router.scheduling.registry import PluginError
from toposerve.topology.config_file import ConfigError, explain, parse_document, read_document
from toposerve.wire.chat_template import ChatTemplateError
from toposerve.wire.tokens import TokenizerError


def _flag(loc: tuple[int | str, ...]) -> str:
    """The flag a field of the quick-start configuration comes from."""
    if loc[:2] == ("discovery", "static"):
        return "--endpoint"
    return "--" + str(loc[-1]) if loc[:1] == ("server",) else ".".join(map(str, loc))


def _server_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The server fields the flags give, checked on their own so that an
    error names the flag, not the config file's field it overrides."""
    given = {k: v for k in ("host", "port", "workers") if (v := getattr(args, k)) is not None}
    try:
        ServerConfig.model_validate(given)
    except ValidationError as err:
        raise ConfigError(explain(err, "toposerve router",
                                  name=lambda loc: f"--{loc[-1]}")) from None
    return given


def _document(args: argparse.Namespace) -> tuple[dict[str, Any], str]:
    """The config document, with --host, --port and --workers in it, and
    what errors call it."""
    if args.config:
        if args.endpoint:
            raise ConfigError("give --config or --endpoint, not both")
        doc, source = read_document(args.config), args.config
    elif not args.endpoint:
        raise ConfigError("give --config FILE or at least one --endpoint http://HOST:PORT")
    else:
        default = ServerConfig()
        doc = quick_document(args.endpoint, default.host, default.port)
        source = "toposerve router"
    flags = _server_flags(args)
    if flags and isinstance(doc, dict) and isinstance(doc.get("server", {}), dict):
        doc = {**doc, "server": {**doc.get("server", {}), **flags}}
    return doc, source


def _load(doc: dict[str, Any], source: str, args: argparse.Namespace) -> RouterConfig:
    if args.config:
        return parse_document(doc, RouterConfig, "RouterConfig", source)
    try:
        return RouterConfig.model_validate(doc)
    except ValidationError as err:
        raise ConfigError(explain(err, source, name=_flag)) from None


def _workers(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= MAX_WORKERS:
        raise argparse.ArgumentTypeError(f"--workers: {text!r} is not a number from 1 to "
                                         f"{MAX_WORKERS}")
    return n


def _kubeconfigs(cfg: RouterConfig) -> list[tuple[str, str | None]]:
    """The credentials the router will need, each with the field that names
    it: the pod (or InferencePool) watch's, the hot-standby Lease's, the
    API-key Secret's."""
    out = []
    if cfg.discovery.kubernetes is not None:
        out.append(("discovery.kubernetes.kubeconfig", cfg.discovery.kubernetes.kubeconfig))
    if cfg.discovery.inference_pool is not None:
        out.append(("discovery.inferencePool.kubeconfig",
                    cfg.discovery.inference_pool.kubeconfig))
    if cfg.ha.enabled and cfg.ha.mode == "hot-standby":  # active-active takes no Lease
        out.append(("ha.lease.kubeconfig", cfg.ha.lease.kubeconfig))
    keys = cfg.flow_control.tenants.keys
    if keys is not None and keys.secret is not None:
        out.append(("flowControl.tenants.keys.secret.kubeconfig", keys.secret.kubeconfig))
    return out


def _run(args: argparse.Namespace) -> int:
    from toposerve.router.http.app import Router, serve
    from toposerve.router.http.workers import Assignment, Workers

    if args.worker:  # one of the parent's --workers, all checked by it already
        a = Assignment.read()
        serve(parse_document(a.doc, RouterConfig, "RouterConfig", a.source),
              socket.socket(fileno=a.fd), a.bus, a.index)
        return 0
    picker = args.mode == "endpoint-picker"
    if picker:  # needs the epp extra: missing, main names it
        from toposerve.router.epp import server as epp
    try:
        doc, source = _document(args)
        cfg = _load(doc, source, args)
        if picker and (why := unfit(cfg)):
            raise ConfigError(f"{args.config or 'toposerve router'}: {why}")
        if picker and cfg.server.workers > 1:
            raise ConfigError(f"{source}: server.workers (--workers) {cfg.server.workers}: "
                              "the endpoint picker runs in one process; give 1")
        Router(cfg)  # builds the profile: unknown plugins fail here, before binding
    except ConfigError as err:  # names its file itself
        print(f"error: {err}", file=sys.stderr)
        return 2
    except PluginError as err:  # a profile's plugin: only --config can name one
        print(f"error: {args.config}: {err}", file=sys.stderr)
        return 2
    except TokenizerError as err:
        print(f"error: kvEvents.tokenizer in {args.config}: {err}", file=sys.stderr)
        return 2
    except ChatTemplateError as err:  # its own file, or the one beside the tokenizer
        print(f"error: kvEvents.chatTemplate in {args.config}: {err}", file=sys.stderr)
        return 2
    for field, kubeconfig in _kubeconfigs(cfg):
        connect(kubeconfig, named_by=field)  # no credentials: one line, before anything serves
    if picker:
        # checked here for the one-line refusal; gRPC binds it itself when it starts
        e = cfg.endpoint_picker
        listen(e.host, e.port, f"endpointPicker.host or endpointPicker.port in "
                               f"{args.config or 'a --config file'}").close()
    workers = cfg.server.workers
    from_file = args.config and args.host is None and args.port is None
    sock = listen(cfg.server.host, cfg.server.port,
                  f"server.host or server.port in {args.config}" if from_file
                  else "--host or --port", reuse_port=workers > 1)
    structlog.get_logger("toposerve.router").info(
        "serving", url=f"http://{cfg.server.host}:{sock.getsockname()[1]}", workers=workers)
    if workers > 1:
        return Workers(cfg, doc, source, sock, [
            sys.executable, "-m", "toposerve.main", "--log-level", args.log_level, "router",
            "--worker"]).run()
    (epp.serve if picker else serve)(cfg, sock)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("router", help="run the OpenAI-compatible router")
    p.add_argument("--config", help="a RouterConfig YAML file")
    p.add_argument("--endpoint", action="append", help="http://HOST:PORT of a model server "
                   "(repeatable; quick start with the default profile)")
    p.add_argument("--host", help="address to listen on, over --config's server.host "
                                  "(default: the config's, 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on, over --config's server.port "
                                           "(default: the config's, 8080)")
    p.add_argument("--mode", choices=("standalone", "endpoint-picker"), default="standalone",
                   help="standalone: serve the OpenAI API and relay to the endpoints; "
                        "endpoint-picker: answer a proxy's external-processing calls (gRPC, "
                        "endpointPicker in the config) with the endpoint for each request, "
                        "and serve only probes and metrics over HTTP (default %(default)s)")
    p.add_argument("--workers", type=_workers, default=None,
                   help="router processes on one port (SO_REUSEPORT), sharing in-flight "
                        "counts, sessions and routing decisions (default: server.workers, 1)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(handler=_run)
