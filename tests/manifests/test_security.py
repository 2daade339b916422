"""What the install lets in (docs/security.md), as rendered: Redis behind a
password from a Secret, optional TLS and a NetworkPolicy that admits only
the router; pod patches granted only where their feature is on and bounded
by the pod-writes admission policy; the extender's decision key from a
Secret shared by its replicas; Secrets with random values only when asked."""

from __future__ import annotations

import base64
from typing import Any

import yaml

from tests.manifests.helpers import Obj, objects, one
from toposerve.manifests.render import render, render_objects
from toposerve.manifests.values import load_values


def _pod(obj: Obj) -> dict[str, Any]:
    pod: dict[str, Any] = obj["spec"]["template"]["spec"]
    return pod


def _router_config(objs: list[Obj]) -> dict[str, Any]:
    cfg: dict[str, Any] = yaml.safe_load(
        one(objs, "ConfigMap", "toposerve-router")["data"]["config.yaml"])
    return cfg


def test_redis_requires_the_password_the_router_mounts() -> None:
    objs = objects(only=["router"])
    redis = _pod(one(objs, "Deployment", "toposerve-router-redis"))["containers"][0]
    args = redis["args"]
    assert args[args.index("--requirepass") + 1] == "$(REDIS_PASSWORD)"
    assert redis["env"] == [{"name": "REDIS_PASSWORD", "valueFrom": {"secretKeyRef": {
        "name": "toposerve-router-redis-auth", "key": "password"}}}]
    router = _pod(one(objs, "Deployment", "toposerve-router"))
    vol = next(v for v in router["volumes"] if v["name"] == "redis-auth")
    assert vol["secret"]["secretName"] == "toposerve-router-redis-auth"
    mount = next(m for m in router["containers"][0]["volumeMounts"]
                 if m["name"] == "redis-auth")
    responses = _router_config(objs)["responses"]
    assert responses["redisPasswordFile"] == mount["mountPath"] + "/password"
    assert "allowUnauthenticated" not in responses  # false: the default, written out not
    assert responses["redisUrl"].startswith("redis://toposerve-router-redis.")
    # the password itself is in no rendered object: only --component secrets makes it
    assert not [o for o in objs if o["kind"] == "Secret"
                and o["metadata"]["name"] == "toposerve-router-redis-auth"]


def test_redis_admits_only_the_routers_pods() -> None:
    objs = objects(only=["router"])
    pol = one(objs, "NetworkPolicy", "toposerve-router-redis")
    redis = one(objs, "Deployment", "toposerve-router-redis")
    router = one(objs, "Deployment", "toposerve-router")
    assert pol["spec"]["podSelector"]["matchLabels"] == redis["spec"]["selector"]["matchLabels"]
    assert pol["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = pol["spec"]["ingress"]
    assert rule["from"] == [{"podSelector": {
        "matchLabels": router["spec"]["selector"]["matchLabels"]}}]
    assert rule["ports"] == [{"port": "redis", "protocol": "TCP"}]


def test_redis_password_secret_and_unauthenticated_are_explicit() -> None:
    objs = objects("router.redis.passwordSecret=mine", only=["router"])
    redis = _pod(one(objs, "Deployment", "toposerve-router-redis"))["containers"][0]
    assert redis["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "mine"
    assert [s["metadata"]["name"] for s in objects(
        "router.redis.passwordSecret=mine", only=["secrets"])] == ["toposerve-extender-key"]
    objs = objects("router.redis.allowUnauthenticated=true", only=["router"])
    redis = _pod(one(objs, "Deployment", "toposerve-router-redis"))["containers"][0]
    assert "--requirepass" not in redis["args"] and "env" not in redis
    responses = _router_config(objs)["responses"]
    assert responses["allowUnauthenticated"] is True and "redisPasswordFile" not in responses
    assert "redis-auth" not in {v["name"] for v in _pod(
        one(objs, "Deployment", "toposerve-router"))["volumes"]}
    one(objs, "NetworkPolicy")  # still only the router's pods


def test_redis_tls_option() -> None:
    objs = objects("router.redis.tlsSecret=redis-tls", only=["router"])
    redis = _pod(one(objs, "Deployment", "toposerve-router-redis"))
    args = redis["containers"][0]["args"]
    assert args[args.index("--port") + 1] == "0"  # no plain-text port
    assert args[args.index("--tls-port") + 1] == "6379"
    assert redis["volumes"] == [{"name": "tls", "secret": {"secretName": "redis-tls",
                                                           "defaultMode": 0o440}}]
    responses = _router_config(objs)["responses"]
    assert responses["redisUrl"].startswith("rediss://toposerve-router-redis.toposerve-router"
                                            ".svc:")
    router = _pod(one(objs, "Deployment", "toposerve-router"))
    vol = next(v for v in router["volumes"] if v["name"] == "redis-tls")
    mount = next(m for m in router["containers"][0]["volumeMounts"] if m["name"] == "redis-tls")
    assert vol["secret"]["items"] == [{"key": "ca.crt", "path": "ca.crt"}]
    assert responses["redisCaFile"] == mount["mountPath"] + "/ca.crt"


def _pod_rules(objs: list[Obj], kind: str) -> list[dict[str, Any]]:
    return [r for r in one(objs, kind, "toposerve-router" if kind == "Role"
                           else "toposerve-extender")["rules"]
            if "pods" in r["resources"] and "patch" in r["verbs"]]


def test_router_patches_pods_only_as_a_hot_standby_pair() -> None:
    assert _pod_rules(objects("router.config.ha.mode=hot-standby", only=["router"]),
                      "Role") == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "patch"]}]
    # active-active (the default) labels no pod; nor does a lone replica
    assert _pod_rules(objects(only=["router"]), "Role") == []
    assert _pod_rules(objects("router.replicas=1", only=["router"]), "Role") == []


