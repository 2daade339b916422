"""Values in, Kubernetes objects out: the chart (``manifests/chart``)
rendered by ``helm template`` with the values that passed the pydantic
models, parsed back as YAML and checked (every document an object, no two
alike, the routers' and extenders' embedded configs valid as their commands
will read them), so what ``toposerve manifests render`` prints is what
``helm install`` would create, the same for the same values."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from toposerve.manifests.chart import DEFAULT_NAMESPACE, HelmError, find_helm, template
from toposerve.manifests.values import COMPONENTS, Component, InstallValues
from toposerve.router.config import RouterConfig
from toposerve.scheduler_ext.config import ExtenderConfig

GPU_DRIVER = "gpu.toposerve.io"
NET_DRIVER = "net.toposerve.io"
# on the host network, which of the router's per-replica Deployments a pod is of
REPLICA_LABEL = "toposerve.io/router-replica"
COMPONENT_LABEL = "app.kubernetes.io/component"
# the Secrets with random values the chart makes (helm keeps them across
# upgrades); `manifests render` prints them only when asked (--component secrets)
GENERATED = "toposerve.io/generated"
# objects labelled with a part of a component, by the component they belong to
PART_OF: dict[str, Component] = {"router-redis": "router"}
# each component's values section (the secrets have none)
SECTIONS: dict[Component, str] = {
    "gpu-driver": "gpu_driver", "net-driver": "net_driver", "admission-policy": "admission_policy",
    "device-classes": "device_classes", "extender": "extender", "scheduler": "scheduler",
    "router": "router"}


class RenderError(ValueError):
    """The chart produced something that is not a valid object list (a bug
    in a template, reported with what was wrong), or helm failed."""


@dataclass(frozen=True)
class Names:
    """Every object name, in one place: the values' prefix and a suffix each."""

    gpu_driver: str
    net_driver: str
    slice_policy: str
    extender: str
    scheduler: str
    kubeconfig: str
    router: str
    router_redis: str
    router_keys: str
    router_redis_auth: str
    extender_key: str
    pod_policy: str

    @classmethod
    def of(cls, prefix: str) -> Names:
        suffixes = {"gpu_driver": "gpu-driver", "net_driver": "net-driver",
                    "slice_policy": "resourceslices-own-node", "extender": "extender",
                    "scheduler": "scheduler", "kubeconfig": "kubeconfig", "router": "router",
                    "router_redis": "router-redis", "router_keys": "router-keys",
                    "router_redis_auth": "router-redis-auth", "extender_key": "extender-key",
                    "pod_policy": "pod-writes"}
        return cls(**{k: f"{prefix}-{v}" for k, v in suffixes.items()})


def system_namespace(values: InstallValues) -> str:
    """Where ``manifests render`` puts the drivers, extender and scheduler."""
    return values.namespace or DEFAULT_NAMESPACE


def router_namespace(values: InstallValues) -> str:
    return values.router.namespace or system_namespace(values)


def _key(obj: Mapping[str, Any]) -> tuple[str, str, str, str]:
    meta = obj.get("metadata") or {}
    return (str(obj.get("apiVersion")), str(obj.get("kind")), str(meta.get("namespace", "")),
            str(meta.get("name")))


def _parse(text: str, source: str) -> list[dict[str, Any]]:
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as err:
        raise RenderError(f"{source}: rendered text is not YAML: {err}") from None
    for d in docs:
        if not (isinstance(d, dict) and d.get("apiVersion") and d.get("kind")
                and isinstance(d.get("metadata"), dict) and d["metadata"].get("name")):
            raise RenderError(f"{source}: a document without apiVersion, kind and "
                              f"metadata.name: {str(d)[:120]}")
    return docs


def _check_configs(objects: Sequence[Mapping[str, Any]]) -> None:
    """The embedded router and extender configs, read as their commands
    read them: a values combination the chart cannot express fails here,
    not in a crash-looping pod."""
    models: dict[str, type[BaseModel]] = {"router": RouterConfig, "extender": ExtenderConfig}
    # files the install mounts into the pod, which are not here to read
    mounted = {"extender": ("decisionKeyFile",)}
    for obj in objects:
        component = (obj["metadata"].get("labels") or {}).get(COMPONENT_LABEL)
        if obj["kind"] != "ConfigMap" or component not in models:
            continue
        for key, text in (obj.get("data") or {}).items():
            try:
                doc = yaml.safe_load(text)
                for field in mounted.get(component, ()):
                    doc.pop(field, None)
                models[component].model_validate(doc)
            except (yaml.YAMLError, ValidationError, AttributeError) as err:
                first = str(err).splitlines()[:3]
                raise RenderError(f"the {component} config {obj['metadata']['name']}/{key} "
                                  f"is not valid: {' '.join(first)}") from None


def selected(values: InstallValues, only: Iterable[Component] = ()) -> list[Component]:
    """The components to render: those asked for (in their canonical order),
    or every enabled one."""
    asked = set(only)
    return [c for c in COMPONENTS if c in asked] if asked else values.enabled()


def _component(obj: Mapping[str, Any]) -> str | None:
    if (obj["metadata"].get("annotations") or {}).get(GENERATED) == "true":
        return "secrets"
    label = (obj["metadata"].get("labels") or {}).get(COMPONENT_LABEL)
    return PART_OF.get(label or "", label)


def namespace_object(name: str) -> dict[str, Any]:
    """The drivers' namespace for ``kubectl apply`` (``helm install
    --create-namespace`` makes it for a release): its pods mount host paths,
    which pod security calls privileged."""
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": {
                "app.kubernetes.io/part-of": "toposerve",
                "pod-security.kubernetes.io/enforce": "privileged"}}}


def render_objects(values: InstallValues, only: Iterable[Component] = (),
                   helm: Path | None = None) -> list[dict[str, Any]]:
    """The objects of the selected components, each namespace before what
    it holds: the chart's, filtered by their component label, and (for
    ``kubectl apply``) the drivers' namespace."""
    components = selected(values, only)
    # a component asked for by name is rendered, enabled or not
    on = {SECTIONS[c]: getattr(values, SECTIONS[c]).model_copy(update={"enabled": True})
          for c in components if c in SECTIONS}
    try:
        text = template(values.model_copy(update=on), helm or find_helm())
    except HelmError as err:
        raise RenderError(str(err)) from None
    objects = _parse(text, "the chart")
    _check_configs(objects)
    seen: set[tuple[str, str, str, str]] = set()
    for obj in objects:
        if _key(obj) in seen:
            raise RenderError(f"two objects named {'/'.join(_key(obj))}")
        seen.add(_key(obj))
    want = set(components)
    # what no one component owns (the kubeconfig ConfigMaps, the dashboards)
    # goes with any that runs pods
    shared = bool(want - {"secrets", "device-classes", "admission-policy"})
    keep = [o for o in objects if _component(o) in want
            or (shared and _component(o) not in (*COMPONENTS, *PART_OF))]
    # the Secrets are applied into an install that made its namespace
    namespaces = {str(o["metadata"]["namespace"]) for o in keep if o["metadata"].get(
        "namespace") and _component(o) != "secrets"}
    own = [namespace_object(system_namespace(values))] if system_namespace(
        values) in namespaces else []
    # Namespaces first: kubectl apply creates in the order given
    ordered = sorted(keep, key=lambda o: o["kind"] != "Namespace")
    return own + ordered


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


def render(values: InstallValues, only: Iterable[Component] = (),
           helm: Path | None = None) -> str:
    """Multi-document YAML of the selected components."""
    return to_yaml(render_objects(values, only, helm))
