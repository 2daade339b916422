"""The extender's HTTP edge (filter, prioritize, preempt, and its probes)
given random ExtenderArgs shapes: a valid group's pod with any field
replaced, wrong types, huge group sizes, node lists of any shape, and the
bodies that broke parsers before. Every answer is JSON (a 400 names what
was wrong), never a 5xx or a hang."""

from __future__ import annotations

import asyncio
import copy
import gc
import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from hypothesis import given
from hypothesis import strategies as st

from harness import extender_objects as k
from tests.extender.test_server import NAMES, extender
from tests.fuzz.strategies import FUZZ, NASTY, json_values, methods, queries

VERBS = ["filter", "prioritize", "preempt"]
POD = k.toposerve_pods("fz", 4, claim_template="gpu4", level="rack", uid_prefix="fz")[0]
POD_PATHS = [("metadata",), ("metadata", "labels"), ("metadata", "name"), ("metadata", "uid"),
             ("metadata", "namespace"), ("metadata", "annotations"), ("spec",),
             ("spec", "resourceClaims"), ("spec", "containers"), ("status",)]
LABELS = ["toposerve.io/group", "toposerve.io/group-size", "toposerve.io/topology-level",
          "toposerve.io/preferred-topology-level", "toposerve.io/role"]


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    """The extender's app served on loopback from a thread of its own."""
    ext, _ = extender()
    ext.state.relist("pods", [])
    try:
        ext.warm()  # ready: /ready answers 200, a 503 would be a finding
    finally:
        gc.unfreeze()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(ext.app())
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    t = threading.Thread(target=loop.run_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        t.join(30)


@pytest.fixture(scope="module")
def http(url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=url, timeout=10) as c:
        yield c


def _put(doc: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        if not isinstance(doc.get(key), dict):
            doc[key] = {}
        doc = doc[key]
    doc[path[-1]] = value


@st.composite
def extender_args(draw: st.DrawFn) -> Any:
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return draw(json_values)
    pod = copy.deepcopy(POD)
    if kind == 1:
        _put(pod, draw(st.sampled_from(POD_PATHS)), draw(json_values))
    elif kind == 2:  # the group's labels: any text, huge or negative sizes
        pod["metadata"]["labels"][draw(st.sampled_from(LABELS))] = draw(
            st.text(max_size=30) | st.integers(-(2**70), 2**70).map(str))
    args: dict[str, Any] = {"Pod": pod}
    nodes = draw(st.sampled_from(["names", "nodes", "victims", "any", "none"]))
    if nodes == "names":
        args["NodeNames"] = draw(st.lists(st.sampled_from(NAMES) | st.text(max_size=20),
                                          max_size=50))
    elif nodes == "nodes":
        args["Nodes"] = {"items": draw(st.lists(json_values, max_size=5))}
    elif nodes == "victims":
        args["NodeNameToMetaVictims"] = draw(st.dictionaries(
            st.sampled_from(NAMES) | st.text(max_size=10),
            st.fixed_dictionaries({"Pods": st.lists(json_values, max_size=3),
                                   "NumPDBViolations": json_values}) | json_values,
            max_size=5))
    elif nodes == "any":
        args[draw(st.sampled_from(["NodeNames", "Nodes", "NodeNameToMetaVictims",
                                   "NodeNameToVictims"]))] = draw(json_values)
    return args


def _check(r: httpx.Response) -> None:
    assert r.status_code < 500, (r.request.url, r.status_code, r.text[:300])
    body = orjson.loads(r.content)
    if r.status_code >= 400:
        assert body["Error"], r.text[:300]


@FUZZ
@given(st.sampled_from(VERBS), extender_args())
def test_random_extender_args(http: httpx.Client, verb: str, args: Any) -> None:
    _check(http.post(f"/{verb}", content=json.dumps(args)))


@pytest.mark.parametrize("verb", VERBS)
def test_nasty_bodies(http: httpx.Client, verb: str) -> None:
    for body in NASTY:
        _check(http.post(f"/{verb}", content=body))


def test_a_huge_group_beside_a_normal_pod(http: httpx.Client) -> None:
    """A group that claims a billion pods is refused or failed on every
    node, quickly, and the pod of a normal group is still placed."""
    huge = copy.deepcopy(POD)
    huge["metadata"]["labels"]["toposerve.io/group-size"] = str(10**9)
    huge["metadata"]["labels"]["toposerve.io/group"] = "huge"
    for verb in VERBS:
        _check(http.post(f"/{verb}", content=orjson.dumps({"Pod": huge, "NodeNames": NAMES})))
    r = http.post("/filter", content=orjson.dumps({"Pod": POD, "NodeNames": NAMES}))
    assert r.status_code == 200 and r.json()["NodeNames"]


@FUZZ
@given(st.sampled_from(["/health", "/ready", "/metrics", *(f"/{v}" for v in VERBS), "/x"]),
       methods, queries, st.binary(max_size=100))
def test_probes_and_odd_methods(http: httpx.Client, path: str, method: str, query: str,
                                body: bytes) -> None:
    r = http.request(method, path + query, content=body)
    assert r.status_code < 500, (method, path, r.status_code, r.text[:300])
