"""The kubelet-facing ``DRAPlugin`` service, v1 and v1beta1 (the same
messages; v1beta1 has no ``share_id``), translating between protobuf and
the framework's plain types."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import grpc

from toposerve.dra_driver._generated import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
)
from toposerve.dra_driver.kubeletplugin.checkpoint import PreparedDevice
from toposerve.dra_driver.kubeletplugin.device_kind import ClaimRef


class PrepareOutcome(Protocol):
    @property
    def devices(self) -> Sequence[PreparedDevice]: ...
    @property
    def error(self) -> str | None: ...


class Preparer(Protocol):
    """What the service calls; ``kubelet_plugin.KubeletPlugin`` is one."""

    def prepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, PrepareOutcome]: ...
    def unprepare(self, claims: Sequence[ClaimRef]) -> Mapping[str, str | None]: ...


def _refs(req: Any) -> list[ClaimRef]:
    return [ClaimRef(namespace=c.namespace, name=c.name, uid=c.uid) for c in req.claims]


def _base_request(name: str) -> str:
    return name.split("/", 1)[0]  # the kubelet knows requests, not subrequests


def _servicer(pb2: Any, base: type, preparer: Preparer, share_ids: bool) -> Any:
    class Servicer(base):  # type: ignore[misc]
        def NodePrepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
            out = pb2.NodePrepareResourcesResponse()
            for uid, res in preparer.prepare(_refs(request)).items():
                entry = out.claims[uid]
                if res.error:
                    entry.error = res.error
                    continue
                for d in res.devices:
                    dev = entry.devices.add(
                        request_names=sorted({_base_request(r) for r in d.requests}),
                        pool_name=d.pool, device_name=d.device, cdi_device_ids=d.cdi_device_ids)
                    if share_ids and d.share_id is not None:
                        dev.share_id = d.share_id
            return out

        def NodeUnprepareResources(self, request: Any, context: grpc.ServicerContext) -> Any:
            out = pb2.NodeUnprepareResourcesResponse()
            for uid, err in preparer.unprepare(_refs(request)).items():
                out.claims[uid].error = err or ""
            return out
    return Servicer()


def add_dra_services(server: grpc.Server, preparer: Preparer) -> list[str]:
    """Serve ``DRAPlugin`` v1 and v1beta1; returns the names registration
    advertises (``v1.DRAPlugin``, ``v1beta1.DRAPlugin``: the kubelet's
    spelling, the last two parts of the service's full name)."""
    dra_v1_pb2_grpc.add_DRAPluginServicer_to_server(
        _servicer(dra_v1_pb2, dra_v1_pb2_grpc.DRAPluginServicer, preparer, True), server)
    dra_v1beta1_pb2_grpc.add_DRAPluginServicer_to_server(
        _servicer(dra_v1beta1_pb2, dra_v1beta1_pb2_grpc.DRAPluginServicer, preparer, False),
        server)
    return [".".join(pb2.DESCRIPTOR.services_by_name["DRAPlugin"].full_name.split(".")[-2:])
            for pb2 in (dra_v1_pb2, dra_v1beta1_pb2)]
