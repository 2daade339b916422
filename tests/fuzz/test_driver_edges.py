"""The driver's edges: NodePrepareResources/NodeUnprepareResources through
the real unix socket, as the kubelet calls them, with random claims (empty
uids, duplicates, unicode and huge names, long lists, claim objects of any
shape from the apiserver), and its /healthz and /metrics with odd methods.
The plugin answers every claim with its own error, never crashes or hangs;
the probes never answer 5xx."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.client import ApiClient, Configuration

from harness.dra_kubelet import Claim, Kubelet
from tests.dra.test_grpc_plugin import DRIVER, FakeKind, Sink
from tests.fuzz.strategies import FUZZ, json_values, methods, queries
from toposerve.dra_driver.kubeletplugin.cdi import CdiSpecs
from toposerve.dra_driver.kubeletplugin.liveness import HttpEndpoints, healthz_route, metrics_route
from toposerve.dra_driver.kubeletplugin.plugin import KubeletPlugin, PluginConfig
from toposerve.dra_driver.kubeletplugin.sockets import PluginPaths

CLAIM_PATH = re.compile(r"/apis/resource\.k8s\.io/v1/namespaces/([^/]*)/resourceclaims/([^/?]*)")


class FakeApiserver:
    """Answers a claim GET with the document set for its name (any JSON),
    404 for the rest and for every write."""

    def __init__(self) -> None:
        self.claims: dict[str, Any] = {}
        docs = self.claims

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                m = CLAIM_PATH.match(self.path)
                found = m is not None and self.command == "GET" and m[2] in docs
                body = json.dumps(docs[m[2]] if found and m else {
                    "kind": "Status", "apiVersion": "v1", "status": "Failure",
                    "reason": "NotFound", "code": 404}).encode()
                self.send_response(200 if found else 404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_PUT = do_PATCH = _answer

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def client(self) -> ApiClient:
        cfg = Configuration()
        cfg.host = f"http://127.0.0.1:{self.server.server_address[1]}"
        return ApiClient(cfg)


@pytest.fixture(scope="module")
def apiserver() -> Iterator[FakeApiserver]:
    api = FakeApiserver()
    try:
        yield api
    finally:
        api.server.shutdown()


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory,
           apiserver: FakeApiserver) -> Iterator[KubeletPlugin]:
    tmp = tmp_path_factory.mktemp("fuzz-driver")
    paths = PluginPaths(driver=DRIVER, registry_dir=tmp / "registry", plugin_dir=tmp / "plugin")
    cfg = PluginConfig(driver=DRIVER, node_name="node-a", paths=paths,
                       cdi=CdiSpecs(tmp / "cdi", "k8s.fake.toposerve.io", "dev"),
                       boot_id="boot-1", grace_s=1)
    p = KubeletPlugin(cfg, FakeKind(), api=apiserver.client(), publisher=Sink())
    p.start()
    try:
        yield p
    finally:
        p.stop()


@pytest.fixture(scope="module")
def kubelet(plugin: KubeletPlugin) -> Kubelet:
    return Kubelet(plugin.cfg.paths.registration_socket, timeout=30)


names = st.text(max_size=40) | st.sampled_from(["", "a" * 300, "../../etc", "x/y", "%00",
                                                "\u202e\U0001f600", "claim-0"])
uids = st.text(max_size=40) | st.sampled_from(["", "uid-0", "uid-0"])
claims = st.lists(st.builds(Claim, namespace=names, name=names, uid=uids), max_size=20)


def _each_claim_answered(claims: list[Claim], answer: dict[str, Any]) -> None:
    assert set(answer) == {c.uid for c in claims}


@FUZZ
@given(claims, st.dictionaries(st.sampled_from(["claim-0", "x", "a" * 300]), json_values,
                               max_size=3), st.sampled_from(["v1", "v1beta1"]))
def test_random_claims_get_per_claim_errors(kubelet: Kubelet, apiserver: FakeApiserver,
                                            plugin: KubeletPlugin, batch: list[Claim],
                                            docs: dict[str, Any], version: str) -> None:
    apiserver.claims.clear()
    apiserver.claims.update(docs)  # the apiserver's claim objects: any shape
    prepared = kubelet.prepare(batch, version)
    _each_claim_answered(batch, prepared)
    assert all(r.error for r in prepared.values())  # none of them is ours to prepare
    unprepared = kubelet.unprepare(batch, version)
    _each_claim_answered(batch, unprepared)
    assert all(e == "" for e in unprepared.values())  # never prepared: nothing to undo


def test_a_huge_list_of_duplicate_and_unicode_claims(kubelet: Kubelet) -> None:
    unknown = [Claim(namespace="ns", name=f"c-{i}", uid=f"00000000-0000-4000-8000-{i % 700:012d}")
               for i in range(2000)]
    malformed = [Claim(namespace="ns\u00e9", name=f"c-{i}-\U0001f600" * 3, uid=f"u{i % 700}")
                 for i in range(2000)] + [Claim("", "", "")] * 50
    batch = unknown + malformed
    prepared = kubelet.prepare(batch, timeout=60)
    _each_claim_answered(batch, prepared)
    assert all("not found" in prepared[c.uid].error for c in unknown)
    assert all(prepared[c.uid].error.startswith("prepare claim: claim namespace ")
               for c in malformed)
    _each_claim_answered(batch, kubelet.unprepare(batch))
    assert kubelet.prepare([]) == {}  # still up


def test_probes_with_odd_methods(plugin: KubeletPlugin) -> None:
    http = HttpEndpoints("127.0.0.1", 0, {
        "/healthz": healthz_route(plugin.cfg.paths.registration_socket, DRIVER),
        "/metrics": metrics_route})
    http.start()
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{http.port}", timeout=10) as c:
            _odd_requests(c)
    finally:
        http.stop()


def _odd_requests(c: httpx.Client) -> None:
    @FUZZ
    @given(st.sampled_from(["/healthz", "/metrics", "/ready", "/", "/x"]), methods, queries,
           st.binary(max_size=100))
    def one(path: str, method: str, query: str, body: bytes) -> None:
        r = c.request(method, path + query, content=body)
        assert r.status_code < 500, (method, path, r.status_code, r.text[:200])
    one()
