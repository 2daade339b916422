"""``toposerve manifests render``: print the install (the Helm chart as
``helm template`` renders it, after the values passed their models) as
multi-document YAML (``kubectl apply -f -`` takes it), from a values file
and ``--set`` flags; ``toposerve manifests schema``: the values' JSON Schema."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from toposerve.manifests.chart import HelmError, find_helm
from toposerve.manifests.render import RenderError, render
from toposerve.manifests.values import COMPONENTS, load_values, values_schema
from toposerve.topology.config_file import ConfigError


def _render(args: argparse.Namespace) -> int:
    try:
        values = load_values(args.values, args.set or ())
        text = render(values, args.component or (), find_helm(_built_helm()))
    except (ConfigError, RenderError, HelmError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def _built_helm() -> Path | None:
    """The helm `make setup` builds, where the local cluster's tools are part
    of this install (a wheel without them finds helm on PATH)."""
    try:
        from toposerve.localcluster.tools import helm_path
    except ImportError:
        return None
    return helm_path()


def _schema(args: argparse.Namespace) -> int:
    text = json.dumps(values_schema(), indent=2) + "\n"
    if args.output is None:
        sys.stdout.write(text)
        return 0
    try:
        Path(args.output).write_text(text, encoding="utf-8")
    except OSError as err:
        print(f"error: {args.output}: cannot write: {err.strerror}", file=sys.stderr)
        return 2
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
    s = msub.add_parser(
        "schema", help="print the values' JSON Schema",
        description="The JSON Schema of a values file (what a Helm chart ships as "
                    "values.schema.json): for editors and CI checks of values files.")
    s.add_argument("-o", "--output", metavar="FILE", help="write it here instead of stdout")
    s.set_defaults(handler=_schema)
