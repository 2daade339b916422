"""The router's role and revision of pods as kubernetes-sigs/lws (060ab4d)
leaves them: a DisaggregatedSet's pods carry its revision, their
LeaderWorkerSet's template hash and their StatefulSet's revision; the set's
revision is the one that spans its roles, so a request's prefill and decode
halves pair across them."""

from __future__ import annotations

import pytest

from harness.extender_objects import disaggregated_pods, lws_pods
from toposerve.localcluster.scale import controllers as ctl
from toposerve.router.config import KubernetesDiscovery
from toposerve.router.pool.kubernetes import label_target, pod_view
from toposerve.router.pool.revisions import revision_of
from toposerve.topology.workloads import DS_REVISION, LLMD_ROLE, LWS_REVISION

DISCOVERY = KubernetesDiscovery.model_validate({"labelSelector": "app=llm"})


@pytest.mark.unit
def test_a_disaggregated_set_revision_spans_its_roles() -> None:
    _, pods = disaggregated_pods("pd", 0, {"prefill": (1, 1), "decode": (1, 1)},
                                 claim_template="t", revision="7f9b8c1d")
    labels = [p["metadata"]["labels"] for p in pods]
    assert all({DS_REVISION, LWS_REVISION, "controller-revision-hash"} <= ls.keys()
               for ls in labels)
    assert {revision_of(ls) for ls in labels} == {"7f9b8c1d"}
    roles = sorted(pod_view(p, DISCOVERY, label_target(DISCOVERY)).role or "" for p in pods)
    assert roles == ["decode", "prefill"]


@pytest.mark.unit
def test_a_leaderworkerset_pod_has_its_template_revision() -> None:
    lws = ctl.leader_worker_set("wide", 1, 2, template_labels={"app": "llm", LLMD_ROLE: "decode"})
    pods = lws_pods("wide", 0, 2, claim_template="t", revision="5d8f9c7b6", lws=lws)
    assert {revision_of(p["metadata"]["labels"]) for p in pods} == {"5d8f9c7b6"}
