"""The LeaderWorkerSet and DisaggregatedSet CRDs the tests and scale runs
install (upstream's schemas, localcluster/scale/crds/lws.yaml) on the real
apiserver: each API serves the versions upstream does, and objects of each
served version, as toposerve.localcluster.scale.controllers writes them, pass a
server-side dry run with strict field validation, defaulted as upstream's
schema defaults them; what upstream's schema refuses is refused."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.conftest import Cluster
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster.scale import controllers as ctl
from toposerve.localcluster.scale.runner import install_crds

RACK = "topology.toposerve.io/rack"
STRICT = [("dryRun", "All"), ("fieldValidation", "Strict")]


def objects() -> dict[str, dict[str, Any]]:
    """One object of each kind, by kind."""
    ds = ctl.disaggregated_set("pd", {"prefill": (2, 1), "decode": (1, 2)}, namespace="default")
    return {"LeaderWorkerSet": ctl.leader_worker_set(
                "wide", 2, 5, exclusive=RACK, subgroup=(2, "LeaderExcluded"),
                template_labels={"app": "llm"}),
            "DisaggregatedSet": ds,
            "DisaggregatedSetRoleScaler": {
                "apiVersion": ctl.DS_API, "kind": "DisaggregatedSetRoleScaler",
                "metadata": {"name": "pd-decode"}, "spec": {"replicas": 3}}}


def dry_run(rest: JsonApi, crd: dict[str, Any], version: str, obj: dict[str, Any]) -> Any:
    spec = crd["spec"]
    path = f"/apis/{spec['group']}/{version}/namespaces/default/{spec['names']['plural']}"
    body = {**obj, "apiVersion": f"{spec['group']}/{version}"}
    return rest.request("POST", path, STRICT, body=body)


@pytest.mark.cluster
def test_every_served_version_validates_upstream_shaped_objects(cluster: Cluster) -> None:
    rest = JsonApi(cluster.api)
    install_crds(rest)
    by_kind = objects()
    assert {c["spec"]["names"]["kind"] for c in ctl.CRDS} == by_kind.keys()
    for crd in ctl.CRDS:
        group = crd["spec"]["group"]
        served = [v["name"] for v in crd["spec"]["versions"] if v["served"]]
        assert served == ["v1"]  # upstream at 060ab4d serves (and stores) v1 only
        discovered = rest.request("GET", f"/apis/{group}")
        assert [v["version"] for v in discovered["versions"]] == served
        for version in served:
            got = dry_run(rest, crd, version, by_kind[crd["spec"]["names"]["kind"]])
            assert got["metadata"].get("uid")  # a dry run answers as if created
    # the LWS as its controller reads it: defaulted as upstream's schema defaults it
    lws = dry_run(rest, ctl.CRDS[0], "v1", by_kind["LeaderWorkerSet"])
    lwt = lws["spec"]["leaderWorkerTemplate"]
    assert lwt["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lwt["subGroupPolicy"] == {"subGroupSize": 2, "subGroupPolicyType": "LeaderExcluded"}
    assert lwt["workerTemplate"]["metadata"]["labels"] == {"app": "llm"}
    ds = dry_run(rest, ctl.CRDS[1], "v1", by_kind["DisaggregatedSet"])
    assert ds["spec"]["slices"] == 1
    assert [r["spec"]["leaderWorkerTemplate"]["size"] for r in ds["spec"]["roles"]] == [1, 2]


def _refused(rest: JsonApi, kind: str, obj: dict[str, Any]) -> str:
    crd = next(c for c in ctl.CRDS if c["spec"]["names"]["kind"] == kind)
    with pytest.raises(ApiError) as err:
        dry_run(rest, crd, "v1", obj)
    assert err.value.status in (400, 422), err.value
    return str(err.value)


@pytest.mark.cluster
def test_what_upstreams_schema_refuses_is_refused(cluster: Cluster) -> None:
    rest = JsonApi(cluster.api)
    install_crds(rest)
    ds = objects()["DisaggregatedSet"]
    one_role = copy.deepcopy(ds)
    one_role["spec"]["roles"] = one_role["spec"]["roles"][:1]
    assert "roles" in _refused(rest, "DisaggregatedSet", one_role)  # minItems 2
    mixed = copy.deepcopy(ds)
    mixed["spec"]["roles"][0]["spec"]["replicas"] = 0
    assert "replicas must be zero" in _refused(rest, "DisaggregatedSet", mixed)  # CEL rule
    flat = copy.deepcopy(ds)  # the stand-in's old shape: LWS fields on the role itself
    flat["spec"]["roles"][0]["replicas"] = 1
    assert "replicas" in _refused(rest, "DisaggregatedSet", flat)
    lws = copy.deepcopy(objects()["LeaderWorkerSet"])
    lws["spec"]["startupPolicy"] = "Eventually"
    assert "startupPolicy" in _refused(rest, "LeaderWorkerSet", lws)
