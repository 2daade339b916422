"""``GpuConfig``: the opaque parameters a DeviceClass or a claim gives the
GPU driver (``config[].opaque{driver: gpu.toposerve.io, parameters}``).

    apiVersion: gpu.toposerve.io/v1   # toposerve.io/v1: deprecated, still accepted
    kind: GpuConfig
    topologyEnv: true        # TOPOSERVE_* placement env in the container
    nicAlignment: switch     # which NICs count as aligned: switch | root | numa | none
    env: {NCCL_DEBUG: INFO}  # extra environment

Configs of the class come first and the claim's after; a field a later
config sets overrides it, ``env`` is merged (``merge_opaque``).
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator

from toposerve.dra_driver.kubeletplugin.cdi import ENV_NAME
from toposerve.dra_driver.kubeletplugin.opaque import OpaqueConfig


class GpuConfig(OpaqueConfig):
    API_VERSION: ClassVar[str] = "gpu.toposerve.io/v1"
    KIND: ClassVar[str] = "GpuConfig"
    # the group before it matched the driver's name: claims written then work
    DEPRECATED_API_VERSIONS: ClassVar[tuple[str, ...]] = ("toposerve.io/v1",)

    topology_env: bool = Field(
        default=True,
        description="put the devices' NUMA nodes, CPUs, PCIe roots and aligned NICs in "
                    "TOPOSERVE_* environment variables")
    nic_alignment: Literal["switch", "root", "numa", "none"] = Field(
        default="switch",
        description="NICs sharing this with a GPU are its aligned NICs (a GPU under no "
                    "switch falls back to its root)")
    env: dict[str, str] = Field(default_factory=dict,
                                description="extra environment variables for the container")

    @field_validator("env")
    @classmethod
    def _names(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not ENV_NAME.fullmatch(k)]
        if bad:
            raise ValueError(f"not an environment variable name: {', '.join(bad)}")
        # The claim's author writes this, and CDI env overrides the pod's own:
        # it must not replace what the driver derives from the allocation
        # (which GPUs, a share's size), which a runtime hook reading
        # NVIDIA_VISIBLE_DEVICES would obey (another tenant's GPU, or "all").
        ours = [k for k in v if reserved_env(k)]
        if ours:
            raise ValueError(f"set by the driver, not by a config: {', '.join(ours)}")
        return v


def reserved_env(name: str) -> bool:
    """A variable the driver sets from the allocation: ``*_VISIBLE_DEVICES``
    (NVIDIA, CUDA, AMD, ROCR, HIP) and ``TOPOSERVE_*``."""
    return name.endswith("_VISIBLE_DEVICES") or name.startswith("TOPOSERVE_")
