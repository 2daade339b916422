"""``toposerve router``: the OpenAI-compatible router, standalone or
(``--mode endpoint-picker``) as the endpoint picker a Gateway's proxy asks."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import structlog
from pydantic import ValidationError

from toposerve.kubeapi import connect
from toposerve.listen import listen
from toposerve.router.config import RouterConfig, load_router_config, quick_config
from toposerve.router.epp.fit import unfit
from toposerve.router.scheduling.registry import PluginError
from toposerve.topology.config_file import ConfigError, explain
from toposerve.wire.chat_template import ChatTemplateError
from toposerve.wire.tokens import TokenizerError


def _flag(loc: tuple[int | str, ...]) -> str:
    """The flag a field of the quick-start configuration comes from."""
    if loc[:2] == ("discovery", "static"):
        return "--endpoint"
    return "--" + str(loc[-1]) if loc[:1] == ("server",) else ".".join(map(str, loc))


def _load(args: argparse.Namespace) -> RouterConfig:
    if args.config:
        if args.endpoint:
            raise ConfigError("give --config or --endpoint, not both")
        return load_router_config(args.config)
    if not args.endpoint:
        raise ConfigError("give --config FILE or at least one --endpoint http://HOST:PORT")
    try:
        return quick_config(args.endpoint, args.host, args.port)
    except ValidationError as err:
        raise ConfigError(explain(err, "toposerve router", name=_flag)) from None


def _kubeconfigs(cfg: RouterConfig) -> list[tuple[str, str | None]]:
    """The credentials the router will need, each with the field that names
    it: the pod (or InferencePool) watch's, the Lease's, the API-key Secret's."""
    out = []
    if cfg.discovery.kubernetes is not None:
        out.append(("discovery.kubernetes.kubeconfig", cfg.discovery.kubernetes.kubeconfig))
    if cfg.discovery.inference_pool is not None:
        out.append(("discovery.inferencePool.kubeconfig",
                    cfg.discovery.inference_pool.kubeconfig))
    if cfg.ha.enabled:
        out.append(("ha.lease.kubeconfig", cfg.ha.lease.kubeconfig))
    keys = cfg.flow_control.tenants.keys
    if keys is not None and keys.secret is not None:
        out.append(("flowControl.tenants.keys.secret.kubeconfig", keys.secret.kubeconfig))
    return out


def _run(args: argparse.Namespace) -> int:
    from toposerve.router.http.app import Router, serve

    picker = args.mode == "endpoint-picker"
    if picker:  # needs the epp extra: missing, main names it
        from toposerve.router.epp import server as epp
    try:
        cfg = _load(args)
        if picker and (why := unfit(cfg)):
            raise ConfigError(f"{args.config or 'toposerve router'}: {why}")
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
    sock = listen(cfg.server.host, cfg.server.port,
                  f"server.host or server.port in {args.config}" if args.config
                  else "--host or --port")
    structlog.get_logger("toposerve.router").info(
        "serving", url=f"http://{cfg.server.host}:{sock.getsockname()[1]}")
    (epp.serve if picker else serve)(cfg, sock)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("router", help="run the OpenAI-compatible router")
    p.add_argument("--config", help="a RouterConfig YAML file")
    p.add_argument("--endpoint", action="append", help="http://HOST:PORT of a model server "
                   "(repeatable; quick start with the default profile)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on with --endpoint (default %(default)s)")
    p.add_argument("--port", type=int, default=8080,
                   help="port to listen on with --endpoint (default %(default)s)")
    p.add_argument("--mode", choices=("standalone", "endpoint-picker"), default="standalone",
                   help="standalone: serve the OpenAI API and relay to the endpoints; "
                        "endpoint-picker: answer a proxy's external-processing calls (gRPC, "
                        "endpointPicker in the config) with the endpoint for each request, "
                        "and serve only probes and metrics over HTTP (default %(default)s)")
    p.set_defaults(handler=_run)
