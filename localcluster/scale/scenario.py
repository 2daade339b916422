"""The ``ScaleScenario`` kind: which nodes, which workload at which rate,
which scheduler setups to compare, and the client rate limits they run
with. Loaded from YAML like every toposerve config file."""

from __future__ import annotations

import re
from enum import StrEnum
from importlib import resources
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from toposerve.scheduler_ext.config import PlacementConfig
from toposerve.topology.config_file import ConfigError, load_file
from toposerve.topology.profiles import load_profile

KIND = "ScaleScenario"


class Setup(StrEnum):
    DEFAULT = "default"  # kube-scheduler as shipped
    IN_TREE = "in-tree"  # GenericWorkload + TopologyAwareWorkloadScheduling, PodGroups
    TOPOSERVE = "toposerve"  # kube-scheduler calling the toposerve extender


class ClaimShape(StrEnum):
    """The cookbook's claim shapes (docs/dra-driver.md)."""

    ONE_GPU = "one-gpu"
    GPUS_ON_SWITCH = "gpus-on-switch"
    GPU_NIC = "gpu-nic"  # a GPU and a NIC on one PCIe root
    PARTITION = "partition"


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class NodeGroup(Model):
    profile: str = Field(description="hardware profile (topology/profiles): hgx-h100, ...")
    count: int = Field(gt=0, description="how many kwok nodes of it")
    # Partitions cost the scheduler's allocator about ten times a whole GPU's
    # work on every node it filters (docs/scale.md): publish them where the
    # workload asks for them, as an operator enables MIG on some nodes only.
    partitioned: int | None = Field(
        default=None, ge=0, description="how many of them (the first ones) publish their "
        "GPUs' partitions; the rest whole GPUs only (node label "
        "gpu.toposerve.io/partitions=off); unset: all")

    @field_validator("profile")
    @classmethod
    def _known(cls, v: str) -> str:
        try:
            load_profile(v)
        except ConfigError as err:
            raise ValueError(str(err).splitlines()[0]) from None
        return v

    @model_validator(mode="after")
    def _partitioned(self) -> NodeGroup:
        if self.partitioned is not None and self.partitioned > self.count:
            raise ValueError(f"partitioned: {self.partitioned} of {self.count} nodes; give at "
                             f"most count ({self.count}), or leave it out for all")
        return self

    def whole_gpu_nodes(self) -> int:
        return self.count - (self.count if self.partitioned is None else self.partitioned)


class Plain(Model):
    kind: Literal["plain"]
    count: int = Field(gt=0, description="pods without claims")


class Claims(Model):
    kind: Literal["claim"]
    count: int = Field(gt=0, description="pods, each with one claim from a template")
    shape: ClaimShape = ClaimShape.ONE_GPU
    gpus: int = Field(default=1, ge=1, le=8, description="GPUs a claim asks for "
                      "(gpus-on-switch: all on one PCIe switch)")
    profile: str | None = Field(default=None, description="only nodes of this profile")

    @model_validator(mode="after")
    def _shape(self) -> Claims:
        if self.shape in (ClaimShape.GPU_NIC, ClaimShape.PARTITION) and self.gpus != 1:
            raise ValueError(f"gpus: the {self.shape.value} shape takes one device; "
                             "drop gpus or set it to 1")
        return self


class WideEp(Model):
    """Wide expert-parallel groups, written as LeaderWorkerSet writes its
    pods (exclusive placement in one domain of ``level``)."""

    kind: Literal["wide-ep"]
    groups: int = Field(gt=0)
    size: int = Field(gt=1, description="pods a group")
    gpus_per_pod: int = Field(default=4, ge=1, le=8, alias="gpusPerPod")
    profile: str = "gb200-nvl72"
    level: Literal["nvlink", "rack", "block"] = "rack"


class PdSlices(Model):
    """Prefill/decode slices, written as DisaggregatedSet writes its pods."""

    kind: Literal["pd"]
    slices: int = Field(gt=0)
    prefill: int = Field(default=2, ge=1, description="prefill pods a slice")
    decode: int = Field(default=2, ge=1, description="decode pods a slice")
    gpus_per_pod: int = Field(default=4, ge=1, le=8, alias="gpusPerPod")
    profile: str = "hgx-h100"
    level: Literal["nvlink", "rack", "block"] = Field(
        default="rack", description="the domain a slice should share (its quality figure)")


