"""Rendering with test values, and lookups in the rendered objects."""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from typing import Any

from toposerve.main import build_parser
from toposerve.manifests.render import render_objects
from toposerve.manifests.values import Component, load_values

Obj = dict[str, Any]


# what a pod gets from the values' API server address: its own kubeconfig
LOCAL_API = "apiServer.host=127.0.0.1"
# the router's rules in the model pods' namespace for discovery's claimDevices
CLAIMS_RULES = (
    {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]})


def objects(*sets: str, only: Sequence[Component] = ()) -> list[Obj]:
    """The chart rendered with the defaults and ``sets`` (a real cluster's
    install: in-cluster API access; LOCAL_API for a kubeconfig of an address):
    a copy each call, of one helm run for each distinct ask."""
    return copy.deepcopy(_rendered(tuple(sets), tuple(only)))


@functools.cache
def _rendered(sets: tuple[str, ...], only: tuple[Component, ...]) -> list[Obj]:
    return render_objects(load_values(None, list(sets)), only)


def one(objs: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objs if o["kind"] == kind
             and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"{len(found)} objects of kind {kind} named {name}"
    return found[0]


def slice_policy(*sets: str) -> Obj:
    """The own-node ResourceSlice policy (the admission-policy component has
    the pod-writes policy too)."""
    (vap,) = [o for o in objects(*sets, only=["admission-policy"])
              if o["kind"] == "ValidatingAdmissionPolicy"
              and o["metadata"]["name"].endswith("-resourceslices-own-node")]
    return vap


def cli(argv: list[str]) -> int:
    """``toposerve ARGV`` in this process, without ``main``'s logging setup
    (it would bind the logs to this test's captured, soon closed, stderr)."""
    args = build_parser().parse_args(argv)
    rc: int = args.handler(args)
    return rc
