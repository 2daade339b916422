"""The install is one Helm chart, ``manifests/chart/toposerve`` (shipped in
the wheel): ``helm install`` takes it as any chart, and ``toposerve
manifests render`` is ``helm template`` of it after the values passed the
pydantic models. The models stay the one definition of the values: the
chart's ``values.yaml`` (their defaults, each with its description) and
``values.schema.json`` are generated from them by ``python -m
toposerve.manifests.chart``, and a unit test checks the committed files are
current."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from toposerve.manifests.values import (
    EXTENDER_CONFIG,
    KUBERNETES_VERSION,
    ROUTER_CONFIG,
    InstallValues,
    values_schema,
)

RELEASE = "toposerve"
# where `toposerve manifests render` puts the drivers, the extender and the
# scheduler when the values name no namespace (helm install: its -n)
DEFAULT_NAMESPACE = "toposerve-system"
# the chart's own defaults for the components' configs: what values give is
# merged over them, as Helm merges any map
CONFIG_DEFAULTS = {("router", "config"): ROUTER_CONFIG, ("extender", "config"): EXTENDER_CONFIG}
HEADER = """\
# Values of the toposerve chart: every key with its default and what it does.
# Generated from the pydantic models (toposerve.manifests.values) by
# `python -m toposerve.manifests.chart`; docs/install.md has the reference.
# Give only what you change: helm install -f my-values.yaml / --set key=value.
"""


class HelmError(RuntimeError):
    """helm is missing or failed; one line for a person."""


def chart_dir() -> Path:
    return Path(str(resources.files("toposerve.manifests").joinpath("chart", "toposerve")))


def find_helm(cached: Path | None = None) -> Path:
    """``$TOPOSERVE_HELM``, else the build in the tools cache (``cached``),
    else ``helm`` on PATH."""
    explicit = os.environ.get("TOPOSERVE_HELM")
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise HelmError(f"$TOPOSERVE_HELM={explicit} is not an executable: give the path "
                            "of a helm binary (v4), or unset it")
        return Path(explicit)
    if cached is not None and os.access(cached, os.X_OK):
        return cached
    found = shutil.which("helm")
    if found is None:
        raise HelmError("helm not found: `make tools` builds it into ~/.cache/toposerve/bin, "
                        "or install helm v4 on PATH, or set $TOPOSERVE_HELM")
    return Path(found)


def helm_values(values: InstallValues) -> dict[str, Any]:
    """What ``-f`` gives helm: the values as given (unset fields are left to
    the chart's values.yaml, which holds the same defaults)."""
    return values.model_dump(by_alias=True, mode="json", exclude_unset=True)


def template(values: InstallValues, helm: Path, namespace: str | None = None,
             release: str = RELEASE, api_versions: Sequence[str] = ()) -> str:
    """``helm template`` of the chart with ``values``: multi-document YAML."""
    ns = namespace or values.namespace or DEFAULT_NAMESPACE
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="toposerve-values-") as f:
        json.dump(helm_values(values), f)  # JSON is YAML
        f.flush()
        argv = [str(helm), "template", release, str(chart_dir()), "--namespace", ns,
                "--values", f.name, "--kube-version", KUBERNETES_VERSION]
        for api in api_versions:
            argv += ["--api-versions", api]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120,
                                  check=False)
        except OSError as err:
            raise HelmError(f"{helm}: cannot run: {err.strerror}") from None
    if done.returncode != 0:
        raise HelmError(f"helm template failed: {helm_error(done.stderr)}")
    return done.stdout


def helm_error(stderr: str) -> str:
    """helm's one line of what failed: it ends with a hint ("Use --debug
    ..."); its error (a template's `fail` message too) is the line it starts
    with "Error:"."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    errors = [ln.removeprefix("Error: ") for ln in lines if ln.startswith("Error: ")]
    return (errors or lines or ["(no output)"])[-1][:400]


# --- values.yaml and values.schema.json, generated from the models ---

def _flow(value: Any) -> str:
    """A value as a one-line YAML flow scalar or collection."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 16, sort_keys=False)
    return text.removesuffix("\n...\n").strip()


def _comment(text: str, indent: str) -> list[str]:
    """``text`` as comment lines of at most 100 columns (a long URL or path
    may run over, unbroken)."""
    width = max(40, 100 - len(indent) - 2)
    return [f"{indent}# {line}".rstrip() for para in text.splitlines()
            for line in textwrap.wrap(para, width, break_long_words=False,
                                      break_on_hyphens=False) or [""]]


def _lines(model: type[BaseModel], values: Mapping[str, Any], path: tuple[str, ...],
           depth: int) -> list[str]:
    indent = "  " * depth
    out: list[str] = []
    for name, field in model.model_fields.items():
        key = field.alias or name
        value = values.get(key)
        if field.description:
            out += _comment(field.description, indent)
        sub, here = _section(field.annotation), (*path, key)
        if here in CONFIG_DEFAULTS:
            block = yaml.safe_dump(CONFIG_DEFAULTS[here], default_flow_style=False,
                                   sort_keys=False, width=100 - len(indent))
            out.append(f"{indent}{key}:")
            out += [f"{indent}  {line}" for line in block.splitlines()]
        elif sub is not None and isinstance(value, Mapping):
            doc = (sub.__doc__ or "").strip()
            if doc and not field.description:
                out += _comment(" ".join(doc.split()), indent)
            out.append(f"{indent}{key}:")
            out += _lines(sub, value, here, depth + 1)
        else:
            out.append(f"{indent}{key}: {_flow(value)}")
    return out


def _section(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def values_yaml() -> str:
    """The chart's values.yaml: every default of the models, described."""
    defaults = InstallValues().model_dump(by_alias=True, mode="json")
    return HEADER + "\n".join(_lines(InstallValues, defaults, (), 0)) + "\n"


def schema_json() -> str:
    return json.dumps(values_schema(), indent=2) + "\n"


def generated() -> dict[str, str]:
    """The chart's generated files by name."""
    return {"values.yaml": values_yaml(), "values.schema.json": schema_json()}


def main() -> int:
    """Rewrite the generated files in the source tree's chart."""
    where = Path(__file__).resolve().parent / "chart" / "toposerve"
    for name, text in generated().items():
        (where / name).write_text(text, encoding="utf-8")
        print(f"wrote {where / name}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