class PodGroups(Model):
    """Gangs written as in-tree PodGroups (``scheduling.k8s.io/v1beta1``);
    in a setup without the workload gates the same pods carry toposerve's
    group labels instead (the extender's setup) or nothing (the default)."""

    kind: Literal["pod-group"]
    groups: int = Field(gt=0)
    size: int = Field(gt=1)
    gpus_per_pod: int = Field(default=4, ge=1, le=8, alias="gpusPerPod")
    profile: str = "gb200-nvl72"
    level: Literal["nvlink", "rack", "block"] = "rack"


Workload = Annotated[Plain | Claims | WideEp | PdSlices | PodGroups, Field(discriminator="kind")]


class Arrival(Model):
    rate: float = Field(default=0, ge=0, description="pods created a second (0: as fast as "
                        "the client can)")
    unmeasured: int = Field(default=0, ge=0, description="pods created and scheduled first, "
                            "not counted in pods/s (scheduler_perf's initPods): the rest are "
                            "created once these are bound or settled")
    settle_seconds: float = Field(default=15, gt=0, alias="settleSeconds",
                                  description="a setup ends when nothing new binds for this long")
    timeout_seconds: float = Field(default=1800, gt=0, alias="timeoutSeconds",
                                   description="a setup gives up waiting after this long")
    seed: int = Field(default=19, description="the order pods arrive in is shuffled with it")


class Churn(Model):
    """After the first wave has settled: pods deleted and created again,
    nodes added and removed."""

    pods: int = Field(default=0, ge=0, description="bound ungrouped pods deleted and re-created")
    nodes_added: int = Field(default=0, ge=0, alias="nodesAdded",
                             description="nodes of the first group's profile added")
    nodes_removed: int = Field(default=0, ge=0, alias="nodesRemoved",
                               description="nodes deleted (those without pods first)")


class ClientLimits(Model):
    """Client rate limits of the components (they decide throughput on the
    local cluster, docs/design.md §7); 0 keeps the component's own default."""

    scheduler_qps: int = Field(default=1000, ge=0, alias="schedulerQps")
    scheduler_burst: int = Field(default=1000, ge=0, alias="schedulerBurst")
    controller_manager_qps: int = Field(default=1000, ge=0, alias="controllerManagerQps")
    controller_manager_burst: int = Field(default=1000, ge=0, alias="controllerManagerBurst")

    @model_validator(mode="after")
    def _pairs(self) -> ClientLimits:
        for what, q, b in (("scheduler", self.scheduler_qps, self.scheduler_burst),
                           ("controllerManager", self.controller_manager_qps,
                            self.controller_manager_burst)):
            if bool(q) != bool(b):
                raise ValueError(f"{what}Qps and {what}Burst: set both, or both to 0 for the "
                                 "component's defaults")
        return self


class SchedulerTuning(Model):
    percentage_of_nodes_to_score: int | None = Field(
        default=None, ge=1, le=100, alias="percentageOfNodesToScore",
        description="KubeSchedulerConfiguration percentageOfNodesToScore for the default "
                    "and in-tree setups (unset: the scheduler's adaptive default); the "
                    "extender's setup scores every node, unless its extender runs with "
                    "placement.sampledNodes (then this too)")
    feature_gates: dict[str, bool] = Field(
        default_factory=dict, alias="featureGates",
        description="kube-scheduler feature gates in every setup, e.g. "
                    "{SchedulerPreQueueingHints: true} (1.37 alpha: a claim event requeues "
                    "only its own pod instead of scanning every unschedulable one)")

    @field_validator("feature_gates")
    @classmethod
    def _gate_names(cls, v: dict[str, bool]) -> dict[str, bool]:
        for name in v:
            if not re.fullmatch(r"[A-Z][A-Za-z0-9]*", name):
                raise ValueError(f"{name!r} is not a feature gate name (CamelCase, as in "
                                 "kube-scheduler --feature-gates)")
        return v

    def gates_flag(self) -> str:
        """The gates as ``--feature-gates`` takes them."""
        return ",".join(f"{k}={str(v).lower()}" for k, v in sorted(self.feature_gates.items()))


# The drivers `driver simulate` can publish for.
Driver = Literal["gpu.toposerve.io", "net.toposerve.io"]
ALL_DRIVERS: tuple[Driver, ...] = ("gpu.toposerve.io", "net.toposerve.io")


