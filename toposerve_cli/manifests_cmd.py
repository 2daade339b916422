"""``toposerve manifests render``: print the install as multi-document YAML
(``kubectl apply -f -`` takes it), from a values file and ``--set`` flags."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from manifests.render import RenderError, render
from manifests.values import COMPONENTS, load_values
from topology.config_file import ConfigError


def _render(args: argparse.Namespace) -> int:
    try:
        values = load_values(args.values, args.set or ())
        text = render(values, args.component or ())
    except (ConfigError, RenderError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("manifests", help="Kubernetes manifests that install toposerve")
    msub = p.add_subparsers(dest="manifests_command", required=True, metavar="COMMAND")
    r = msub.add_parser(
        "render", help="print the install as multi-document YAML",
        description="Render the install from values (kind: InstallValues, see docs/install.md).")
    r.add_argument("-f", "--values", metavar="FILE", help="values file (YAML)")
    r.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one value, e.g. --set apiServer.host=127.0.0.1 (repeatable; "
                        "the value is read as YAML)")
    r.add_argument("--component", action="append", choices=COMPONENTS,
                   help="render only this component (repeatable; default: every enabled one)")
    r.set_defaults(handler=_render)
