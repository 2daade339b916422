"""The endpoint picker's process: the router's parts and background loops
(``toposerve.router.http.app.Router``: discovery, scrapes, KV events, flow
control's release, HA), the gRPC server a proxy asks (external processing,
and gRPC health as the protocol asks: ``liveness``, ``readiness`` and the
ext_proc service's own name), and on server.host:server.port the HTTP
probes and metrics the standalone router serves."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import structlog
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from toposerve.router.config import RouterConfig
from toposerve.router.epp.picker import Picker
from toposerve.router.http.app import ROUTER, Router
from toposerve.router.http.edge import errors
from toposerve.router.supervise import Streak, supervise
from toposerve.serving.http import run_app
from toposerve.wire.errors import error_response

log = structlog.get_logger("router.epp")
EXT_PROC = "envoy.service.ext_proc.v3.ExternalProcessor"
LIVENESS, READINESS = "liveness", "readiness"
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def grpc_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def ready(router: Router) -> bool:
    """Whether the picker can pick: a healthy endpoint, and the leader's
    role under ha (a standby picks nothing)."""
    return any(ep.healthy for ep in router.state.pool.routable()) and (
        router.ha is None or router.ha.leader)


class _Health(health.aio.HealthServicer):  # type: ignore[misc]
    """gRPC health whose readiness is the pool's when a ``Check`` (a
    proxy's health check) asks: a picker whose endpoints' first scrape
    came after its start is ready then, not a scrape interval later (a
    minute, for some). ``Watch`` hears the refresh each scrape interval."""

    def __init__(self, refresh: Callable[[], Awaitable[None]]) -> None:
        super().__init__()
        self._refresh = refresh

    async def Check(self, request: Any, context: Any) -> Any:
        await self._refresh()
        return await super().Check(request, context)


class PickerServer:
    """The gRPC half, started and stopped with the HTTP app."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.health = _Health(self._readiness)
        self.server: Any = None
        self._watch: asyncio.Task[None] | None = None

    async def start(self, app: web.Application) -> None:
        cfg = self.router.cfg
        # no SO_REUSEPORT: a second picker on a taken port must fail, not share it
        self.server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        ext_grpc.add_ExternalProcessorServicer_to_server(Picker(self.router), self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        where = grpc_address(cfg.endpoint_picker.host, cfg.endpoint_picker.port)
        port = self.server.add_insecure_port(where)
        await self.server.start()
        for service in (health.OVERALL_HEALTH, LIVENESS):
            await self.health.set(service, _SERVING)
        await self._readiness()
        self._watch = asyncio.create_task(supervise(Streak("epp-health"), self._follow))
        log.info("serving", grpc=grpc_address(cfg.endpoint_picker.host, port))

    async def _readiness(self) -> None:
        status = _SERVING if ready(self.router) else _NOT_SERVING
        for service in (READINESS, EXT_PROC):
            await self.health.set(service, status)

    async def _follow(self) -> None:
        """Readiness follows the pool, each scrape interval."""
        while True:
            await asyncio.sleep(self.router.cfg.scrape.interval_s)
            await self._readiness()

    async def stop(self, app: web.Application) -> None:
        """SIGTERM: no new streams; those in flight get
        server.drainTimeoutSeconds to end."""
        if self._watch is not None:
            self._watch.cancel()
        await self.health.enter_graceful_shutdown()
        if self.server is not None:
            await self.server.stop(self.router.cfg.server.drain_timeout_s)


def build_app(cfg: RouterConfig) -> web.Application:
    router = Router(cfg)
    grpc_half = PickerServer(router)
    h = router.handlers
    app = web.Application(middlewares=[errors(router.metrics, cfg.server.max_header_bytes)])
    app[ROUTER] = router
    for path, probe in (("/health", h.health), ("/ready", h.ready),
                        ("/metrics", h.metrics_endpoint)):
        app.router.add_get(path, probe)
    app.on_startup.extend([router.start, grpc_half.start])
    app.on_shutdown.append(grpc_half.stop)
    app.on_cleanup.append(router.stop)
    return app


def serve(cfg: RouterConfig, sock: socket.socket) -> None:
    """Serve until stopped: the probes on ``sock``, the picker on
    endpointPicker.host:port. Not on uvloop: grpc.aio runs on asyncio's
    own loop."""
    run_app(build_app(cfg), error_factory=error_response, sock=sock, access_log=None,
            shutdown_timeout=cfg.server.drain_timeout_s)

