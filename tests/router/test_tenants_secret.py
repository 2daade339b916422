"""API keys from a Kubernetes Secret on the session cluster: the router
watches it, so a key added or taken away applies without a restart, and a
deleted Secret leaves no valid key."""

from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from kubernetes import client

from harness.procs import MODEL, Procs
from harness.waiting import wait_for
from tests.conftest import Cluster
from toposerve.localcluster.clusters import kubeconfig_path

pytestmark = pytest.mark.cluster


def _data(tenants: dict[str, list[str]]) -> dict[str, str]:
    return {t: base64.b64encode("\n".join(keys).encode()).decode()
            for t, keys in tenants.items()}


def _status(url: str, key: str) -> int:
    return httpx.post(url + "/v1/completions", headers={"Authorization": f"Bearer {key}"},
                      timeout=30, json={"model": MODEL, "prompt": "hi", "max_tokens": 1}
                      ).status_code


@pytest.fixture
def secret(cluster: Cluster) -> Iterator[str]:
    core: Any = client.CoreV1Api(cluster.api)
    name = f"router-keys-{uuid.uuid4().hex[:8]}"
    core.create_namespaced_secret("default", client.V1Secret(
        metadata=client.V1ObjectMeta(name=name), data=_data({"team-a": ["sk-a"]})))
    try:
        yield name
    finally:
        try:
            core.delete_namespaced_secret(name, "default")
        except client.exceptions.ApiException as err:
            if err.status != 404:
                raise


def test_keys_follow_the_secret(cluster: Cluster, procs: Procs, secret: str) -> None:
    core: Any = client.CoreV1Api(cluster.api)
    sim = procs.sim()
    router = procs.router({"flowControl": {"tenants": {"keys": {"secret": {
        "namespace": "default", "name": secret,
        "kubeconfig": str(kubeconfig_path(cluster.name))}}}}}, endpoints=[sim.url])
    wait_for("the secret's key", lambda: _status(router.url, "sk-a") == 200, timeout=20)
    assert _status(router.url, "sk-b") == 401
    core.patch_namespaced_secret(secret, "default", {"data": _data(
        {"team-a": ["sk-a"], "team-b": ["sk-b1", "sk-b"]})})
    wait_for("the added key", lambda: _status(router.url, "sk-b") == 200, timeout=20)
    core.delete_namespaced_secret(secret, "default")
    wait_for("no key after the secret is gone",
             lambda: _status(router.url, "sk-a") == 401, timeout=20)
