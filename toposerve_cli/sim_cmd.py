"""``toposerve sim``: a simulated vLLM/SGLang model server."""

from __future__ import annotations

import argparse
import sys
from enum import StrEnum
from typing import Any

import structlog
from pydantic import ValidationError

from toposerve.listen import listen
from toposerve.simulator.config import SimConfig
from toposerve.topology.config_file import explain
from toposerve.wire.chat_template import ChatTemplateError
from toposerve.wire.tokens import TokenizerError

# flag -> SimConfig field; every field gets a flag with its default and help
_SKIP = {"served_model_names"}


def _flag(loc: tuple[int | str, ...]) -> str:
    """The flag of a field (an error of the whole configuration: the command's)."""
    return SimConfig.spelled(str(loc[0])) if loc else "(all flags)"


def _run(args: argparse.Namespace) -> int:
    values = {k: v for k, v in vars(args).items()
              if k in SimConfig.model_fields and v is not None}
    if args.served_model_name:
        values["served_model_names"] = args.served_model_name
    try:
        cfg = SimConfig(**values)
    except ValidationError as err:
        print(f"error: {explain(err, 'toposerve sim', name=_flag)}", file=sys.stderr)
        return 2
    from toposerve.simulator.kv_publisher import BindError
    from toposerve.simulator.server import build_app, serve

    try:  # the tokenizer and chat template load here, the other ports bind, before listening
        app = build_app(cfg)
    except (TokenizerError, ChatTemplateError) as err:
        print(f"error: --tokenizer: {err}", file=sys.stderr)
        return 2
    except BindError as err:
        print(f"error: {err}; change --host or {_flag((err.field,))}", file=sys.stderr)
        return 2
    sock = listen(cfg.host, cfg.port, "--host or --port")
    structlog.get_logger("toposerve.sim").info(
        "serving", url=f"http://{cfg.host}:{sock.getsockname()[1]}", dialect=cfg.dialect.value,
        models=list(cfg.names))
    serve(cfg, sock, app)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("sim", help="run a simulated vLLM/SGLang model server")
    for name, field in SimConfig.model_fields.items():
        if name in _SKIP:
            continue
        flag = SimConfig.spelled(name)
        kind = field.annotation
        # no "default None" or "default " for a field without one worth showing
        shown = None if field.default in ("", None) else f"default {field.default}"
        help_ = "; ".join(x for x in (field.description, shown) if x) or None
        if isinstance(kind, type) and issubclass(kind, StrEnum):
            p.add_argument(flag, dest=name, choices=[e.value for e in kind], help=help_)
        elif kind in (int, int | None):
            p.add_argument(flag, dest=name, type=int, help=help_)
        elif kind is float:
            p.add_argument(flag, dest=name, type=float, help=help_)
        elif kind is bool:
            p.add_argument(flag, dest=name, choices=["true", "false"], type=str.lower,
                           help=help_)
        else:
            p.add_argument(flag, dest=name, help=help_)
    p.add_argument("--served-model-name", action="append",
                   help="a name the model answers to (repeatable)")
    p.set_defaults(handler=_run)
