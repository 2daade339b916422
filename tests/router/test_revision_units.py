"""Revision routing as pure decisions: which label names the revision, how
traffic splits between revisions, that sessions keep theirs, and that a
split request's two halves stay in one revision."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from toposerve.router.config import RouterConfig
from toposerve.router.disaggregation.pairing import Disaggregation
from toposerve.router.pool.endpoints import Endpoint, LoadSample
from toposerve.router.pool.revisions import (
    Revisions,
    ready_capacity,
    rendezvous,
    revision_of,
    split_weights,
)
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.filters import RevisionFilter
from toposerve.router.state import RouterState


def ep(url: str, rev: str | None, role: str | None = None, healthy: bool = True) -> Endpoint:
    e = Endpoint(url=f"http://{url}:8000", role=role, revision=rev, healthy=healthy)
    e.load = LoadSample(at=1e18)  # never stale
    return e


def test_revision_label_order() -> None:
    ds, lws = "disaggregatedset.x-k8s.io/revision", "leaderworkerset.sigs.k8s.io/" \
        "template-revision-hash"
    labels = {"controller-revision-hash": "c", "toposerve.io/revision": "t", lws: "l", ds: "d"}
    assert revision_of(labels) == "d"
    del labels[ds]
    assert revision_of(labels) == "l"
    del labels[lws]
    assert revision_of(labels) == "t"
    del labels["toposerve.io/revision"]
    assert revision_of(labels) == "c"
    assert revision_of({"app.kubernetes.io/version": "v9"}) is None
    assert revision_of({"app.kubernetes.io/version": "v9", lws: "l"},
                       "app.kubernetes.io/version") == "v9"


def test_capacity_counts_only_endpoints_that_answer() -> None:
    eps = [ep("a", "1"), ep("b", "1", healthy=False), ep("c", "2", role="prefill"),
           ep("d", "2", role="decode"), ep("e", None)]
    eps[0].draining = True
    assert ready_capacity(eps) == {"2": 1, "": 1}


def test_split_by_capacity_then_by_weights() -> None:
    assert split_weights({"1": 3, "2": 1}, {}) == {"1": 3.0, "2": 1.0}
    assert split_weights({"1": 3, "2": 1}, {"2": 9.0}) == {"2": 9.0}
    # the named revision has nothing ready: capacity decides
    assert split_weights({"1": 3, "2": 0}, {"2": 9.0}) == {"1": 3.0}
    assert split_weights({"1": 0}, {}) == {}


def test_rendezvous_follows_the_weights_and_moves_one_way() -> None:
    keys = [f"s{i}" for i in range(4000)]
    before = {k: rendezvous(k, {"1": 3.0, "2": 1.0}) for k in keys}
    share = Counter(before.values())
    assert abs(share["2"] / len(keys) - 0.25) < 0.03
    after = {k: rendezvous(k, {"1": 1.0, "2": 3.0}) for k in keys}
    assert abs(Counter(after.values())["2"] / len(keys) - 0.75) < 0.03
    # as revision 2 grows, sessions only move 1 -> 2
    assert not [k for k in keys if before[k] == "2" and after[k] == "1"]


def test_a_session_keeps_its_revision_until_it_is_gone() -> None:
    r = Revisions(rng=random.Random(1))
    first = r.choose("s", {"1": 1, "2": 1})
    assert first is not None
    other = "2" if first == "1" else "1"
    for _ in range(20):  # even when its revision shrinks to one endpoint of many
        assert r.choose("s", {first: 1, other: 50}) == first
    assert r.choose("s", {first: 0, other: 50}) == other
    assert r.choose("s", {first: 5, other: 50}) == other  # and does not flap back
    assert r.choose(None, {}) is None


def test_filter_keeps_one_revision_per_request() -> None:
    f = RevisionFilter(Revisions(rng=random.Random(2)))
    eps = [ep("a", "1"), ep("b", "1"), ep("c", "2")]
    ctx = RequestContext(model=None, prompt=b"x", session="abc")
    got = f.filter(ctx, eps)
    assert {e.revision for e in got} == {ctx.revision}
    assert f.filter(ctx, eps) == got  # asked again (after admission), the same
    # one revision only: nothing filtered, nothing chosen
    same = RequestContext(model=None, prompt=b"x")
    assert f.filter(same, eps[:2]) == eps[:2] and same.revision is None
    # the revision loses its last endpoint while the request waits: chosen again
    left = [e for e in eps if e.revision != ctx.revision]
    assert f.filter(ctx, left) == left


@pytest.mark.parametrize("seed", range(5))
def test_split_requests_pair_inside_one_revision(seed: int) -> None:
    cfg = RouterConfig.model_validate({
        "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
        "discovery": {"static": [{"url": "http://x:1"}]}, "disaggregation": {"enabled": True}})
    state = RouterState(cfg)
    for i, (role, rev) in enumerate([("prefill", "1"), ("decode", "1"), ("prefill", "2"),
                                     ("decode", "2"), ("decode", "2")]):
        state.pool.upsert(ep(f"127.0.0.{i + 1}", rev, role))
    pd = Disaggregation(state, cfg, None, Revisions(rng=random.Random(seed)))
    seen = set()
    for n in range(40):
        ctx = RequestContext(model=None, prompt=f"prompt {n}".encode(), session=f"s{n}")
        pre = pd.prefill.schedule(ctx).ranked
        dec = pd.pick_decode(ctx, pre[0]).ranked
        assert {e.revision for e in pre} == {e.revision for e in dec} == {ctx.revision}
        seen.add(ctx.revision)
    assert seen == {"1", "2"}
