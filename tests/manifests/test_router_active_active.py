"""The router's install is active-active by default: every replica behind
the Service (no role label to select), and no Lease or pod-label RBAC,
which nothing then uses; one replica the same. ``router.config.ha.mode:
hot-standby`` (the endpoint picker's default) is the pair as before."""

from __future__ import annotations

import pytest
import yaml

from tests.manifests.helpers import objects, one

HOT_STANDBY = "router.config.ha.mode=hot-standby"


@pytest.mark.parametrize("sets", [(), ("router.config.ha.mode=active-active",),
                                  ("router.replicas=1",)])
def test_every_replica_serves_behind_the_service(sets: tuple[str, ...]) -> None:
    objs = objects(*sets, only=["router"])
    selector = one(objs, "Service", "toposerve-router")["spec"]["selector"]
    dep = one(objs, "Deployment", "toposerve-router")
    assert selector == dep["spec"]["selector"]["matchLabels"]  # every router pod
    rules = one(objs, "Role", "toposerve-router")["rules"]
    assert not [r for r in rules if {"leases", "pods"} & set(r["resources"])], rules
    cfg = yaml.safe_load(one(objs, "ConfigMap", "toposerve-router")["data"]["config.yaml"])
    assert cfg["ha"]["mode"] == "active-active"
    assert cfg["ha"]["enabled"] == (dep["spec"]["replicas"] > 1)


@pytest.mark.parametrize("sets", [(HOT_STANDBY,), ("router.mode=endpoint-picker",)])
def test_a_hot_standby_pair_when_asked_and_for_a_gateway(sets: tuple[str, ...]) -> None:
    objs = objects(*sets, only=["router"])
    cfg = yaml.safe_load(one(objs, "ConfigMap", "toposerve-router")["data"]["config.yaml"])
    assert cfg["ha"]["enabled"] and cfg["ha"]["mode"] == "hot-standby"
    assert one(objs, "Service", "toposerve-router")["spec"]["selector"][
        "toposerve.io/router-role"] == "leader"
    assert any("leases" in r["resources"] for r in one(objs, "Role", "toposerve-router")["rules"])
