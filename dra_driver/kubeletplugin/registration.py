"""The kubelet plugin-registration service: ``GetInfo`` says who we are,
where the DRA socket is and exactly which services it serves;
``NotifyRegistrationStatus`` tells us the kubelet's verdict."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import grpc
import structlog

from toposerve.dra_driver._generated import pluginregistration_pb2 as pb2
from toposerve.dra_driver._generated import pluginregistration_pb2_grpc as stubs

DRA_PLUGIN_TYPE = "DRAPlugin"
log = structlog.get_logger("dra.registration")


class RegistrationServicer(stubs.RegistrationServicer):  # type: ignore[misc]
    def __init__(self, driver: str, endpoint: str, versions: Sequence[str],
                 on_status: Callable[[bool, str], None]) -> None:
        self.driver = driver
        self.endpoint = endpoint
        self.versions = list(versions)
        self.on_status = on_status

    def GetInfo(self, request: Any, context: grpc.ServicerContext) -> Any:
        log.info("kubelet asked for plugin info", driver=self.driver)
        return pb2.PluginInfo(type=DRA_PLUGIN_TYPE, name=self.driver, endpoint=self.endpoint,
                              supported_versions=self.versions)

    def NotifyRegistrationStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.on_status(bool(request.plugin_registered), str(request.error))
        if not request.plugin_registered:
            # The Go helper answers a failed registration with an error too.
            context.abort(grpc.StatusCode.UNKNOWN, f"failed registration: {request.error}")
        return pb2.RegistrationStatusResponse()


def add_registration_service(server: grpc.Server, servicer: RegistrationServicer) -> None:
    stubs.add_RegistrationServicer_to_server(servicer, server)
