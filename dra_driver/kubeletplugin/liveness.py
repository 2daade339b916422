"""Liveness through the real sockets (what a kubelet does: ``GetInfo`` on
the registration socket, an empty ``NodePrepareResources`` on the DRA
socket, which also proves the serialization lock is not wedged), and the
HTTP endpoints ``/healthz`` and ``/metrics``."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import prometheus_client
import structlog

from toposerve.dra_driver._generated import dra_v1_pb2, dra_v1_pb2_grpc
from toposerve.dra_driver._generated import pluginregistration_pb2 as reg_pb2
from toposerve.dra_driver._generated import pluginregistration_pb2_grpc as reg_grpc
from toposerve.dra_driver.kubeletplugin.sockets import grpc_target

log = structlog.get_logger("dra.liveness")


def probe(registration_socket: Path, driver: str, timeout_s: float = 10) -> str | None:
    """None when both sockets answer as they should, else what is wrong."""
    try:
        with grpc_target(registration_socket) as target, grpc.insecure_channel(target) as ch:
            info = reg_grpc.RegistrationStub(ch).GetInfo(reg_pb2.InfoRequest(), timeout=timeout_s)
        if info.name != driver:
            return f"registration socket serves driver {info.name!r}, not {driver!r}"
        with grpc_target(Path(info.endpoint)) as target, grpc.insecure_channel(target) as ch:
            dra_v1_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(), timeout=timeout_s)
    except grpc.RpcError as err:
        return f"{err.code().name}: {err.details()}"
    return None


Route = Callable[[], tuple[int, bytes, str]]  # -> (status, body, content type)


def metrics_route() -> tuple[int, bytes, str]:
    return 200, prometheus_client.generate_latest(), prometheus_client.CONTENT_TYPE_LATEST


def healthz_route(registration_socket: Path, driver: str) -> Route:
    def route() -> tuple[int, bytes, str]:
        problem = probe(registration_socket, driver)
        return (200, b"ok\n", "text/plain") if problem is None else (
            503, f"{problem}\n".encode(), "text/plain")
    return route


class HttpEndpoints:
    """A few GET routes on one address (``/healthz``, ``/metrics``, ...)."""

    def __init__(self, host: str, port: int, routes: Mapping[str, Route]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                self._send(*(route() if route else (404, b"not found\n", "text/plain")))

            def _not_allowed(self) -> None:
                # 405, not http.server's 501: another method is the client's error
                self._send(405, b"method not allowed\n", "text/plain", {"Allow": "GET"})

            do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed

            def _send(self, code: int, body: bytes, ctype: str,
                      headers: Mapping[str, str] | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                pass  # probes every few seconds would flood the log

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="dra-http",
                                        daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> None:
        self._thread.start()
        log.info("serving http", port=self.port)

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
