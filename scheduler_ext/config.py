"""``ExtenderConfig``: the extender's YAML file (``apiVersion:
toposerve.io/v1``, ``kind: ExtenderConfig``), validated by pydantic; a bad
file gets one error per field naming it and the fix."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from toposerve.kubeapi.names import is_subdomain
from toposerve.scheduler_ext.placement.decide import Policy
from toposerve.scheduler_ext.placement.levels import LEVEL_NAMES, UnknownLevel, parse_level
from toposerve.topology.config_file import load_file
from toposerve.topology.labels import PRESETS, Dialect, DialectName
from toposerve.topology.model import Tier, TierLink
from toposerve.topology.profiles import load_profile
from toposerve.topology.quantity import parse_quantity


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class ServerConfig(Section):
    host: str = Field(default="127.0.0.1", description="address to listen on")
    port: int = Field(default=8888, ge=0, le=65535, description="port to listen on (0: any)")
    cert_file: str | None = Field(default=None, alias="certFile",
                                  description="PEM certificate: serve HTTPS (needs keyFile)")
    key_file: str | None = Field(default=None, alias="keyFile",
                                 description="PEM private key of certFile")


class Accelerators(Section):
    """What counts as an accelerator: devices of these DRA drivers in
    ResourceSlices (a partitionable GPU counts once, by its counter set),
    claims' requests whose class and selectors pick them (these classes:
    all of them, while their DeviceClass is not seen), and these extended
    resources."""

    drivers: list[str] = Field(default_factory=lambda: ["gpu.toposerve.io"],
                               description="DRA drivers whose devices are accelerators")
    device_classes: list[str] = Field(
        default_factory=lambda: ["gpu.toposerve.io"], alias="deviceClasses",
        description="DeviceClasses counted as every accelerator device while their "
                    "DeviceClass object is not seen (any class whose selectors pick "
                    "accelerator devices counts anyway)")
    extended_resources: list[str] = Field(
        default_factory=lambda: ["nvidia.com/gpu"], alias="extendedResources",
        description="container resource names counted as accelerators (node allocatable "
                    "and pod requests), for pods without claims")


class PlacementConfig(Section):
    default_preferred_level: str = Field(
        default="nvlink", alias="defaultPreferredLevel",
        description="level a group tries first when its pods name none (then one level "
                    f"wider at a time): one of {', '.join(sorted(LEVEL_NAMES))}")
    promise_ttl_seconds: float = Field(
        default=120.0, alias="promiseTTLSeconds", gt=0,
        description="how long capacity promised to a group stays held while none of its "
                    "members comes to be scheduled")
    kv_size_per_request: str = Field(
        default="8Gi", alias="kvSizePerRequest",
        description="KV cache moved from prefill to decode per request, for the transfer "
                    "cost model (a quantity: 8Gi, 500Mi)")
    pack_ungrouped: bool = Field(
        default=True, alias="packUngrouped",
        description="score a pod of no group that asks accelerators toward the node it "
                    "fills best (nodes with partitions last, then the fullest rack), and "
                    "count it there until it binds: whole nodes and racks stay free for "
                    "groups, and a group deciding meanwhile sees the room it takes; "
                    "false: neutral scores")
    sampled_nodes: bool = Field(
        default=False, alias="sampledNodes",
        description="the scheduler offers a sample of the feasible nodes (its "
                    "percentageOfNodesToScore below 100): a member held to a domain that "
                    "still fits its group by the extender's count, whose nodes with room "
                    "were not offered, waits for the scheduler's next try instead of "
                    "climbing a level")
    cost_profile: str = Field(
        default="gb200-nvl72", alias="costProfile",
        description="hardware profile whose tier costs apply to nodes that carry no "
                    "profile label")

    @field_validator("default_preferred_level")
    @classmethod
    def _level(cls, v: str) -> str:
        if v.lower() not in LEVEL_NAMES:
            raise ValueError(f"unknown level {v!r}: use one of {', '.join(sorted(LEVEL_NAMES))}")
        return v.lower()

    @field_validator("kv_size_per_request")
    @classmethod
    def _kv(cls, v: str) -> str:
        parse_quantity(v)
        return v

    @field_validator("cost_profile")
    @classmethod
    def _profile(cls, v: str) -> str:
        load_profile(v)
        return v


class ExtenderConfig(Section):
    api_version: Literal["toposerve.io/v1"] = Field(default="toposerve.io/v1",
                                                    alias="apiVersion")
    kind: Literal["ExtenderConfig"] = "ExtenderConfig"
    server: ServerConfig = Field(default_factory=ServerConfig)
    topology_labels: DialectName = Field(
        default=DialectName.TOPOSERVE, alias="topologyLabels",
        description="node-label dialect the topology levels are read in")
    accelerators: Accelerators = Field(default_factory=Accelerators)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    persist_decisions: bool = Field(
        default=True, alias="persistDecisions",
        description="write each group's domain onto its pods (annotation "
                    "toposerve.io/placement) so a restarted or second extender keeps it")
    scheduler_name: str | None = Field(
        default=None, alias="schedulerName",
        description="the scheduler profile that calls this extender for groups' pods "
                    "(`scheduler-config --scheduler-name`; the chart sets its own). A "
                    "pending pod of a group that names another spec.schedulerName is never "
                    "placed with its group: the extender logs it, writes a Warning Event "
                    "on it and counts it (toposerve_extender_group_pods_elsewhere). "
                    "Unset: not checked")
    decision_key_file: str | None = Field(
        default=None, alias="decisionKeyFile",
        description="file holding the key that signs the decisions written on pods (a "
                    "mounted Secret, shared by every replica); only decisions signed with "
                    "it are read back. Unset: a key made at start, so decisions written "
                    "before a restart are decided afresh")

    @field_validator("scheduler_name")
    @classmethod
    def _scheduler_name(cls, v: str | None) -> str | None:
        if v is not None and not is_subdomain(v):
            raise ValueError(f"{v!r} is no pod's spec.schedulerName: give a DNS subdomain "
                             "(lower-case letters, digits, '-' and '.')")
        return v

    @field_validator("decision_key_file")
    @classmethod
    def _key_file(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                key = Path(v).read_bytes()
            except OSError as err:
                raise ValueError(f"cannot read {v}: {err.strerror}") from None
            if len(key.strip()) < 16:
                raise ValueError(f"{v}: the key must be at least 16 bytes")
        return v

    def decision_key(self) -> bytes:
        if self.decision_key_file is None:
            return secrets.token_bytes(32)
        return Path(self.decision_key_file).read_bytes().strip()

    def dialect(self) -> Dialect:
        return PRESETS[self.topology_labels]

    def policy(self) -> Policy:
        fallback = self.placement.cost_profile

        def links(profile: str | None) -> dict[Tier, TierLink]:
            try:
                return load_profile(profile or fallback).links()
            except ValueError:  # a label naming a profile we do not ship
                return load_profile(fallback).links()

        try:
            preferred = parse_level(self.placement.default_preferred_level, self.dialect())
        except UnknownLevel:  # checked by the validator already
            preferred = Tier.NVLINK
        return Policy(promise_ttl_s=self.placement.promise_ttl_seconds,
                      default_preferred=preferred,
                      kv_bytes=parse_quantity(self.placement.kv_size_per_request), links=links,
                      pack_ungrouped=self.placement.pack_ungrouped,
                      sampled=self.placement.sampled_nodes)


def load_extender_config(path: str | Path) -> ExtenderConfig:
    return load_file(path, ExtenderConfig, "ExtenderConfig")

