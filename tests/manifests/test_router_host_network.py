"""``router.hostNetwork``: the router pair and its Redis on the node's
loopback (the local cluster's real node, whose pod network the host cannot
reach): a Deployment per replica on a port of its own, Redis bound to
127.0.0.1 and dialled there, no Service or NetworkPolicy for Redis."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from tests.manifests.helpers import Obj, objects, one
from toposerve.manifests.render import REPLICA_LABEL
from toposerve.manifests.values import load_values
from toposerve.topology.config_file import ConfigError

HOST = ("router.hostNetwork=true", "router.port=18080", "router.redis.port=16379")


def _container(obj: Obj) -> dict[str, Any]:
    c: dict[str, Any] = obj["spec"]["template"]["spec"]["containers"][0]
    return c


def test_each_replica_its_own_deployment_port_and_config() -> None:
    objs = objects(*HOST, only=["router"])
    data = one(objs, "ConfigMap", "toposerve-router")["data"]
    assert sorted(data) == ["config-0.yaml", "config-1.yaml"]
    for i in (0, 1):
        dep = one(objs, "Deployment", f"toposerve-router-{i}")
        pod = dep["spec"]["template"]["spec"]
        assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"] == {"type": "Recreate"}
        assert dep["spec"]["selector"]["matchLabels"][REPLICA_LABEL] == str(i)
        assert pod["hostNetwork"] is True and pod["dnsPolicy"] == "Default"
        c = _container(dep)
        assert f"--config=/etc/toposerve/router/config-{i}.yaml" in c["command"]
        assert c["ports"][0]["containerPort"] == 18080 + i
        cfg = yaml.safe_load(data[f"config-{i}.yaml"])
        # 127.0.0.1, the default, is left out of the rendered config
        assert cfg.get("server", {}).get("host", "127.0.0.1") == "127.0.0.1"
        assert cfg.get("server", {}).get("port", 8080) == 18080 + i
        assert cfg["responses"]["redisUrl"] == "redis://127.0.0.1:16379/0"
        assert cfg["responses"]["redisPasswordFile"]
    assert not [o for o in objs if o["kind"] == "Deployment"
                and o["metadata"]["name"] == "toposerve-router"]


def test_redis_on_loopback_with_the_password() -> None:
    objs = objects(*HOST, only=["router"])
    redis = one(objs, "Deployment", "toposerve-router-redis")
    assert redis["spec"]["template"]["spec"]["hostNetwork"] is True
    args = _container(redis)["args"]
    assert args[args.index("--bind") + 1] == "127.0.0.1"
    assert args[args.index("--port") + 1] == "16379"
    assert "--requirepass" in args
    assert _container(redis)["ports"][0]["containerPort"] == 16379
    # neither applies to a pod on the node's network
    assert not [o for o in objs if o["kind"] in ("NetworkPolicy", "Service")
                and o["metadata"]["name"] == "toposerve-router-redis"]


def test_redis_tls_needs_a_url_on_the_host_network() -> None:
    with pytest.raises(ConfigError, match="hostNetwork"):
        load_values(None, ["apiServer.host=127.0.0.1", *HOST, "router.redis.tlsSecret=tls"])
