"""``GpuConfig``: the opaque parameters a DeviceClass or a claim gives the
GPU driver (``config[].opaque{driver: gpu.toposerve.io, parameters}``).

    apiVersion: toposerve.io/v1
    kind: GpuConfig
    topologyEnv: true        # TOPOSERVE_* placement env in the container
    nicAlignment: switch     # which NICs count as aligned: switch | root | numa | none
    env: {NCCL_DEBUG: INFO}  # extra environment

Configs of the class come first and the claim's after; a field a later
config sets overrides it, ``env`` is merged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from dra_driver.framework.cdi import ENV_NAME
from dra_driver.framework.opaque import parse_opaque
from topology.config_file import API_VERSION

KIND = "GpuConfig"


class GpuConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)

    api_version: Literal["toposerve.io/v1"] = Field(alias="apiVersion")
    kind: Literal["GpuConfig"]
    topology_env: bool = Field(
        default=True, alias="topologyEnv",
        description="put the devices' NUMA nodes, CPUs, PCIe roots and aligned NICs in "
                    "TOPOSERVE_* environment variables")
    nic_alignment: Literal["switch", "root", "numa", "none"] = Field(
        default="switch", alias="nicAlignment",
        description="NICs sharing this with a GPU are its aligned NICs (a GPU under no "
                    "switch falls back to its root)")
    env: dict[str, str] = Field(default_factory=dict,
                                description="extra environment variables for the container")

    @field_validator("env")
    @classmethod
    def _names(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not ENV_NAME.match(k)]
        if bad:
            raise ValueError(f"not an environment variable name: {', '.join(bad)}")
        return v


DEFAULT = GpuConfig.model_validate({"apiVersion": API_VERSION, "kind": KIND})


def parse_gpu_config(parameters: Mapping[str, Any]) -> GpuConfig:
    """One opaque config; a ``ValueError`` naming the field and the fix."""
    return parse_opaque(parameters, GpuConfig, API_VERSION, KIND)


def merge(configs: Sequence[GpuConfig]) -> GpuConfig:
    """Later configs override the fields they set; ``env`` accumulates."""
    out = DEFAULT
    for c in configs:
        update = {name: getattr(c, name) for name in c.model_fields_set
                  if name not in ("api_version", "kind", "env")}
        update["env"] = {**out.env, **c.env}
        out = out.model_copy(update=update)
    return out
