"""A watch stream that breaks mid-line is an ApiError (the watch loop
watches again from its last resourceVersion), not a dead thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import kubernetes.client
import pytest

from toposerve.kubeapi import ApiError, JsonApi

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`

EVENT = b'{"type":"ADDED","object":{"metadata":{"name":"a","resourceVersion":"5"}}}\n'


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(EVENT + b"\xff\xfe{not utf-8}\n")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}"
    srv.shutdown()


def test_a_line_that_is_not_json_ends_the_watch_as_an_api_error(server: str) -> None:
    api = JsonApi(kubernetes.client.ApiClient(kubernetes.client.Configuration(host=server)))
    got: list[dict[str, Any]] = []
    with pytest.raises(ApiError, match="watch /api/v1/pods: JSONDecodeError"):
        for ev in api.stream("/api/v1/pods", [("watch", "true")], 5, lambda r: None):
            got.append(ev)
    assert [e["object"]["metadata"]["name"] for e in got] == ["a"]
