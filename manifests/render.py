"""Values in, Kubernetes objects out: each component is a jinja2 template
(``manifests/templates``) rendered with StrictUndefined, parsed back as YAML
and checked, so what is printed is valid YAML and the same for the same
values, byte for byte."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jinja2
import yaml
from pydantic import BaseModel

from toposerve.manifests.values import COMPONENTS, Component, InstallValues
from toposerve.router.config import RouterConfig
from toposerve.router.ha.pod_label import ROLE_LABEL
from toposerve.scheduler_ext.config import ExtenderConfig
from toposerve.scheduler_ext.scheduler_config import scheduler_config
from toposerve.scheduler_ext.state.facts import PLACEMENT_ANNOTATION, SIZE_SEEN_ANNOTATION

GPU_DRIVER = "gpu.toposerve.io"
NET_DRIVER = "net.toposerve.io"
# where every pod finds the rendered kubeconfig and its own service-account token
KUBECONFIG_DIR = "/etc/toposerve/kubeconfig"
KUBECONFIG_FILE = f"{KUBECONFIG_DIR}/kubeconfig"
SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# where the router finds the Redis password and CA, the extender its decision key
REDIS_AUTH_DIR = "/etc/toposerve/redis-auth"
REDIS_TLS_DIR = "/etc/toposerve/redis-tls"
EXTENDER_KEY_DIR = "/etc/toposerve/extender-key"
# on the host network, which of the router's per-replica Deployments a pod is of
REPLICA_LABEL = "toposerve.io/router-replica"


def liveness_script(driver: str) -> str:
    """A driver's exec liveness probe: the framework's own probe (GetInfo, then
    an empty NodePrepareResources) on the registration socket its pod UID
    names; sys.exit(message) fails the probe and says why."""
    return ("import os, sys; from pathlib import Path; "
            "from toposerve.dra_driver.kubeletplugin.liveness import probe; "
            "from toposerve.dra_driver.kubeletplugin.sockets import PluginPaths; "
            f"p = PluginPaths({driver!r}, registry_dir=Path(sys.argv[1]), "
            "pod_uid=os.environ['POD_UID']); "
            "sys.exit(probe(p.registration_socket, p.driver))")


TEMPLATES: dict[Component | None, str] = {
    None: "base.yaml.j2",  # namespace and kubeconfig: every namespaced component needs them
    "gpu-driver": "gpu-driver.yaml.j2",
    "net-driver": "net-driver.yaml.j2",
    "admission-policy": "admission-policy.yaml.j2",
    "device-classes": "device-classes.yaml.j2",
    "extender": "extender.yaml.j2",
    "scheduler": "scheduler.yaml.j2",
    "router": "router.yaml.j2",
    "secrets": "secrets.yaml.j2",
}
NAMESPACED: frozenset[Component] = frozenset({"gpu-driver", "net-driver",
                                              "extender", "scheduler", "router"})


class RenderError(ValueError):
    """The templates produced something that is not a valid object list (a bug
    in a template, reported with the template's name)."""


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
    loader=jinja2.PackageLoader("toposerve.manifests", "templates"),
    undefined=jinja2.StrictUndefined,
    autoescape=False,  # YAML, not HTML
    keep_trailing_newline=True,
)
_ENV.filters["q"] = _q
_ENV.filters["sha256"] = _sha256


def extender_config(values: InstallValues) -> ExtenderConfig:
    """The extender's configuration as its pods get it: listening where the
    scheduler calls it (loopback, unless the scheduler is given a URL that
    reaches it from elsewhere)."""
    cfg = values.extender.config
    host = "0.0.0.0" if values.scheduler.extender_url else "127.0.0.1"
    update: dict[str, Any] = {
        "server": cfg.server.model_copy(update={"host": host, "port": values.extender.port})}
    # every replica signs and checks decisions with the one key of its Secret
    update["decision_key_file"] = f"{EXTENDER_KEY_DIR}/key"
    if "accelerators" not in cfg.model_fields_set:
        # claims name the GPU class this install creates
        update["accelerators"] = cfg.accelerators.model_copy(
            update={"device_classes": [values.device_classes.gpu]})
    return cfg.model_copy(update=update)


