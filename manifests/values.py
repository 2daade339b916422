"""What an install is rendered from (``kind: InstallValues``). These models
are the schema and the reference (``docs/install.md`` is generated from
them): every field says what it does, and a bad file or ``--set`` names the
field it got wrong."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from ipaddress import ip_address
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from toposerve.dra_driver.net.handoff import DEFAULT_PLUGIN
from toposerve.kubeapi.names import DNS_LABEL, DNS_SUBDOMAIN, SUBDOMAIN
from toposerve.router.config import RouterConfig
from toposerve.router.epp.fit import unfit
from toposerve.scheduler_ext.config import ExtenderConfig
from toposerve.scheduler_ext.scheduler_config import MAX_TIMEOUT_S, MIN_TIMEOUT_S
from toposerve.topology.config_file import API_VERSION, ConfigError, parse_document, read_document

KIND = "InstallValues"
# an extended resource name: <DNS subdomain>/<qualified name part>, as a pod's
# resources name it (nvidia.com/gpu); the apiserver also refuses *kubernetes.io/
EXTENDED_RESOURCE = (r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/"
                     r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")

AbsPath = Annotated[str, Field(pattern=r"^/\S*$")]
Label = Annotated[str, Field(pattern=DNS_LABEL, max_length=63)]
Repository = Annotated[str, Field(min_length=1, pattern=r"^\S+$")]
Tag = Annotated[str, Field(pattern=r"^\w[\w.-]{0,127}$")]
# Kubernetes label keys and values
LabelKey = Annotated[str, Field(pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*"
                                        r"[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}"
                                        r"[A-Za-z0-9])?$")]
LabelValue = Annotated[str, Field(pattern=r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")]
Component = Literal["gpu-driver", "net-driver",
                    "admission-policy", "device-classes", "extender", "scheduler",
                    "router", "secrets"]
COMPONENTS: tuple[Component, ...] = ("gpu-driver", "net-driver",
                                     "admission-policy", "device-classes",
                                     "extender", "scheduler", "router", "secrets")


class Section(BaseModel):
    # strict: `replicas: true` is a mistake, not 1, as helm's schema says too
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True,
                              alias_generator=to_camel, strict=True)

    @field_validator("*", mode="after")
    @classmethod
    def _int32(cls, v: Any) -> Any:
        # every count and port in a manifest is an int32 (helm would print 1e+23)
        if isinstance(v, int) and not isinstance(v, bool) and not -2**31 <= v < 2**31:
            raise ValueError(f"{v} does not fit a Kubernetes integer (32 bits)")
        return v


class Image(Section):
    """A container image."""

    repository: Repository = Field(description="image name without tag")
    tag: Tag = Field(description="image tag")
    pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="imagePullPolicy; `Never` for images imported "
                                            "into the node's runtime by hand")

    @property
    def ref(self) -> str:
        return f"{self.repository}:{self.tag}"


class ToposerveImage(Image):
    """The toposerve image (the driver and the extender run it)."""

    repository: Repository = Field(default="ghcr.io/toposerve/toposerve",
                                   description="image name without tag (docs/image.md: build "
                                               "it and push it to your registry)")
    tag: str = Field(default="", pattern=r"^(\w[\w.-]{0,127})?$",
                     description="image tag; empty: the chart's appVersion (the toposerve "
                                 "version it was released with)")


# The Kubernetes release the install targets (DRA's resource.k8s.io/v1 with
# the fields the drivers publish) and whose kube-scheduler it runs. The local
# cluster builds the same release (localcluster/versions.env); a test keeps
# the two equal.
KUBERNETES_VERSION = "v1.37.2"


class SchedulerImage(Image):
    """The kube-scheduler image."""

    repository: Repository = Field(default="registry.k8s.io/kube-scheduler",
                                   description="image name without tag")
    tag: Tag = Field(default=KUBERNETES_VERSION,
                     description="image tag (default: the Kubernetes version toposerve targets)")


class ApiServer(Section):
    """An address every toposerve pod uses for the Kubernetes API instead of
    the in-cluster service: for clusters whose pods cannot use the service
    address (the local cluster's real node, where pods run on the host's
    network and dial the API server's loopback address). Each pod then gets a
    kubeconfig of that address and its own service-account token."""

    host: str = Field(description="IP address or DNS name of the API server as seen from a "
                                  "node, e.g. 127.0.0.1 on a single-node cluster")
    port: int = Field(default=6443, ge=1, le=65535, description="its secure port")

    @field_validator("host")
    @classmethod
    def _host(cls, v: str) -> str:
        try:
            ip_address(v)
        except ValueError:
            if not SUBDOMAIN.fullmatch(v):
                raise ValueError("give an IP address or a DNS name, without scheme or "
                                 "port (the port is apiServer.port)") from None
        return v

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"https://{host}:{self.port}"


class Toleration(Section):
    """A pod toleration, as in the pod spec."""

    key: str | None = Field(default=None, description="taint key; none with `Exists` "
                                                      "tolerates every taint")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists or Equal")
    value: str | None = Field(default=None, description="taint value for `Equal`")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="taint effect; none matches every effect")
    toleration_seconds: int | None = Field(default=None, ge=0,
                                           description="for NoExecute: how long to stay")


# a container's resource name (cpu, memory, ephemeral-storage, hugepages-2Mi, or an
# extended resource) and a non-negative quantity, as a string (50m, 1Gi, 1e3) or a number
ResourceName = Annotated[str, Field(pattern=r"^(cpu|memory|ephemeral-storage|hugepages-\w+|"
                                            r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[A-Za-z0-9]"
                                            r"([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")]
Quantity = (Annotated[str, Field(pattern=r"^([0-9]+(\.[0-9]*)?|\.[0-9]+)"
                                         r"([eE][-+]?[0-9]+|[numkMGTPE]|[KMGTPE]i)?$")]
            | Annotated[int, Field(ge=0)] | Annotated[float, Field(ge=0)])


class Resources(Section):
    """Container resource requests and limits."""

    requests: dict[ResourceName, Quantity] = Field(default_factory=dict,
                                                   description="e.g. {cpu: 50m}")
    limits: dict[ResourceName, Quantity] = Field(default_factory=dict,
                                                 description="e.g. {memory: 256Mi}")


def sized(cpu: str, memory: str, memory_limit: str | None = None) -> Any:
    """A component's default resources: requests a scheduler can place it by
    (a starting point for a small cluster; raise them with load) and, where
    a runaway would hurt its node, a memory limit."""
    return Field(default_factory=lambda: Resources(
        requests={"cpu": cpu, "memory": memory},
        limits={"memory": memory_limit} if memory_limit else {}),
        description="requests and limits of the main container")


class Placement(Section):
    """Where a component's pods run and what they may use."""

    node_selector: dict[str, str] = Field(default_factory=dict,
                                          description="node labels the pods require")
    tolerations: list[Toleration] = Field(default_factory=list,
                                          description="taints the pods tolerate")
    resources: Resources = Field(default_factory=Resources,
                                 description="requests and limits of the main container")


class PluginDriver(Placement):
    """What every DRA driver's DaemonSet is rendered from."""

    enabled: bool = Field(default=True, description="render this component")
    resources: Resources = sized("50m", "64Mi", "512Mi")
    kubelet_dir: AbsPath = Field(default="/var/lib/kubelet",
                                 description="the kubelet's root: its `plugins_registry` and "
                                             "`plugins` folders are mounted from here")
    cdi_root: AbsPath = Field(default="/var/run/cdi",
                              description="where the container runtime reads CDI specs")
    sysfs_root: AbsPath = Field(default="/sys", description="sysfs to discover the devices "
                                                            "in, mounted read-only")
    dev_root: AbsPath = Field(default="/dev",
                              description="the devices' nodes on the host (GPUs, "
                                          "/dev/infiniband), mounted read-only at the same "
                                          "path: the driver checks them and names them in "
                                          "CDI specs")
    priority_class_name: str = Field(default="system-node-critical",
                                     description="keeps the driver on a node under pressure")
    http_port: int = Field(
        default=0, ge=0, le=65535,
        description="/metrics and /healthz: a fixed port is the pod's `metrics` port (what a "
                    "PodMonitor scrapes); 0: a free port (in the driver's log). On the node's "
                    "network they listen on its 127.0.0.1 only, and a fixed port makes the "
                    "update replace pods one at a time, old first (no overlap)")
    extra_args: list[str] = Field(default_factory=list,
                                  description="more flags for the driver's command")
    binding_conditions: bool = Field(
        default=False,
        description="publish the devices with binding conditions (DRADeviceBindingConditions, "
                    "beta in Kubernetes 1.37): a pod binds to a node only once the driver "
                    "there has marked its allocated devices ready (a NIC present with its link "
                    "up; a GPU registered with its NVLink fabric) and goes back to scheduling "
                    "when one failed. Grants the driver list and watch on every "
                    "ResourceClaim; a pod start waits for the scheduler's 5 s poll")


class GpuDriver(PluginDriver):
    """The accelerator DRA driver `gpu.toposerve.io`: a DaemonSet of
    `toposerve driver gpu`, its service account and RBAC."""

    nvidia_driver_root: AbsPath = Field(
        default="/",
        description="the host's NVIDIA driver root: `/`, or `/run/nvidia/driver` with the GPU "
                    "Operator's containerized driver; mounted read-only at /driver-root, where "
                    "the driver searches `libnvidia-ml.so.1` (not found: sysfs only)")
    host_network: bool = Field(
        default=False,
        description="its pods on the node's network: it needs none of the host's interfaces "
                    "(the kubelet talks to it over unix sockets); for nodes whose pods cannot "
                    "reach the API server otherwise (the local cluster's values)")
    memory_shares: bool = Field(
        default=False,
        description="publish whole GPUs shareable by memory (DRAConsumableCapacity, on by "
                    "default since Kubernetes 1.36): claims asking `capacity.requests.memory` "
                    "share a GPU in 1Gi steps; a claim asking none takes all its memory. Off "
                    "by default: a shareable GPU has no partitions, and is held alone only by "
                    "claims that ask all of it (docs/dra-driver.md)")


class NetDriverCni(Section):
    """The NIC hand-off's CNI plugin `toposerve-nic`, installed on each node by
    the NIC driver's init container (docs/net-handoff.md)."""

    install: bool = Field(default=True,
                          description="write the `toposerve-nic` executable into `binDir`")
    bin_dir: AbsPath = Field(default="/opt/cni/bin",
                             description="the container runtime's CNI bin dir on the host")
    plugin: AbsPath = Field(default=str(DEFAULT_PLUGIN),
                            description="the static `toposerve-nic` binary in the image "
                                        "(`make nic-cni` builds it), copied to `binDir`")
    conf_dir: AbsPath = Field(default="/etc/cni/net.d",
                              description="the container runtime's CNI config dir on the host")
    chain_into: str | None = Field(
        default=None, pattern=r"^[^/]+\.conflist$",
        description="the pod network's conflist in `confDir` to add `toposerve-nic` to, last "
                    "in `plugins`, if absent (the file is otherwise left as it was, replaced "
                    "atomically; needs `install`); unset: chain it yourself")


class NetDriver(PluginDriver):
    """The NIC DRA driver `net.toposerve.io`: a DaemonSet of `toposerve driver
    net` on the host network with NET_ADMIN and SYS_ADMIN, its service account
    and RBAC (docs/net-driver.md)."""

    enabled: bool = Field(default=False,
                          description="render this component (off unless asked for: it runs "
                                      "with NET_ADMIN and SYS_ADMIN on every node it selects)")
    netns_dir: AbsPath = Field(default="/run/netns",
                               description="where pod network namespaces are pinned on the "
                                           "host, mounted with HostToContainer propagation")
    keep_virtual: bool = Field(default=False,
                               description="also publish interfaces without a PCI device "
                                           "(veth, bridge, ...)")
    interfaces: str | None = Field(default=None,
                                   description="publish only interfaces whose whole name "
                                               "matches this regular expression")
    exclude_interfaces: str | None = Field(default=None,
                                           description="never publish interfaces whose whole "
                                                       "name matches this regular expression")
    cni: NetDriverCni = Field(default_factory=NetDriverCni,
                              description="the hand-off's CNI plugin on each node")


class AdmissionPolicy(Section):
    """The ValidatingAdmissionPolicies: a node's driver writes only the
    ResourceSlices of its own node (`spec.nodeName` equal to the node name in
    its service-account token); the router and the extender change on pods
    only the label or annotations they own, never a pod's spec."""

    enabled: bool = Field(default=True, description="render this component")
    include_net_driver: bool = Field(
        default=False, description="also restrict the NIC driver's service account "
                                   "(`<namePrefix>-net-driver`) when this install does not "
                                   "render the NIC driver (it is restricted whenever "
                                   "`netDriver.enabled`)")


class DeviceClasses(Section):
    """The DeviceClasses claims name: GPU, GPU memory share, NIC and RDMA-capable NIC."""

    enabled: bool = Field(default=True, description="render this component")
    gpu: str = Field(default="gpu.toposerve.io", pattern=DNS_SUBDOMAIN, max_length=253,
                     description="class of every `gpu.toposerve.io` device")
    gpu_share: str = Field(
        default="gpu-share.toposerve.io", pattern=DNS_SUBDOMAIN, max_length=253,
        description="`gpu.toposerve.io` devices that allow multiple allocations (GPUs of "
                    "drivers with `gpuDriver.memoryShares`): a claim of it asking "
                    "`capacity.requests.memory` gets a share, never a whole GPU that has that "
                    "much memory")
    nic: str = Field(default="nic.toposerve.io", pattern=DNS_SUBDOMAIN, max_length=253,
                     description="class of every `net.toposerve.io` device")
    rdma_nic: str = Field(default="rdma-nic.toposerve.io", pattern=DNS_SUBDOMAIN,
                          max_length=253, description="NICs whose `rdma` attribute is true")
    extended_resource_name: str | None = Field(
        default=None, pattern=EXTENDED_RESOURCE,
        description="`spec.extendedResourceName` of the GPU class: a pod asking "
                    "`resources.limits` for this name gets GPUs of this driver through a claim "
                    "the scheduler makes, on nodes where no device plugin advertises the name "
                    "(allocatable absent or 0); e.g. `nvidia.com/gpu` once NVIDIA's device "
                    "plugin is gone. null: only the implicit "
                    "`deviceclass.resource.kubernetes.io/<gpu>`")

    @field_validator("extended_resource_name")
    @classmethod
    def _extended_resource(cls, v: str | None) -> str | None:
        # the apiserver's rules beyond the pattern: names under kubernetes.io are
        # Kubernetes' own, and `requests.<domain>` must be a DNS subdomain (quota)
        if v is None:
            return v
        if "kubernetes.io/" in v:
            raise ValueError(f"{v!r} is in the kubernetes.io domain, which Kubernetes "
                             "keeps for its own resources: use a domain of yours")
        if len("requests." + v.split("/", 1)[0]) > 253:
            raise ValueError(f"the domain of {v!r} is longer than 244 characters")
        return v


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` laid on ``base``: mappings merge key by key, anything else (a
    list, a scalar, null) replaces what was there."""
    out = dict(base)
    for key, value in over.items():
        below = out.get(key)
        out[key] = (merged(below, value) if isinstance(below, Mapping)
                    and isinstance(value, Mapping) else value)
    return out


def _over(default: Mapping[str, Any]) -> Any:
    """A component's ``config`` in values: a mapping is merged over the
    install's default for it (apiVersion and kind included) and then
    validated by the component's own model, so values give only what
    they change."""
    def validate(value: Any) -> Any:
        return merged(default, value) if isinstance(value, Mapping) else value
    return field_validator("config", mode="before")(validate)


EXTENDER_CONFIG: dict[str, Any] = {"apiVersion": API_VERSION, "kind": "ExtenderConfig"}


class ExtenderNetworkPolicy(Section):
    """Who may call the extender: it answers filter, prioritize and preempt
    calls without authentication, as the scheduler makes them."""

    enabled: bool = Field(
        default=True,
        description="a NetworkPolicy admitting to the extender's port only this install's "
                    "scheduler pods and `from`; rendered while the extender and the scheduler "
                    "are both on the pod network (a policy cannot tell pods on the node's "
                    "network apart)")
    from_: list[dict[str, Any]] = Field(
        default_factory=list, alias="from", max_length=16,
        description="more NetworkPolicyPeers it admits: Prometheus's pods, with "
                    "`monitoring.serviceMonitor` (e.g. [{namespaceSelector: {matchLabels: "
                    "{kubernetes.io/metadata.name: monitoring}}}])")


class Extender(Placement):
    """The scheduler extender (`toposerve extender`): Deployment, Service,
    RBAC and its `ExtenderConfig`."""

    enabled: bool = Field(default=True, description="render this component")
    resources: Resources = sized("50m", "128Mi", "1Gi")
    replicas: int = Field(default=1, ge=1, description="extender pods")
    port: int = Field(default=8888, ge=1, le=65535,
                      description="HTTP port (pod and Service) the scheduler calls")
    host_network: bool = Field(
        default=False,
        description="its pods on the node's network (the local cluster's values); with "
                    "`scheduler.hostNetwork` too and no `scheduler.extenderURL` it listens "
                    "on 127.0.0.1 and each scheduler pod runs beside one")
    network_policy: ExtenderNetworkPolicy = Field(default_factory=ExtenderNetworkPolicy)
    decision_key_secret: Label | None = Field(
        default=None, description="Secret whose `key` signs the placement decisions, mounted "
                                  "into every replica; default `<namePrefix>-extender-key`, "
                                  "made by `--component secrets`")
    config: ExtenderConfig = Field(
        default_factory=ExtenderConfig,
        description="its `ExtenderConfig` (docs/extender.md); `server` is set by the install: "
                    "`port` above, on every address (127.0.0.1 when it and the scheduler are "
                    "on the node's network and no `scheduler.extenderURL` is given)")

    _config_over_default = _over(EXTENDER_CONFIG)


class Scheduler(Placement):
    """A second kube-scheduler with the extender wired in; workloads choose
    it with `spec.schedulerName`."""

    enabled: bool = Field(default=True, description="render this component")
    resources: Resources = sized("50m", "64Mi")
    scheduler_name: Label = Field(default="toposerve-scheduler",
                                  description="the `spec.schedulerName` workloads select")
    ungrouped_scheduler_name: Label | None = Field(
        default="toposerve-ungrouped",
        description="a second profile of this scheduler for pods of no group: the extender "
                    "keeps them off what groups were promised, and the scheduler samples "
                    "nodes (its adaptive `percentageOfNodesToScore`, as the stock one) "
                    "rather than filtering every node as groups need; null: none")
    image: SchedulerImage = Field(default_factory=SchedulerImage,
                                  description="kube-scheduler image")
    replicas: int = Field(default=1, ge=1, description="scheduler pods (one leads)")
    secure_port: int = Field(default=10269, ge=1, le=65535,
                             description="its HTTPS port (its probes'; on the node's network "
                                         "not the default scheduler's 10259)")
    host_network: bool = Field(
        default=False, description="its pods on the node's network (the local cluster's values)")
    extender_url: str | None = Field(
        default=None, alias="extenderURL", pattern=r"^https?://[^/\s]+(/\S*)?$",
        description="URL prefix the scheduler calls; default the extender's Service, "
                    "http://(namePrefix)-extender.(namespace).svc:(extender.port); with both "
                    "on the node's network http://127.0.0.1:(extender.port), each scheduler "
                    "pod beside an extender pod")
    extender_weight: int = Field(default=1, ge=1, description="weight of its priorities")
    extender_timeout_seconds: float = Field(default=5.0, ge=MIN_TIMEOUT_S, le=MAX_TIMEOUT_S,
                                            description="per call; past it the call is ignored")

    @model_validator(mode="after")
    def _own_profiles(self) -> Scheduler:
        # this scheduler runs beside the cluster's own: a profile of that one's name
        # would have both bind the same pods; two of one name stop it at start
        names = [("schedulerName", self.scheduler_name),
                 ("ungroupedSchedulerName", self.ungrouped_scheduler_name)]
        for field, name in names:
            if name == "default-scheduler":
                raise ValueError(f"{field}: default-scheduler is the cluster's own scheduler's, "
                                 "and both would schedule the same pods; give this one a name "
                                 "of its own (e.g. toposerve-scheduler)")
        if self.ungrouped_scheduler_name == self.scheduler_name:
            raise ValueError(f"ungroupedSchedulerName: {self.scheduler_name!r} is already "
                             "schedulerName; give the profile for pods of no group another "
                             "name, or null for none")
        return self


class RedisImage(Image):
    """The Redis image."""

    repository: Repository = Field(default="docker.io/library/redis",
                                   description="image name without tag")
    tag: Tag = Field(default="7.4-alpine", description="image tag")


class RouterRedis(Placement):
    """Redis for the router pair: the Responses store and the routing
    decisions the replicas share. One pod, no persistence: when it restarts,
    stored turns are gone (their chains answer 404) and the replicas share
    nothing until it is back (each routes on alone)."""

    enabled: bool = Field(default=True, description="render it; false: give `url`")
    resources: Resources = sized("50m", "64Mi", "512Mi")
    max_memory: str = Field(
        default="384mb", pattern=r"^[1-9][0-9]*(b|kb|mb|gb)$",
        description="Redis's `maxmemory`, under the memory limit: past it the stored turns "
                    "and shared decisions used longest ago go first (each has a TTL), rather "
                    "than the pod being killed for memory")
    url: str | None = Field(default=None, pattern=r"^rediss?://\S+$",
                            description="an existing Redis instead, redis://HOST:PORT/DB")
    image: RedisImage = Field(default_factory=RedisImage)
    port: int = Field(default=6379, ge=1, le=65535, description="its Service port")
    password_secret: Label | None = Field(
        default=None, description="Secret whose `password` Redis requires and the router "
                                  "sends; default `<namePrefix>-router-redis-auth`, made by "
                                  "`--component secrets`")
    tls_secret: Label | None = Field(
        default=None, description="a `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`, "
                                  "`ca.crt`) for `<namePrefix>-router-redis.<namespace>.svc`: "
                                  "Redis then serves TLS only and the router verifies it; "
                                  "with `url`, only its `ca.crt` is used")
    allow_unauthenticated: bool = Field(
        default=False, description="no password: Redis open to whatever reaches it (the "
                                   "NetworkPolicy still admits only the router's pods)")


class RouterKeys(Section):
    """The Secret of API keys: each data entry is a tenant, its value that
    tenant's keys, one a line. The install renders it without data and
    never writes any: fill it with kubectl (the router reloads it live)."""

    enabled: bool = Field(default=True, description="keys required (401 without one)")
    secret_name: Label | None = Field(default=None, description="default "
                                                                "`<namePrefix>-router-keys`")


class RouterInferencePool(Section):
    """An `InferencePool` (`inference.networking.k8s.io/v1`) for the router
    in `endpoint-picker` mode (docs/gateway.md): rendered in the router's
    namespace (its `endpointPickerRef` names a Service of its own namespace,
    the router's), pointing at the router's Service and gRPC port; the
    router's discovery is then that pool (it replaces `config.discovery`).
    The cluster needs the extension's CRD."""

    create: bool = Field(default=False, description="render the InferencePool")
    name: Label | None = Field(default=None, description="its name; default "
                                                         "`<namePrefix>-pool`")
    selector: dict[LabelKey, LabelValue] = Field(
        default_factory=dict, max_length=64, description="labels of the model servers' pods "
                                          "(`spec.selector.matchLabels`), in the router's "
                                          "namespace")
    target_ports: list[Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=lambda: [8000], min_length=1, max_length=8,
        description="the ports each pod serves on, each an endpoint of its own")
    app_protocol: Literal["http", "kubernetes.io/h2c"] | None = Field(
        default=None, description="how the gateway speaks to the model servers; none: the "
                                   "CRD's default (HTTP/1.1)")
    failure_mode: Literal["FailOpen", "FailClose"] = Field(
        default="FailClose",
        description="what the gateway does while the picker cannot answer: FailClose refuses "
                    "the request, FailOpen sends it on with the gateway's own balancing")

    @model_validator(mode="after")
    def _complete(self) -> RouterInferencePool:
        if self.create and not self.selector:
            raise ValueError("selector: give the labels of the model servers' pods, e.g. "
                             "{app: vllm-llama}")
        if len(set(self.target_ports)) != len(self.target_ports):
            raise ValueError(f"targetPorts {self.target_ports}: a port appears twice")
        return self


# the model servers an install routes to unless told otherwise
ROUTER_CONFIG: dict[str, Any] = {
    "apiVersion": API_VERSION, "kind": "RouterConfig",
    "discovery": {"kubernetes": {"namespace": "default", "labelSelector": "app=vllm"}}}


def _model_servers() -> RouterConfig:
    return RouterConfig.model_validate(ROUTER_CONFIG)


class Router(Placement):
    """The OpenAI-compatible router (`toposerve router`): a Deployment whose
    every replica serves behind the Service (active-active: no Lease, the
    replicas share their view over the install's Redis; docs/router-ha.md),
    or with `config.ha.mode: hot-standby` a pair that elects a leader on a
    Lease (the leader labels its pod `toposerve.io/router-role: leader`,
    which the Service selects); its Service, ConfigMap, RBAC,
    PodDisruptionBudget, the API-key Secret and Redis. In `endpoint-picker`
    mode the same replicas answer a Gateway's external-processing calls
    instead (docs/gateway.md), a hot-standby pair unless the config says
    otherwise."""

    enabled: bool = Field(default=True, description="render this component")
    resources: Resources = sized("250m", "256Mi", "2Gi")
    namespace: Label | None = Field(
        default="toposerve-router",
        description="namespace of the router and its Redis: apart from the drivers' root pods "
                    "(docs/security.md); none: the release's")
    create_namespace: bool = Field(
        default=True, description="render that namespace (with the `restricted` pod security "
                                  "level); false: it exists already")
    mode: Literal["standalone", "endpoint-picker"] = Field(
        default="standalone",
        description="standalone: the router serves the OpenAI API and relays to the model "
                    "servers; endpoint-picker: it is a Gateway's endpoint picker "
                    "(`toposerve router --mode endpoint-picker`), the Service exposing its "
                    "gRPC port (docs/gateway.md)")
    replicas: int = Field(default=2, ge=1, description="router pods (active-active: all serve; "
                                                          "hot-standby: one leads; 1: alone)")
    port: int = Field(default=8080, ge=1, le=65535,
                      description="HTTP port (pod and Service); in endpoint-picker mode it "
                                  "serves only /health, /ready and /metrics")
    picker_port: int = Field(
        default=9002, ge=1, le=65535,
        description="endpoint-picker mode: the gRPC (ext_proc) port of the pod and the "
                    "Service, `endpointPicker.port` of its config (9002: where gateways "
                    "expect a picker)")
    inference_pool: RouterInferencePool = Field(default_factory=RouterInferencePool)
    shutdown_delay_seconds: float = Field(
        default=5.0, ge=0, description="after SIGTERM a pod serves on this long, unready and "
                                       "without the Lease, while Services stop sending to it")
    config: RouterConfig = Field(
        default_factory=_model_servers,
        description="its `RouterConfig` (docs/router-config.md); the install sets `server`, "
                    "`ha`, the Redis `responses` store, the key Secret and every kubeconfig")
    redis: RouterRedis = Field(default_factory=RouterRedis)
    api_keys: RouterKeys = Field(default_factory=RouterKeys, alias="apiKeys")
    host_network: bool = Field(
        default=False,
        description="the router and its Redis on the node's network, listening on 127.0.0.1 "
                    "only: for a node whose pod network the host cannot reach (the local "
                    "cluster's real node). Replica i is then a Deployment of its own on "
                    "`port` + i (two pods of one node cannot share a port), Redis listens on "
                    "127.0.0.1:`redis.port` and the router dials it there; a client dials the "
                    "leading replica's port, the Service and the NetworkPolicy do not apply")

    _config_over_default = _over(ROUTER_CONFIG)

    @model_validator(mode="after")
    def _picker(self) -> Router:
        pool = self.inference_pool
        if pool.create and self.mode != "endpoint-picker":
            raise ValueError("inferencePool.create: the pool's endpointPickerRef is the "
                             "router's gRPC port, served in mode endpoint-picker only: set "
                             "router.mode: endpoint-picker")
        if pool.create and (self.config.discovery.static or self.config.discovery.inference_pool):
            raise ValueError("inferencePool.create: the router then reads the pool it "
                             "creates; leave config.discovery.static and "
                             "config.discovery.inferencePool out")
        if self.mode == "endpoint-picker" and (why := unfit(self.config)):
            raise ValueError(f"config.{why}")  # what the pod would refuse at start
        if self.mode == "endpoint-picker":
            # on the node's network replica i listens on port + i and picker_port + i
            span = self.replicas if self.host_network else 1
            if abs(self.picker_port - self.port) < span:
                raise ValueError(f"pickerPort {self.picker_port} and port {self.port}: the "
                                 "pod listens on both" + (f", each replica on the next "
                                                          f"({span} replicas)"
                                                          if span > 1 else "")
                                 + "; give ports further apart")
        return self

    @model_validator(mode="after")
    def _host_network_redis(self) -> Router:
        if self.host_network and self.redis.tls_secret and self.redis.url is None:
            raise ValueError("redis.tlsSecret names the Redis Service, which hostNetwork "
                             "does not use: give redis.url with it, or no TLS")
        return self


# a Prometheus duration (30s, 1m30s)
PromDuration = Annotated[str, Field(min_length=1, pattern=r"^(0|([0-9]+y)?([0-9]+w)?([0-9]+d)?"
                                                          r"([0-9]+h)?([0-9]+m)?([0-9]+s)?"
                                                          r"([0-9]+ms)?)$")]


class Scrape(Section):
    """Prometheus operator objects (`monitoring.coreos.com/v1`) that scrape
    components' `/metrics`; the cluster needs the operator's CRDs."""

    enabled: bool = Field(default=False, description="render the objects")
    interval: PromDuration = Field(default="30s", description="how often Prometheus scrapes")
    scrape_timeout: PromDuration | None = Field(
        default=None, description="per scrape, at most `interval`; none: Prometheus' default")
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        description="more labels on the objects, for a Prometheus that selects its monitors "
                    "by label (kube-prometheus-stack: `release: <its release>`)")

    @model_validator(mode="after")
    def _timeout_within_interval(self) -> Scrape:
        # Prometheus refuses a scrape config whose timeout exceeds its interval
        if self.scrape_timeout and _seconds(self.scrape_timeout) > _seconds(self.interval):
            raise ValueError(f"scrapeTimeout {self.scrape_timeout} is longer than interval "
                             f"{self.interval}: give at most the interval")
        return self


def _seconds(duration: str) -> float:
    unit = {"y": 365 * 86400, "w": 7 * 86400, "d": 86400, "h": 3600, "m": 60, "s": 1,
            "ms": 0.001}
    return sum(int(n) * unit[u] for n, u in re.findall(r"([0-9]+)(ms|[ywdhms])", duration))


class GrafanaDashboard(Section):
    """The chart's Grafana dashboard (`files/dashboards/toposerve.json`) in a
    ConfigMap that Grafana's dashboard sidecar loads."""

    enabled: bool = Field(default=False, description="render the ConfigMap")
    namespace: Label | None = Field(
        default=None, description="its namespace (one the sidecar watches); none: the "
                                  "drivers' (`namespace`)")
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=lambda: {"grafana_dashboard": "1"},
        description="labels the sidecar finds dashboards by (its `label` and `labelValue`)")
    annotations: dict[LabelKey, str] = Field(
        default_factory=dict, description="e.g. the sidecar's folder annotation")


class Monitoring(Section):
    """What an operator scrapes and looks at, each part off unless asked for
    (docs/install.md, Monitoring)."""

    service_monitor: Scrape = Field(
        default_factory=Scrape,
        description="ServiceMonitors of the router (every replica, through a headless Service "
                    "of its own: a hot-standby pair's Service reaches the leader only) and "
                    "the extender")
    pod_monitor: Scrape = Field(
        default_factory=Scrape,
        description="a PodMonitor of the GPU driver's DaemonSet; needs `gpuDriver.httpPort` "
                    "(a fixed port) and the pod network (the NIC driver, on the node's, "
                    "serves /metrics on its loopback only)")
    grafana_dashboard: GrafanaDashboard = Field(default_factory=GrafanaDashboard)


class PullSecret(Section):
    name: Annotated[str, Field(pattern=DNS_SUBDOMAIN, max_length=253)] = Field(
        description="a Secret of type kubernetes.io/dockerconfigjson in each namespace the "
                    "install puts pods in")


class InstallValues(Section):
    """Values that `toposerve manifests render` turns into Kubernetes objects."""

    api_version: Literal["toposerve.io/v1"] = Field(default="toposerve.io/v1")
    kind: Literal["InstallValues"] = Field(default="InstallValues",
                                           description="always InstallValues")
    namespace: Label | None = Field(
        default=None, description="namespace of the drivers, the extender and the scheduler; "
                                  "default: the release's (`helm install -n`; `toposerve "
                                  "manifests render`: toposerve-system)")
    name_prefix: Label = Field(default="toposerve", max_length=40,
                               description="prefix of every object name")
    api_server: ApiServer | None = Field(
        default=None, description="how pods reach the API server; default: the in-cluster "
                                  "service, as any pod does")
    image: ToposerveImage = Field(default_factory=ToposerveImage,
                                  description="the toposerve image (driver and extender)")
    image_pull_secrets: list[PullSecret] = Field(
        default_factory=list, max_length=16,
        description="Secrets every pod pulls its images with (a private registry): the same "
                    "names in the drivers' and the router's namespaces")
    global_: dict[str, Any] = Field(
        default_factory=dict, alias="global",
        description="Helm's values shared with a parent chart (toposerve as a dependency); "
                    "not read")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        default="info", description="log level of toposerve's components")
    gpu_driver: GpuDriver = Field(default_factory=GpuDriver)
    net_driver: NetDriver = Field(default_factory=NetDriver)
    admission_policy: AdmissionPolicy = Field(default_factory=AdmissionPolicy)
    device_classes: DeviceClasses = Field(default_factory=DeviceClasses)
    extender: Extender = Field(default_factory=Extender)
    scheduler: Scheduler = Field(default_factory=Scheduler)
    router: Router = Field(default_factory=Router)
    monitoring: Monitoring = Field(default_factory=Monitoring)

    @model_validator(mode="after")
    def _scrapes_reach_the_extender(self) -> InstallValues:
        if self.monitoring.service_monitor.enabled and self.extender_policy() and \
                not self.extender.network_policy.from_:
            raise ValueError(
                "monitoring.serviceMonitor: the extender's NetworkPolicy admits only the "
                "scheduler, so Prometheus could not scrape it; add Prometheus's pods to "
                "extender.networkPolicy.from (e.g. [{namespaceSelector: {matchLabels: "
                "{kubernetes.io/metadata.name: monitoring}}}]) or set "
                "extender.networkPolicy.enabled: false")
        return self

    def extender_policy(self) -> bool:
        """Whether the extender's NetworkPolicy is rendered (as the chart decides)."""
        e, s = self.extender, self.scheduler
        return (e.enabled and e.network_policy.enabled and s.enabled and not e.host_network
                and not s.host_network)

    def enabled(self) -> list[Component]:
        on = {"gpu-driver": self.gpu_driver.enabled, "net-driver": self.net_driver.enabled,
              "admission-policy": self.admission_policy.enabled,
              "device-classes": self.device_classes.enabled,
              "extender": self.extender.enabled, "scheduler": self.scheduler.enabled,
              "router": self.router.enabled,
              # random values: rendered only when asked for (docs/security.md)
              "secrets": False}
        return [c for c in COMPONENTS if on[c]]


