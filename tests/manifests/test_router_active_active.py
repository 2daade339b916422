"""The router's install with ``router.config.ha.mode: active-active``:
every replica behind the Service (no role label to select), and no Lease
or pod-label RBAC, which nothing then uses; one replica the same."""

from __future__ import annotations

import pytest
import yaml

from tests.manifests.helpers import objects, one

AA = "router.config.ha.mode=active-active"


@pytest.mark.parametrize("sets", [(AA,), ("router.replicas=1",)])
def test_every_replica_serves_behind_the_service(sets: tuple[str, ...]) -> None:
    objs = objects(*sets, only=["router"])
    selector = one(objs, "Service", "toposerve-router")["spec"]["selector"]
    dep = one(objs, "Deployment", "toposerve-router")
    assert selector == dep["spec"]["selector"]["matchLabels"]  # every router pod
    rules = one(objs, "Role", "toposerve-router")["rules"]
    assert not [r for r in rules if {"leases", "pods"} & set(r["resources"])], rules


def test_active_active_config_and_the_pair_as_before() -> None:
    cfg = yaml.safe_load(one(objects(AA, only=["router"]), "ConfigMap",
                             "toposerve-router")["data"]["config.yaml"])
    assert cfg["ha"]["enabled"] and cfg["ha"]["mode"] == "active-active"
    # the default: a hot-standby pair, the Service on the leader
    objs = objects(only=["router"])
    assert one(objs, "Service", "toposerve-router")["spec"]["selector"][
        "toposerve.io/router-role"] == "leader"
    assert any("leases" in r["resources"] for r in one(objs, "Role", "toposerve-router")["rules"])