# RBAC for what the extender writes: annotations on pods, each group's decision on
# one of its pods (unless ``persistDecisions`` is off) and, on a group's waiting
# pods, that its size became known (so the scheduler retries them at once)
EXTENDER_WRITES = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["patch"]}]


def second_scheduler_config(values: InstallValues, url: str) -> dict[str, Any]:
    """The extender's KubeSchedulerConfiguration for a scheduler of its own,
    with its own leader-election lease."""
    s = values.scheduler
    cfg = scheduler_config(url, weight=s.extender_weight, timeout_s=s.extender_timeout_seconds,
                           scheduler_name=s.scheduler_name,
                           kubeconfig=KUBECONFIG_FILE)
    cfg["leaderElection"] = {"leaderElect": True, "resourceNamespace": values.namespace,
                             "resourceName": s.scheduler_name}
    return cfg


def router_redis_url(values: InstallValues) -> str:
    r = values.router.redis
    if r.url is not None:
        return r.url
    if values.router.host_network:  # Redis on the node's loopback, beside the router
        return f"redis://127.0.0.1:{r.port}/0"
    scheme = "rediss" if r.tls_secret else "redis"
    return (f"{scheme}://{Names.of(values.name_prefix).router_redis}.{values.namespace}.svc:"
            f"{r.port}/0")


def router_redis_password_secret(values: InstallValues) -> str | None:
    """The Secret of the Redis password; None when Redis runs without one."""
    r = values.router.redis
    if r.allow_unauthenticated:
        return None
    return r.password_secret or Names.of(values.name_prefix).router_redis_auth


def extender_key_secret(values: InstallValues) -> str:
    return values.extender.decision_key_secret or Names.of(values.name_prefix).extender_key


def generated_secrets(values: InstallValues) -> list[dict[str, str]]:
    """The Secrets ``--component secrets`` makes, each with a fresh random
    value: those the values do not name as existing ones."""
    names = Names.of(values.name_prefix)
    out = []
    r = values.router.redis
    if (values.router.enabled and not r.allow_unauthenticated
            and r.password_secret is None):
        out.append({"name": names.router_redis_auth, "key": "password", "component": "router"})
    if values.extender.enabled and values.extender.decision_key_secret is None:
        out.append({"name": names.extender_key, "key": "key", "component": "extender"})
    return [{**s, "value": base64.b64encode(
        secrets.token_urlsafe(32).encode()).decode()} for s in out]


def router_keys_secret(values: InstallValues) -> str:
    return values.router.api_keys.secret_name or Names.of(values.name_prefix).router_keys


def router_config(values: InstallValues, replica: int = 0) -> dict[str, Any]:
    """The router's configuration as its pods get it: listening on every
    address at the values' port (on the host network: on 127.0.0.1, replica
    ``replica`` at port + replica), a hot-standby pair on a Lease named like
    the Deployment, the Responses store in the install's Redis, keys from
    its Secret, and every client on the mounted kubeconfig."""
    r = values.router
    doc = r.config.model_dump(by_alias=True, mode="json", exclude_none=True)
    doc["server"] = ({**doc["server"], "host": "127.0.0.1", "port": r.port + replica}
                     if r.host_network else {**doc["server"], "host": "0.0.0.0", "port": r.port})
    if "kubernetes" in doc["discovery"]:
        doc["discovery"]["kubernetes"]["kubeconfig"] = KUBECONFIG_FILE
    doc["responses"] = {**doc["responses"], "backend": "redis",
                        "redisUrl": router_redis_url(values),
                        "allowUnauthenticated": r.redis.allow_unauthenticated}
    if router_redis_password_secret(values) is not None:
        doc["responses"]["redisPasswordFile"] = f"{REDIS_AUTH_DIR}/password"
    if r.redis.tls_secret:
        doc["responses"]["redisCaFile"] = f"{REDIS_TLS_DIR}/ca.crt"
    doc["ha"] = {**doc["ha"], "enabled": r.replicas > 1, "shutdownDelaySeconds":
                 r.shutdown_delay_seconds, "lease": {
                     **doc["ha"]["lease"], "name": Names.of(values.name_prefix).router,
                     "namespace": values.namespace, "kubeconfig": KUBECONFIG_FILE}}
    if r.api_keys.enabled:
        tenants = doc.setdefault("flowControl", {}).setdefault("tenants", {})
        tenants["keys"] = {"secret": {"namespace": values.namespace,
                                      "name": router_keys_secret(values),
                                      "kubeconfig": KUBECONFIG_FILE}}
    # checked as the router will read it, then written without the defaults
    return RouterConfig.model_validate(doc).model_dump(by_alias=True, mode="json",
                                                       exclude_none=True, exclude_defaults=True)


