"""Values in, Kubernetes objects out: each component is a jinja2 template
(``manifests/templates``) rendered with StrictUndefined, parsed back as YAML
and checked, so what is printed is valid YAML and the same for the same
values, byte for byte."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jinja2
import yaml
from pydantic import BaseModel

from manifests.values import COMPONENTS, Component, InstallValues
from topology.config_file import API_VERSION

GPU_DRIVER = "gpu.toposerve.io"
NET_DRIVER = "net.toposerve.io"
# where every pod finds the rendered kubeconfig and its own service-account token
KUBECONFIG_DIR = "/etc/toposerve/kubeconfig"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# the driver's exec liveness probe: the framework's own probe (GetInfo, then an
# empty NodePrepareResources) on the registration socket its pod UID names;
# sys.exit(message) fails the probe and says why
LIVENESS_SCRIPT = (
    "import os, sys; from pathlib import Path; "
    "from dra_driver.framework.liveness import probe; "
    "from dra_driver.framework.sockets import PluginPaths; "
    f"p = PluginPaths({GPU_DRIVER!r}, registry_dir=Path(sys.argv[1]), "
    "pod_uid=os.environ['POD_UID']); "
    "sys.exit(probe(p.registration_socket, p.driver))")
TEMPLATES: dict[Component | None, str] = {
    None: "base.yaml.j2",  # namespace and kubeconfig: every namespaced component needs them
    "gpu-driver": "gpu-driver.yaml.j2",
    "admission-policy": "admission-policy.yaml.j2",
    "device-classes": "device-classes.yaml.j2",
    "extender": "extender.yaml.j2",
    "scheduler": "scheduler.yaml.j2",
}
NAMESPACED: frozenset[Component] = frozenset({"gpu-driver", "extender", "scheduler"})


class RenderError(ValueError):
    """The templates produced something that is not a valid object list (a bug
    in a template, reported with the template's name)."""


@dataclass(frozen=True)
class Names:
    """Every object name, in one place, from the values' prefix."""

    prefix: str

    @property
    def gpu_driver(self) -> str:
        return f"{self.prefix}-gpu-driver"

    @property
    def net_driver(self) -> str:
        return f"{self.prefix}-net-driver"

    @property
    def slice_policy(self) -> str:
        return f"{self.prefix}-resourceslices-own-node"

    @property
    def extender(self) -> str:
        return f"{self.prefix}-extender"

    @property
    def scheduler(self) -> str:
        return f"{self.prefix}-scheduler"

    @property
    def kubeconfig(self) -> str:
        return f"{self.prefix}-kubeconfig"


def service_account_user(namespace: str, name: str) -> str:
    return f"system:serviceaccount:{namespace}:{name}"


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return value.model_dump(by_alias=True, exclude_none=True, mode="json")
    raise TypeError(f"cannot put {type(value).__name__} into a manifest")


def _q(value: Any) -> str:
    """Any value as a YAML flow scalar or collection (JSON is YAML)."""
    return json.dumps(value, default=_plain, sort_keys=True)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("manifests", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=False,  # YAML, not HTML
    keep_trailing_newline=True,
)
_ENV.filters["q"] = _q
_ENV.filters["sha256"] = _sha256


def extender_config(values: InstallValues) -> str:
    """The extender's ``ExtenderConfig`` file, as the ConfigMap carries it."""
    doc = {"apiVersion": API_VERSION, "kind": "ExtenderConfig", **values.extender.config}
    return yaml.safe_dump(doc, sort_keys=False)


def _context(values: InstallValues) -> dict[str, Any]:
    names = Names(values.name_prefix)
    restricted = [service_account_user(values.namespace, names.gpu_driver)]
    if values.admission_policy.include_net_driver:
        restricted.append(service_account_user(values.namespace, names.net_driver))

    def labels(component: str) -> dict[str, str]:
        return {**selector(component), "app.kubernetes.io/part-of": "toposerve",
                "app.kubernetes.io/version": values.image.tag}

    def selector(component: str) -> dict[str, str]:
        return {"app.kubernetes.io/name": "toposerve",
                "app.kubernetes.io/instance": values.name_prefix,
                "app.kubernetes.io/component": component}

    return {
        "v": values, "names": names, "labels": labels, "selector": selector,
        "gpu_driver": GPU_DRIVER, "net_driver": NET_DRIVER, "liveness_script": LIVENESS_SCRIPT,
        "restricted_users": restricted,
        "kubeconfig_dir": KUBECONFIG_DIR, "kubeconfig_file": f"{KUBECONFIG_DIR}/kubeconfig",
        "sa_dir": SA_DIR,
        "extender_config": extender_config(values),
        "extender_url": values.scheduler.extender_url
        or f"http://127.0.0.1:{values.extender.port}",
        "extender_write_rules": [],
    }


def _key(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    meta = obj.get("metadata") or {}
    return (str(obj.get("apiVersion")), str(obj.get("kind")), str(meta.get("namespace", "")),
            str(meta.get("name")))


def _parse(text: str, template: str) -> list[dict[str, Any]]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise RenderError(f"{template}: rendered text is not YAML: {err}") from None
    for d in docs:
        if not (isinstance(d, dict) and d.get("apiVersion") and d.get("kind")
                and isinstance(d.get("metadata"), dict) and d["metadata"].get("name")):
            raise RenderError(f"{template}: a document without apiVersion, kind and "
                              f"metadata.name: {str(d)[:120]}")
    return docs


def selected(values: InstallValues, only: Iterable[Component] = ()) -> list[Component]:
    """The components to render: those asked for (in their canonical order),
    or every enabled one."""
    asked = set(only)
    return [c for c in COMPONENTS if c in asked] if asked else values.enabled()


def render_objects(values: InstallValues, only: Iterable[Component] = ()) -> list[dict[str, Any]]:
    """The objects of the selected components, namespace first."""
    components = selected(values, only)
    parts: list[Component | None] = list(components)
    if NAMESPACED & set(components):
        parts.insert(0, None)
    ctx = _context(values)
    objects: list[dict[str, Any]] = []
    for part in parts:
        name = TEMPLATES[part]
        try:
            text = _ENV.get_template(name).render(ctx)
        except jinja2.UndefinedError as err:
            raise RenderError(f"{name}: {err.message}") from None
        objects.extend(_parse(text, name))
    seen: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        if _key(obj) in seen:
            raise RenderError(f"two objects named {'/'.join(_key(obj))}")
        seen.add(_key(obj))
    return objects


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    # embedded files (kubeconfig, configs) stay readable as literal blocks
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(objects: Iterable[Mapping[str, Any]]) -> str:
    return yaml.dump_all(list(objects), Dumper=_Dumper, sort_keys=False,
                         default_flow_style=False, width=1 << 16, explicit_start=True)


def render(values: InstallValues, only: Iterable[Component] = ()) -> str:
    """Multi-document YAML of the selected components."""
    return to_yaml(render_objects(values, only))