def test_pod_writes_policy_names_the_router_and_the_extender() -> None:
    objs = objects("namespace=ts", "namePrefix=p", "router.namespace=tr",
                   only=["admission-policy"])
    vap = one(objs, "ValidatingAdmissionPolicy", "p-pod-writes")
    assert vap["spec"]["matchConditions"][0]["expression"] == (
        'request.userInfo.username in ["system:serviceaccount:tr:p-router", '
        '"system:serviceaccount:ts:p-extender"]')
    assert vap["spec"]["matchConstraints"]["resourceRules"][0]["operations"] == ["UPDATE"]
    assert "object.spec == oldObject.spec" in [v["expression"]
                                               for v in vap["spec"]["validations"]]
    binding = one(objs, "ValidatingAdmissionPolicyBinding", "p-pod-writes")
    assert binding["spec"] == {"policyName": "p-pod-writes", "validationActions": ["Deny"]}


def test_extender_replicas_share_the_decision_key_secret() -> None:
    objs = objects("extender.replicas=3", only=["extender"])
    pod = _pod(one(objs, "Deployment"))
    vol = next(v for v in pod["volumes"] if v["name"] == "decision-key")
    assert vol["secret"] == {"secretName": "toposerve-extender-key", "defaultMode": 0o440,
                             "items": [{"key": "key", "path": "key"}]}
    mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "decision-key")
    cfg = yaml.safe_load(one(objs, "ConfigMap", "toposerve-extender")["data"]["config.yaml"])
    assert cfg["decisionKeyFile"] == mount["mountPath"] + "/key"
    named = objects("extender.decisionKeySecret=k", only=["extender"])
    assert next(v for v in _pod(one(named, "Deployment"))["volumes"]
                if v["name"] == "decision-key")["secret"]["secretName"] == "k"


def test_secrets_are_random_and_only_rendered_when_asked() -> None:
    # rendered twice for real (objects() would give one render twice)
    first, second = (render_objects(load_values(), ["secrets"]) for _ in range(2))
    assert [(s["metadata"]["name"], list(s["data"])) for s in first] == [
        ("toposerve-router-redis-auth", ["password"]), ("toposerve-extender-key", ["key"])]
    for a, b in zip(first, second, strict=True):
        value = base64.b64decode(next(iter(a["data"].values())))
        assert len(value) >= 32  # the extender wants 16 bytes at least
        assert a["data"] != b["data"]
    # the install itself stays the same for the same values: no random value in it
    values = load_values(None, ["apiServer.host=127.0.0.1"])
    assert "kind: Secret\nmetadata:\n  name: toposerve-router-redis-auth" not in render(values)
    assert not objects("router.redis.allowUnauthenticated=true", "extender.enabled=false",
                       only=["secrets"])


def test_only_the_scheduler_reaches_the_extender() -> None:
    """It answers placement calls without authentication: on the pod network
    its NetworkPolicy admits the scheduler's pods alone, on its port."""
    objs = objects(only=["extender", "scheduler"])
    policy = one(objs, "NetworkPolicy", "toposerve-extender")
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= \
        _pod_labels(one(objs, "Deployment", "toposerve-extender")).items()
    (rule,) = policy["spec"]["ingress"]
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchLabels"].items() <= \
        _pod_labels(one(objs, "Deployment", "toposerve-scheduler")).items()
    assert "namespaceSelector" not in peer
    assert rule["ports"] == [{"port": 8888, "protocol": "TCP"}]
    # on the node's network a policy cannot tell pods apart: none (127.0.0.1 instead)
    local = objects("extender.hostNetwork=true", "scheduler.hostNetwork=true",
                    only=["extender", "scheduler"])
    assert not [o for o in local if o["kind"] == "NetworkPolicy"]


def _pod_labels(obj: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = obj["spec"]["template"]["metadata"]["labels"]
    return labels
