"""A kubelet-plugin framework for DRA drivers in Python: what Go drivers get
from ``k8s.io/dynamic-resource-allocation/kubeletplugin`` (gRPC servers,
registration, sockets, serialization, claims, checkpoint, CDI, claim status,
health). Knows nothing of GPUs or NICs; a device kind (``DeviceKind``) plugs
in, and its opaque config is an ``OpaqueConfig``. Of the ResourceSlice side
it uses only the ``Pool`` data type."""

from toposerve.dra_driver.kubeletplugin.cdi import ContainerEdits, DeviceNode, Mount
from toposerve.dra_driver.kubeletplugin.device_kind import (
    AllocatedDevice,
    ClaimRef,
    DeviceKind,
    PreparedEdits,
)
from toposerve.dra_driver.kubeletplugin.health import HealthBoard
from toposerve.dra_driver.kubeletplugin.opaque import (
    OpaqueConfig,
    merge_opaque,
    parse_opaque,
    problems,
)
from toposerve.dra_driver.kubeletplugin.plugin import KubeletPlugin, PluginConfig

__all__ = [
    "AllocatedDevice", "ClaimRef", "ContainerEdits", "DeviceKind", "DeviceNode", "HealthBoard",
    "KubeletPlugin", "Mount", "OpaqueConfig", "PluginConfig", "PreparedEdits", "merge_opaque",
    "parse_opaque", "problems",
]