def _over_schema(defs: Mapping[str, Any], prop: dict[str, Any],
                 default: Mapping[str, Any]) -> dict[str, Any]:
    """``prop``'s schema as values give it over ``default``: what the default
    holds is required at no depth (its model inlined without those
    requirements); list items stay whole, as a list replaces the default's."""
    if "anyOf" in prop:
        return {**prop, "anyOf": [_over_schema(defs, a, default) for a in prop["anyOf"]]}
    if "$ref" not in prop:
        return prop
    model = dict(defs[prop["$ref"].rsplit("/", 1)[-1]])
    required = [r for r in model.pop("required", []) if r not in default]
    model["properties"] = {
        k: _over_schema(defs, p, default[k]) if isinstance(default.get(k), Mapping) else p
        for k, p in model.get("properties", {}).items()}
    return {**model, **({"required": required} if required else {}),
            **{k: v for k, v in prop.items() if k != "$ref"}}


def values_schema() -> dict[str, Any]:
    """The JSON Schema of a values file (what a Helm chart ships as
    ``values.schema.json``): the models' own, except that a file names its
    apiVersion and kind (defaults only without a file) and a component's
    ``config`` need not repeat what the install's default for it holds."""
    schema = InstallValues.model_json_schema(by_alias=True)
    schema["required"] = ["apiVersion", "kind", *schema.get("required", [])]
    defs = schema["$defs"]
    for section, default in ((Extender, EXTENDER_CONFIG), (Router, ROUTER_CONFIG)):
        props = defs[section.__name__]["properties"]
        props["config"] = _over_schema(defs, props["config"], default)
    _closed(schema)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def _closed(node: Any) -> None:
    """A mapping whose keys must match a pattern refuses other keys, as the
    models do (pydantic leaves additionalProperties out there)."""
    if isinstance(node, dict):
        if "patternProperties" in node:
            node.setdefault("additionalProperties", False)
        for v in node.values():
            _closed(v)
    elif isinstance(node, list):
        for v in node:
            _closed(v)