def router_deployments(values: InstallValues) -> list[dict[str, Any]]:
    """The router's Deployments: one of ``replicas`` pods; on the host
    network one per replica instead, each with its own port and config."""
    r, name = values.router, Names.of(values.name_prefix).router
    if not r.host_network:
        return [{"name": name, "replicas": r.replicas, "replica": {}, "port": r.port,
                 "config_key": "config.yaml", "config": _yaml(router_config(values))}]
    return [{"name": f"{name}-{i}", "replicas": 1, "replica": {REPLICA_LABEL: str(i)},
             "port": r.port + i, "config_key": f"config-{i}.yaml",
             "config": _yaml(router_config(values, i))} for i in range(r.replicas)]


def _yaml(doc: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(doc), sort_keys=False)


def _context(values: InstallValues) -> dict[str, Any]:
    names = Names.of(values.name_prefix)
    restricted = [service_account_user(values.namespace, names.gpu_driver)]
    router_user = service_account_user(values.namespace, names.router)
    extender_user = service_account_user(values.namespace, names.extender)
    if values.admission_policy.include_net_driver or values.net_driver.enabled:
        restricted.append(service_account_user(values.namespace, names.net_driver))

    def labels(component: str) -> dict[str, str]:
        return {**selector(component), "app.kubernetes.io/part-of": "toposerve",
                "app.kubernetes.io/version": values.image.tag}

    def selector(component: str) -> dict[str, str]:
        return {"app.kubernetes.io/name": "toposerve",
                "app.kubernetes.io/instance": values.name_prefix,
                "app.kubernetes.io/component": component}

    ext = extender_config(values)
    url = values.scheduler.extender_url or f"http://127.0.0.1:{values.extender.port}"
    return {
        "v": values, "names": names, "labels": labels, "selector": selector,
        "gpu_driver": GPU_DRIVER, "net_driver": NET_DRIVER, "liveness_script": liveness_script,
        "restricted_users": restricted,
        # what each service account may change on a pod: nothing else
        "role_label": ROLE_LABEL,
        "extender_annotations": [PLACEMENT_ANNOTATION, SIZE_SEEN_ANNOTATION],
        "router_user": router_user, "extender_user": extender_user,
        "redis_auth_dir": REDIS_AUTH_DIR, "redis_tls_dir": REDIS_TLS_DIR,
        "extender_key_dir": EXTENDER_KEY_DIR,
        "redis_password_secret": router_redis_password_secret(values),
        "extender_key_secret": extender_key_secret(values),
        "generated_secrets": lambda: generated_secrets(values),
        "kubeconfig_dir": KUBECONFIG_DIR, "kubeconfig_file": KUBECONFIG_FILE,
        "sa_dir": SA_DIR,
        "extender_config": yaml.safe_dump(
            ext.model_dump(by_alias=True, mode="json", exclude_none=True), sort_keys=False),
        "scheduler_config": yaml.safe_dump(second_scheduler_config(values, url),
                                           sort_keys=False),
        "extender_write_rules": EXTENDER_WRITES,
        "router_deployments": lambda: router_deployments(values),
        "router_redis_url": router_redis_url(values),
        "router_keys_secret": router_keys_secret(values),
        "router_models": values.router.config.discovery.kubernetes,
        "router_leader": {**selector("router"), ROLE_LABEL: "leader"},
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