class ExtenderTuning(Model):
    placement: PlacementConfig | None = Field(
        default=None, description="the extender's ExtenderConfig placement section in the "
                                  "toposerve setup, e.g. {packUngrouped: false} (unset: "
                                  "its defaults)")


class ScaleScenario(Model):
    api_version: Literal["toposerve.io/v1"] = Field(alias="apiVersion")
    kind: Literal["ScaleScenario"]
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?$")
    description: str = ""
    nodes: list[NodeGroup] = Field(min_length=1)
    workload: list[Workload] = Field(min_length=1)
    setups: list[Setup] = Field(default_factory=lambda: list(Setup), min_length=1)
    arrival: Arrival = Arrival()
    churn: Churn = Churn()
    client_limits: ClientLimits = Field(default=ClientLimits(), alias="clientLimits")
    scheduler: SchedulerTuning = SchedulerTuning()
    extender: ExtenderTuning = ExtenderTuning()
    gogc: dict[Literal["etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
                       "kwok-controller"], Annotated[int, Field(ge=1)]] = Field(
        default_factory=dict,
        description="GOGC of control-plane components in every setup, e.g. {kube-apiserver: "
                    "400, kube-scheduler: 400}: less of their CPU on garbage collection for "
                    "more heap (unset: Go's 100)")
    node_status_seconds: int = Field(
        default=1800, ge=600, alias="nodeStatusSeconds",
        description="seconds between a kwok node's full status patches, 600 or more (each "
                    "wait drawn between this and 1.1x; leases are renewed apart from it). "
                    "kwok's own 600 s sends every node's patch within the same ten seconds, "
                    "500 a second at 5,000 nodes, a stall for whichever setup runs then")
    drivers: list[Driver] = Field(
        default_factory=lambda: list(ALL_DRIVERS), min_length=1,
        description="the DRA drivers whose slices are published (a cluster may run the GPU "
                    "driver alone)")

    @model_validator(mode="after")
    def _consistent(self) -> ScaleScenario:
        profiles = {g.profile for g in self.nodes}
        for i, w in enumerate(self.workload):
            p = getattr(w, "profile", None)
            if p is not None and p not in profiles:
                raise ValueError(f"workload.{i}.profile: {p!r} is none of the scenario's node "
                                 f"profiles ({', '.join(sorted(profiles))}); add nodes of it "
                                 "or change the profile")
        if "net.toposerve.io" not in self.drivers:
            for i, w in enumerate(self.workload):
                if isinstance(w, Claims) and w.shape is ClaimShape.GPU_NIC:
                    raise ValueError(f"workload.{i}: the gpu-nic shape needs NICs; add "
                                     "net.toposerve.io to drivers")
        if len(set(self.setups)) != len(self.setups):
            raise ValueError("setups: each setup at most once")
        if self.arrival.unmeasured >= self.pod_count():
            raise ValueError(f"arrival.unmeasured: {self.arrival.unmeasured} is not below the "
                             f"workload's {self.pod_count()} pods")
        if self.churn.nodes_removed >= self.node_count():
            raise ValueError("churn.nodesRemoved: must leave some nodes")
        return self

    def node_count(self) -> int:
        return sum(g.count for g in self.nodes)

    def pod_count(self) -> int:
        return sum(_pods(w) for w in self.workload)


def _pods(w: Plain | Claims | WideEp | PdSlices | PodGroups) -> int:
    if isinstance(w, Plain | Claims):
        return w.count
    if isinstance(w, PdSlices):
        return w.slices * (w.prefill + w.decode)
    return w.groups * w.size


def load_scenario(path: str | Path) -> ScaleScenario:
    return load_file(path, ScaleScenario, KIND)


def builtin_dir() -> Path:
    return Path(str(resources.files("toposerve.localcluster.scale").joinpath("scenarios")))


def builtins() -> dict[str, Path]:
    """Built-in scenario name -> its file."""
    return {p.stem: p for p in sorted(builtin_dir().glob("*.yaml"))}


def resolve(name_or_path: str) -> Path:
    """A file path, or the name of a built-in scenario."""
    p = Path(name_or_path)
    if p.is_file():
        return p
    known = builtins()
    if name_or_path in known:
        return known[name_or_path]
    raise ConfigError(f"-f {name_or_path}: no such file and no built-in scenario of that name "
                      f"(built-ins: {', '.join(known)})")