def _scalar(text: str) -> Any:
    """A --set value as YAML reads it (true, 3, [a, b], {k: v}); anything
    YAML cannot read stays the string it was."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def apply_sets(doc: dict[str, Any], sets: Sequence[str]) -> dict[str, Any]:
    """``key.sub=value`` assignments over a values document (camelCase keys);
    ``\\.`` is a dot within a key, as helm reads it (nodeSelector.nvidia\\.com/gpu)."""
    out = dict(doc)
    for item in sets:
        key, eq, value = item.partition("=")
        path = [p.replace("\\.", ".") for p in re.split(r"(?<!\\)\.", key.strip())]
        if not eq or not all(path):
            raise ConfigError(f"--set {item!r}: expected key.path=value, "
                              f"e.g. apiServer.host=127.0.0.1")
        node = out
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if child is None:
                child = {}
            elif not isinstance(child, dict):
                raise ConfigError(f"--set {item!r}: {'.'.join(path[:i + 1])} is not a "
                                  f"mapping, so it has no field {path[i + 1]!r}")
            node[part] = child = dict(child)
            node = child
        node[path[-1]] = _scalar(value)
    return out


def load_values(path: str | Path | None = None, sets: Sequence[str] = ()) -> InstallValues:
    """The values file (or none: every default) with ``--set`` over it."""
    doc: Any = {"apiVersion": API_VERSION, "kind": KIND}
    source = "values"
    if path is not None:
        source = str(path)
        doc = read_document(path)
        if not isinstance(doc, dict):
            raise ConfigError(f"{path}: expected a YAML mapping with apiVersion and kind")
    if sets:
        source += " with --set " + " ".join(sets)
    return parse_document(apply_sets(doc, sets), InstallValues, KIND, source)
