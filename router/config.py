"""The router's configuration file (``kind: RouterConfig``). These models
are the schema and the reference: every field says what it does."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

import structlog
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from toposerve.topology.config_file import load_file
from toposerve.topology.labels import DialectName
from toposerve.topology.place import NodePlace
from toposerve.topology.workloads import LLMD_ROLE
from toposerve.wire.addresses import dialable, zmq_endpoint
from toposerve.wire.kv_transfer import SGLANG_BOOTSTRAP_PORT

MAX_WORKERS = 64


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class ServerConfig(Section):
    """The HTTP server and how it talks to model servers."""

    host: str = Field(default="127.0.0.1", description="address to listen on")
    port: int = Field(default=8080, ge=0, le=65535, description="port to listen on")
    workers: int = Field(default=1, ge=1, le=MAX_WORKERS,
                         description="router processes serving this port (SO_REUSEPORT: the "
                                     "kernel spreads connections over them), so one pod uses "
                                     "that many cores; they share in-flight counts, sessions "
                                     "and routing decisions through Redis with ha.enabled, "
                                     "else through a socket of their own (docs/router-ha.md)")
    # 1M tokens of text is about 4 MiB (some 4 bytes a token); JSON framing
    # and escaping at most double it
    max_body_bytes: int = Field(default=8 * 2**20, alias="maxBodyBytes", gt=0,
                                description="larger request bodies get 413; the default "
                                            "holds a 1M-token prompt (about 4 MiB of text "
                                            "at some 4 bytes a token) twice over, for JSON "
                                            "framing and escaping")
    max_inflight_bytes: int = Field(default=128 * 2**20, alias="maxInflightBytes", gt=0,
                                    description="request bodies held at once, counted as "
                                                "they are read: a request that would pass "
                                                "it (by its Content-Length, or as it is "
                                                "read) gets 429 with Retry-After; at least "
                                                "maxBodyBytes")
    max_inflight_requests: int = Field(default=4096, alias="maxInflightRequests", gt=0,
                                       description="requests held at once (waiting in flow "
                                                   "control included); the next gets 429 "
                                                   "with Retry-After")
    retry_after_s: int = Field(default=1, alias="retryAfterSeconds", ge=1, le=60,
                               description="the Retry-After of a 429 for either limit above "
                                           "(the OpenAI SDKs wait that long, up to 60 s, "
                                           "before they retry)")
    max_header_bytes: int = Field(default=8192, alias="maxHeaderBytes", ge=1024,
                                  description="a longer header line gets 431, a longer "
                                              "request line 414 (JSON errors); lines over "
                                              "8 times this are cut off by the HTTP parser "
                                              "(a JSON 400 that names neither)")
    client_timeout_s: float = Field(default=60.0, alias="clientTimeoutSeconds", gt=0, le=3600,
                                    description="a request's body must arrive within this "
                                                "of its head (else 408), a connection must "
                                                "send a whole request head within this of "
                                                "opening or of its last answer, an idle "
                                                "kept-alive connection is closed after it, "
                                                "and a client that reads nothing of its "
                                                "answer for this long is cut off (its slot "
                                                "and bytes freed)")
    max_list_items: int = Field(default=8192, alias="maxListItems", gt=0,
                                description="the most items a request's messages (chat) or "
                                            "input (Responses) may hold: more get 413 before "
                                            "the body is validated, so a body of many tiny "
                                            "items cannot hold the event loop")
    max_json_values: int = Field(default=2**17, alias="maxJsonValues", gt=0,
                                 description="the most JSON values a request body may hold "
                                             "(the body, every array element, every object "
                                             "member; a prompt of token ids counts one a "
                                             "token): more get 413. A body that may hold "
                                             "more than a few thousand is parsed and "
                                             "counted in a worker process first, so the "
                                             "event loop parses only bodies it serves, and "
                                             "this bounds what each costs it")
    max_answer_bytes: int = Field(default=16 * 2**20, alias="maxAnswerBytes", gt=0,
                                  description="the most of one model server's answer the "
                                              "router holds at once: a whole answer it "
                                              "reads (non-streamed, a prefill's) or one "
                                              "event of a stream it rewrites (Responses); "
                                              "past it the client gets 502. Held bytes "
                                              "count against maxInflightBytes too (the "
                                              "smaller of the two bounds an answer)")
    upstream_timeout_s: float = Field(default=600.0, alias="upstreamTimeoutSeconds", gt=0,
                                      description="longest silence from a model server")
    connect_timeout_s: float = Field(default=3.0, alias="connectTimeoutSeconds", gt=0,
                                     description="connecting to a model server")
    max_attempts: int = Field(default=3, alias="maxAttempts", ge=1,
                              description="endpoints tried before the first byte is sent")
    drain_timeout_s: float = Field(default=30.0, alias="drainTimeoutSeconds", gt=0,
                                   description="how long in-flight requests may take to "
                                               "finish when their endpoint is removed or the "
                                               "router stops (SIGTERM)")

    @model_validator(mode="after")
    def _a_body_fits(self) -> ServerConfig:
        if self.max_body_bytes > self.max_inflight_bytes:
            raise ValueError(f"maxBodyBytes ({self.max_body_bytes}) is over maxInflightBytes "
                             f"({self.max_inflight_bytes}): a body that large could never be "
                             "read; raise maxInflightBytes or lower maxBodyBytes")
        return self


class StaticEndpoint(Section, NodePlace):
    """One model server; its node's place pairs a decode endpoint with a prefill
    endpoint near it."""

    url: str = Field(description="http://HOST:PORT")
    role: str | None = Field(default=None, description="prefill, decode or prefill-decode")
    revision: str | None = Field(default=None, description="the model revision it serves")
    bootstrap_port: int | None = Field(default=None, alias="bootstrapPort", ge=1, le=65535,
                                       description="SGLang prefill server: its bootstrap port "
                                                   "(default disaggregation.bootstrapPort)")
    kv_events: str | None = Field(default=None, alias="kvEvents",
                                  description="ZMQ endpoint of its KV events, tcp://HOST:PORT")
    kv_events_replay: str | None = Field(default=None, alias="kvEventsReplay",
                                         description="ZMQ replay socket, tcp://HOST:PORT")

    @field_validator("url")
    @classmethod
    def _base_url(cls, v: str) -> str:
        if not re.fullmatch(r"https?://[^/\s]+", v):
            raise ValueError(f"{v!r}: give a URL with http:// or https:// and without /v1 "
                             "or another path, e.g. http://127.0.0.1:8000")
        try:
            dialable(v)
        except ValueError as err:
            raise ValueError(f"{v!r}: {err}; give http://HOST:PORT, e.g. "
                             "http://127.0.0.1:8000 or http://[::1]:8000") from None
        return v

    @field_validator("kv_events", "kv_events_replay")
    @classmethod
    def _zmq(cls, v: str | None) -> str | None:
        try:
            return None if v is None else zmq_endpoint(v)
        except ValueError as err:
            raise ValueError(f"{v!r}: {err}; give tcp://HOST:PORT, e.g. tcp://10.0.0.5:5557 "
                             "or tcp://[fd00::5]:5557, or ipc://PATH") from None


class PodDiscovery(Section):
    """What is read of each model pod, however the pods are found."""

    namespace: str = Field(default="default",
                           description="namespace of the model pods (and of the InferencePool)")
    kubeconfig: str | None = Field(
        default=None, description="default: $KUBECONFIG, ~/.kube/config, then in-cluster")
    role_label: str = Field(default=LLMD_ROLE, alias="roleLabel",
                            description="pod label carrying the role")
    revision_label: str | None = Field(
        default=None, alias="revisionLabel",
        description="a pod label read for the revision before the standard ones (the "
                    "DisaggregatedSet's revision, LeaderWorkerSet's template-revision-hash, "
                    "toposerve.io/revision, controller-revision-hash, first found wins)")
    kv_events_port: int | None = Field(default=None, alias="kvEventsPort", ge=1, le=65535,
                                       description="pods publish KV events on this port (an "
                                                   "InferencePool's Nth target port: this "
                                                   "port + N, as vLLM offsets a "
                                                   "data-parallel rank's)")
    kv_events_port_name: str | None = Field(
        default=None, alias="kvEventsPortName", pattern=r"^[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?$",
        description="the KV-event port from each pod's container port of this name "
                    "instead of kvEventsPort")
    watch_timeout_s: int = Field(default=300, alias="watchTimeoutSeconds", ge=1,
                                 description="how long one watch request lasts before "
                                             "it is renewed from the last resourceVersion "
                                             "(a LIST only after 410 Gone)")
    topology_labels: DialectName = Field(
        default=DialectName.TOPOSERVE, alias="topologyLabels",
        description="node-label dialect of the topology (toposerve, gke, kubernetes): "
                    "where each pod's node sits, read from its labels (needs get on nodes)")
    claim_devices: bool = Field(
        default=True, alias="claimDevices",
        description="read the devices each pod's ResourceClaims were allocated, the "
                    "ResourceSlices of its node and the DeviceTaintRules (needs get on "
                    "resourceclaims, list and watch on resourceslices and devicetaintrules, "
                    "create on events): a device with a NoSchedule or NoExecute taint takes "
                    "its pod out of rotation until the taint goes, and the devices' NVLink "
                    "domain, PCIe switch and root and NICs pair decode with prefill; costs "
                    "nothing for pods without claims. false: node labels only")


class KubernetesDiscovery(PodDiscovery):
    """Model servers found by watching pods."""

    label_selector: str = Field(alias="labelSelector", min_length=1,
                                description="which pods are model servers, e.g. app=vllm")
    port: int = Field(default=8000, ge=1, le=65535, description="their HTTP port")
    port_name: str | None = Field(
        default=None, alias="portName", pattern=r"^[a-z0-9]([-a-z0-9]{0,13}[a-z0-9])?$",
        description="take each pod's HTTP port from its container port of this name (as "
                    "a Service's targetPort does) instead of port: pods on the host "
                    "network, one port each; a pod without it is not routed to")


class InferencePoolDiscovery(PodDiscovery):
    """Model servers found as an ``InferencePool`` (inference.networking.k8s.io/v1, the
    Gateway API Inference Extension's) names them: the ready pods its selector matches,
    each of its target ports an endpoint (docs/endpoint-picker.md)."""

    name: str = Field(min_length=1, max_length=253,
                      pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$",
                      description="the InferencePool's name (in namespace); needs get, list "
                                  "and watch on inferencepools and pods there")


class DiscoveryConfig(Section):
    """Where the model servers are: a static list, Kubernetes pods by label, or both;
    or an InferencePool alone."""

    static: list[StaticEndpoint] = Field(default_factory=list,
                                         description="a fixed list of model servers")
    kubernetes: KubernetesDiscovery | None = Field(default=None,
                                                   description="watch pods instead")
    inference_pool: InferencePoolDiscovery | None = Field(
        default=None, alias="inferencePool",
        description="watch an InferencePool and the pods it selects (neither static nor "
                    "kubernetes beside it)")

    @model_validator(mode="after")
    def _one(self) -> DiscoveryConfig:
        if self.inference_pool is not None and (self.static or self.kubernetes is not None):
            raise ValueError("discovery.inferencePool names the model servers alone: give it "
                             "without discovery.static and discovery.kubernetes")
        if not self.static and self.kubernetes is None and self.inference_pool is None:
            raise ValueError("give discovery.static (a list of endpoints), "
                             "discovery.kubernetes (a label selector) or "
                             "discovery.inferencePool (an InferencePool's name)")
        return self


class ScrapeConfig(Section):
    """Reading each server's health and load."""

    interval_s: float = Field(default=1.0, alias="intervalSeconds", gt=0,
                              description="how often each endpoint's /metrics is read for "
                                          "its load; each read costs the server a metrics "
                                          "render and the router a parse")
    health_interval_s: float = Field(default=5.0, alias="healthIntervalSeconds", gt=0,
                                     description="how often /health is read (and the cache "
                                                 "config and process start time with it: "
                                                 "a restarted server's cache is empty); "
                                                 "every scrape while an "
                                                 "endpoint is unhealthy, so it comes back "
                                                 "at once")
    stale_after_s: float = Field(default=3.0, alias="staleAfterSeconds", gt=0,
                                 description="older metrics count as saturated; must "
                                             "exceed intervalSeconds + timeoutSeconds")
    timeout_s: float = Field(default=1.0, alias="timeoutSeconds", gt=0,
                             description="per scrape")

    @model_validator(mode="after")
    def _stale_after_a_scrape(self) -> ScrapeConfig:
        # otherwise every endpoint counts as saturated between two scrapes
        least = self.interval_s + self.timeout_s
        if self.stale_after_s <= least:
            raise ValueError(
                f"staleAfterSeconds ({self.stale_after_s:g}) must exceed intervalSeconds + "
                f"timeoutSeconds ({least:g}); raise staleAfterSeconds above {least:g}")
        return self


class PluginConfig(Section):
    """One filter, scorer or picker."""

    type: str = Field(description="plugin type name (see Plugin types)")
    weight: float = Field(default=1.0, ge=0, description="scorers: weight of the score")
    params: dict[str, Any] = Field(default_factory=dict, description="plugin parameters")


def _default_scorers() -> list[PluginConfig]:
    # Chosen by `make bench --ablation` over several agentic seeds and the
    # Mooncake trace (docs/benchmarks.md): prefix affinity first; new work where
    # prefill queues are short and caches have room; new conversations
    # where fewest live, so requests even out as sessions return. Prefix at
    # 4 rather than 3 keeps Mooncake's captured reuse at 99.1-99.7% (3:
    # 96.9-99.0%) at the same TTFT.
    return [PluginConfig(type="prefix-approx", weight=4.0),
            PluginConfig(type="prefill-cost", weight=1.0),
            PluginConfig(type="cache-room", weight=1.0),
            PluginConfig(type="conversations", weight=2.0),
            PluginConfig(type="session", weight=2.0)]


class ProfileConfig(Section):
    """How an endpoint is picked."""

    filters: list[PluginConfig] = Field(
        default_factory=lambda: [PluginConfig(type="model"), PluginConfig(type="healthy"),
                                 PluginConfig(type="not-saturated")],
        description="run in order; each drops endpoints")
    scorers: list[PluginConfig] = Field(default_factory=_default_scorers,
                                        description="weighted scores in [0, 1], summed; "
                                                    "one entry per scorer type")
    picker: PluginConfig = Field(default_factory=lambda: PluginConfig(type="max-score"),
                                 description="orders endpoints; the rest are retry fallbacks")

    @model_validator(mode="after")
    def _one_scorer_a_type(self) -> ProfileConfig:
        # a score is kept per type: a second entry would silently replace the first
        first: dict[str, int] = {}
        for i, s in enumerate(self.scorers):
            if s.type in first:
                raise ValueError(f"scorers[{i}].type: {s.type!r} is already scorers"
                                 f"[{first[s.type]}]; give each scorer type one entry "
                                 "(add the weights together)")
            first[s.type] = i
        return self


def _decode_profile() -> ProfileConfig:
    # A decode endpoint near the prefill endpoint (its KV comes from there),
    # then the router's own count of tokens in flight (decode memory) and the
    # scraped queue. Weight 4 (chosen in bench.pd_bench) keeps 96% of pulls
    # inside the NVLink domain against 79% at 2, at the same TTFT, while a
    # decode endpoint busiest on both load measures still loses to a remote
    # idle one. Decode-side prefix affinity saved no pulled bytes there.
    return ProfileConfig(scorers=[PluginConfig(type="near-prefill", weight=4.0),
                                  PluginConfig(type="inflight-tokens", weight=1.0),
                                  PluginConfig(type="queue", weight=1.0)])


class DisaggregationConfig(Section):
    """Prefill/decode split between endpoints of role prefill and role
    decode. nixl (vLLM's NixlConnector): the prefill endpoint computes the
    prompt's KV in a one-token request, then the decode endpoint is handed
    its ``kv_transfer_params``, pulls the KV and streams the answer. sglang:
    both get the request at once with the prefill server's bootstrap host,
    port and a random room; the answer comes from decode. Chat and
    completions are split either way, Responses-API requests with nixl only."""

    enabled: bool = Field(default=False, description="split requests when endpoints of both "
                                                     "roles serve the model")
    protocol: Literal["nixl", "sglang"] = Field(default="nixl",
                                                description="how the KV is handed over")
    bootstrap_port: int = Field(default=SGLANG_BOOTSTRAP_PORT, alias="bootstrapPort", ge=1,
                                le=65535,
                                description="sglang: the prefill servers' bootstrap port")
    decode: ProfileConfig = Field(default_factory=_decode_profile,
                                  description="how the decode endpoint is picked (a profile; "
                                              "default scorers near-prefill 4, inflight-tokens "
                                              "1, queue 1); the prefill endpoint is picked by "
                                              "profile")
    min_prefill_tokens: int = Field(
        default=0, alias="minPrefillTokens", ge=0,
        description="nixl: split only when at least this many prompt tokens are cached on no "
                    "prefill endpoint (the approximate prefix index's estimate); less work "
                    "runs whole on a decode endpoint, sparing the hop and the KV move")

    @model_validator(mode="after")
    def _threshold_needs_nixl(self) -> DisaggregationConfig:
        if self.min_prefill_tokens and self.protocol != "nixl":
            raise ValueError("minPrefillTokens needs protocol: nixl (SGLang's prefill and "
                             "decode servers serve only split requests); remove it or set 0")
        return self


class RevisionsConfig(Section):
    """How traffic is split between revisions of the model servers while two
    are live (a rollout). A request runs inside one revision, prefill and
    decode halves included; a session keeps its revision while it has a
    ready endpoint."""

    weights: dict[str, float] = Field(
        default_factory=dict,
        description="revision -> weight; when a live revision is named, traffic is split by "
                    "these (an unnamed revision gets none), else by each revision's ready "
                    "endpoints, so it follows the rollout pod by pod")

    @model_validator(mode="after")
    def _weights(self) -> RevisionsConfig:
        bad = sorted(r for r, w in self.weights.items() if w < 0)
        if bad:
            raise ValueError(f"revisions.weights: negative weight for {', '.join(bad)}; "
                             "give each a weight of 0 or more")
        return self


class LeaseConfig(Section):
    """The coordination.k8s.io/v1 Lease the router pair elects its leader with."""

    name: str = Field(default="toposerve-router", min_length=1, description="the Lease's name")
    namespace: str = Field(default="default", description="the Lease's namespace")
    kubeconfig: str | None = Field(
        default=None, description="default: $KUBECONFIG, ~/.kube/config, then in-cluster")
    identity: str | None = Field(default=None,
                                 description="this replica's holderIdentity (default: $POD_NAME, "
                                             "else host name and process id)")
    duration_s: int = Field(default=1, alias="leaseDurationSeconds", ge=1,
                            description="a holder that has not renewed for this long is taken "
                                        "over (measured on the taker's own clock from when "
                                        "it saw the last renewal)")
    renew_interval_s: float = Field(default=0.2, alias="renewIntervalSeconds", gt=0,
                                    description="how often the Lease is read and renewed")
    renew_deadline_s: float = Field(default=0.7, alias="renewDeadlineSeconds", gt=0,
                                    description="a leader that has not renewed for this long "
                                                "stops leading (less than "
                                                "leaseDurationSeconds, so it steps down before "
                                                "anyone may take over)")

    @model_validator(mode="after")
    def _timing(self) -> LeaseConfig:
        if not self.renew_interval_s < self.renew_deadline_s < self.duration_s:
            raise ValueError(
                f"need renewIntervalSeconds ({self.renew_interval_s:g}) < renewDeadlineSeconds "
                f"({self.renew_deadline_s:g}) < leaseDurationSeconds ({self.duration_s}); "
                "lower the first two or raise leaseDurationSeconds")
        return self


class SnapshotConfig(Section):
    """A replica that starts beside a running leader asks it for a snapshot
    of the routing state learnt from decisions, through Redis, so it is
    warm before the leader's next decisions reach it."""

    enabled: bool = Field(default=True, description="ask for a snapshot at start, and answer "
                                                     "others' requests while leading")
    max_bytes: int = Field(default=16 * 2**20, alias="maxBytes", gt=0,
                           description="the snapshot's size limit: the latest decision of each "
                                       "session and the most recent others, the oldest left "
                                       "out beyond it; a larger one is ignored")
    wait_s: float = Field(default=2.0, alias="waitSeconds", gt=0,
                          description="how long a starting replica waits for the snapshot "
                                      "(holding the decisions it hears meanwhile) before it "
                                      "goes on without")


class InflightShareConfig(Section):
    """What each router process tells the others sharing its view of the
    requests it has in flight to each endpoint, so that N processes do not
    each take an endpoint for idle (docs/router-ha.md: the over-commit)."""

    interval_s: float = Field(default=0.005, alias="intervalSeconds", gt=0, le=1,
                              description="a change of this process's in-flight counts is "
                                          "told the others within this (one message each "
                                          "time at most, whatever the request rate); the "
                                          "others' view of it lags by this plus the delivery")
    peer_timeout_s: float = Field(default=2.0, alias="peerTimeoutSeconds", gt=0, le=60,
                                  description="a process heard nothing from for this long "
                                              "counts as gone: its in-flight requests no "
                                              "longer count (each says where it stands every "
                                              "quarter of this, busy or not)")

    @model_validator(mode="after")
    def _timing(self) -> InflightShareConfig:
        if not self.interval_s < self.peer_timeout_s / 4:
            raise ValueError(f"intervalSeconds ({self.interval_s:g}) must be under a quarter "
                             f"of peerTimeoutSeconds ({self.peer_timeout_s:g}); lower "
                             "intervalSeconds or raise peerTimeoutSeconds")
        return self


class HAConfig(Section):
    """Router replicas serving one pool. Every replica watches the pool,
    scrapes and reads KV events itself; through Redis each tells the others
    where it sent each request (prefix index, conversations, sessions) and
    what it has in flight to each endpoint. active-active: every replica
    serves. hot-standby: the replicas elect a leader with a Lease and /ready
    answers 200 on the leader only, so a Service sends traffic there."""

    enabled: bool = Field(default=False, description="share the view with the other replicas "
                                                     "(needs responses.backend: redis, shared "
                                                     "by the replicas)")
    mode: Literal["active-active", "hot-standby"] = Field(
        default="hot-standby",
        description="active-active: every warm replica serves (/ready 200), no Lease; "
                    "hot-standby: the Lease's holder serves, the others wait warm")
    lease: LeaseConfig = Field(default_factory=LeaseConfig,
                               description="hot-standby: the Lease; either mode: its namespace "
                                           "and name name the replicas' Redis channel")
    snapshot: SnapshotConfig = Field(default_factory=SnapshotConfig)
    inflight: InflightShareConfig = Field(default_factory=InflightShareConfig)
    shutdown_delay_s: float = Field(
        default=0.0, alias="shutdownDelaySeconds", ge=0,
        description="on SIGTERM: release the Lease and answer /ready 503 at once, keep serving "
                    "this long (while Services stop sending here), then stop listening and "
                    "let in-flight requests finish")


def _redis_address(url: str) -> str:
    """``url`` when redis-py can connect to it as it reads it, else
    ValueError: it takes a database that is no number for 0, a bad scheme
    at the first connection."""
    parts = urlsplit(url)
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError("no socket path after unix://")
        return url
    if parts.scheme not in ("redis", "rediss"):
        raise ValueError("not redis://, rediss:// or unix://")
    dialable(url)
    if not re.fullmatch(r"/?\d*", parts.path):
        raise ValueError(f"the database {parts.path[1:]!r} is not a number")
    return url


class ResponsesStoreConfig(Section):
    """Where Responses-API turns are kept."""

    backend: Literal["memory", "redis"] = Field(default="memory",
                                                description="redis: shared by a router pair")
    max_items: int = Field(default=100_000, alias="maxItems", gt=0,
                           description="memory backend: oldest dropped beyond this")
    max_bytes: int = Field(default=256 * 2**20, alias="maxBytes", gt=0,
                           description="memory backend: the turns' stored bytes (their "
                                       "JSON); the oldest are dropped beyond this")
    tenant_share: float = Field(
        default=0.25, alias="tenantShare", gt=0, le=1,
        description="memory backend: the most of maxItems and of maxBytes one tenant's turns "
                    "may take; a tenant at its share drops its own oldest turns for new ones, "
                    "never another's. Without API keys every client is one tenant, which has "
                    "the whole store")
    ttl_s: float = Field(default=3600.0, alias="ttlSeconds", gt=0,
                         description="a stored turn expires after this; a chain's earlier "
                                     "turns live as long as its newest")
    sweep_interval_s: float = Field(default=30.0, alias="sweepIntervalSeconds", gt=0,
                                    description="memory backend: how often expired turns are "
                                                "dropped (Redis expires its own)")
    max_chain_bytes: int = Field(default=8 * 2**20, alias="maxChainBytes", gt=0,
                                 description="the most bytes of earlier turns a "
                                             "previous_response_id may bring into the "
                                             "request the model server gets (the chain's "
                                             "inputs and outputs); a longer chain gets 413 "
                                             "as soon as the walk reaches the turn past it "
                                             "(each turn's stored answer is never read by "
                                             "the walk). The assembled "
                                             "body counts against server.maxInflightBytes")
    max_chain_turns: int = Field(default=1000, alias="maxChainTurns", ge=1,
                                 description="each turn stores its own input and output and "
                                             "a link to the one before; a "
                                             "previous_response_id whose chain is longer "
                                             "gets 400")
    redis_url: str | None = Field(default=None, alias="redisUrl",
                                  description="redis://HOST:PORT/DB, for backend: redis; "
                                              "rediss:// for TLS")
    redis_password_file: str | None = Field(
        default=None, alias="redisPasswordFile",
        description="file holding the Redis password (AUTH), e.g. a key of a mounted Secret; "
                    "the Responses store and HA replication both use it")
    redis_ca_file: str | None = Field(
        default=None, alias="redisCaFile",
        description="CA bundle that verifies a TLS Redis (rediss://); unset: the system's")
    allow_unauthenticated: bool = Field(
        default=False, alias="allowUnauthenticated",
        description="start even when the Redis answers without a password. Off: such a Redis "
                    "stops the start, since whoever reaches it reads every tenant's stored "
                    "turns and can feed the replicas false routing decisions")

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, v: str | None) -> str | None:
        try:
            return None if v is None else _redis_address(v)
        except ValueError as err:
            raise ValueError(f"{v!r}: {err}; give redis://HOST:PORT/DB (rediss:// for TLS) "
                             "or unix://PATH") from None

    @model_validator(mode="after")
    def _redis(self) -> ResponsesStoreConfig:
        if self.backend == "redis" and not self.redis_url:
            raise ValueError("backend: redis needs redisUrl (e.g. redis://127.0.0.1:6379/0)")
        if self.redis_ca_file and not (self.redis_url or "").startswith("rediss://"):
            raise ValueError("redisCaFile needs a TLS redisUrl (rediss://HOST:PORT/DB)")
        return self

    def redis_options(self) -> dict[str, Any]:
        """redis-py client options beyond the URL: the password, read from its
        file now (a rotated Secret takes a restart), and the TLS CA."""
        out: dict[str, Any] = {}
        if self.redis_password_file is not None:
            with open(self.redis_password_file, encoding="utf-8") as f:
                out["password"] = f.read().strip()
        if self.redis_ca_file is not None:
            out["ssl_ca_certs"] = self.redis_ca_file
        return out


class KVEventsConfig(Section):
    """The precise prefix index fed by vLLM KV events."""

    tokenizer: str | None = Field(
        default=None, description="HF tokenizer.json, or 'bytes' for the simulator's byte "
                                  "tokens; unset: prefix-precise falls back to prefix-approx")
    chat_template: str | None = Field(
        default=None, alias="chatTemplate",
        description="a .jinja chat template for chat requests' tokens, as the engines' "
                    "--chat-template; unset: the one beside the tokenizer "
                    "(chat_template.jinja, or tokenizer_config.json's chat_template)")
    block_size: int = Field(default=16, alias="blockSize", gt=0,
                            description="the engines' KV block size, in tokens")


class SaturationConfig(Section):
    """When an endpoint counts as saturated (sessions leave it, filters drop it)."""

    queue_threshold: int = Field(default=5, alias="queueThreshold", ge=0,
                                 description="waiting requests that make an endpoint saturated")
    kv_usage_threshold: float = Field(default=0.9, alias="kvUsageThreshold", gt=0, le=1,
                                      description="KV-cache usage that does the same")


class Objective(Section):
    """An inference objective a request names in x-llm-d-inference-objective."""

    name: str = Field(min_length=1, description="the header's value")
    priority: int = Field(description="its priority band: higher goes first; negative = "
                                      "sheddable (shed as saturation rises, 429)")


class BandConfig(Section):
    """Caps on what one priority band may hold queued."""

    priority: int = Field(description="the band (an objective's priority)")
    max_requests: int = Field(default=1000, alias="maxRequests", gt=0,
                              description="queued requests beyond this get 429 at once")
    max_bytes: int = Field(default=256 * 2**20, alias="maxBytes", gt=0,
                           description="queued request bodies beyond this many bytes get "
                                       "429 at once")


class FairnessConfig(Section):
    """Which flow (tenant) of a band goes next."""

    policy: Literal["round-robin", "least-attained"] = Field(
        default="round-robin",
        description="round-robin: flows in turn; least-attained: the flow that has been "
                    "served the fewest weighted tokens (a flow that was idle starts level "
                    "with the least-served busy one, so idleness banks no credit)")
    input_token_weight: float = Field(default=1.0, alias="inputTokenWeight", ge=0,
                                      description="least-attained: weight of a prompt token")
    output_token_weight: float = Field(default=1.0, alias="outputTokenWeight", ge=0,
                                       description="least-attained: weight of an output token "
                                                   "(charged as the request's max_tokens, or "
                                                   "expectedOutputTokens without one, then "
                                                   "settled with the answer's real count)")
    expected_output_tokens: int = Field(default=256, alias="expectedOutputTokens", ge=0,
                                        description="output tokens charged to a request "
                                                    "that names no max_tokens")
    program_aware: bool = Field(default=False, alias="programAware",
                                description="inside a flow, the agent session "
                                            "(x-session-id) that has been served the fewest "
                                            "weighted tokens goes first, so a short program "
                                            "is not stuck behind a long one")


class FlowSaturationConfig(Section):
    """How the flow controller tells that the endpoints are full."""

    detector: Literal["metrics", "concurrency"] = Field(
        default="metrics",
        description="metrics: each endpoint's scraped queue depth and KV-cache use against "
                    "saturation.queueThreshold and saturation.kvUsageThreshold (stale metrics "
                    "count as full); concurrency: the router's own count of requests in "
                    "flight per endpoint against maxConcurrency")
    max_concurrency: int = Field(default=32, alias="maxConcurrency", gt=0,
                                 description="concurrency detector: requests in flight an "
                                             "endpoint takes")
    shed_start: float = Field(default=0.8, alias="shedStart", ge=0, le=1,
                              description="sheddable requests are refused with a probability "
                                          "that rises from 0 at this saturation to 1 at "
                                          "shedAll (saturation: the candidate endpoints' mean "
                                          "use of their capacity); 1: only when full")
    shed_all: float = Field(default=1.0, alias="shedAll", gt=0, le=1,
                            description="from this saturation on every sheddable request is "
                                        "refused: below 1 the last room is kept for traffic "
                                        "that may not be shed")

    @model_validator(mode="after")
    def _curve(self) -> FlowSaturationConfig:
        if self.shed_all < self.shed_start:
            raise ValueError(f"shedAll ({self.shed_all:g}) must be at least shedStart "
                             f"({self.shed_start:g}); raise shedAll or lower shedStart")
        return self


class TurnPriorityConfig(Section):
    """Agent sessions' next turns before cold requests of the same band."""

    enabled: bool = Field(default=False, description="a request whose session "
                                                     "(x-session-id) finished a turn "
                                                     "within warmSeconds goes before the "
                                                     "band's cold requests")
    warm_s: float = Field(default=30.0, alias="warmSeconds", gt=0,
                          description="how long after a turn its session's cache counts as "
                                      "warm")


class SecretKeys(Section):
    """A Kubernetes Secret whose data maps each tenant to its API keys (one a
    line), watched: a change applies without a restart."""

    namespace: str = Field(default="default", description="the Secret's namespace")
    name: str = Field(min_length=1, description="the Secret's name")
    kubeconfig: str | None = Field(
        default=None, description="default: $KUBECONFIG, ~/.kube/config, then in-cluster")


class KeysConfig(Section):
    """Where the API keys come from (one of file and secret)."""

    file: str | None = Field(default=None,
                             description="a YAML file (kind: APIKeys) mapping each tenant to "
                                         "its keys, re-read when it changes")
    secret: SecretKeys | None = Field(default=None, description="a Kubernetes Secret")
    reload_s: float = Field(default=1.0, alias="reloadSeconds", gt=0,
                            description="file: how often it is checked for a change")

    @model_validator(mode="after")
    def _one(self) -> KeysConfig:
        if (self.file is None) == (self.secret is None):
            raise ValueError("give exactly one of keys.file (a path) and keys.secret "
                             "(namespace and name)")
        return self


class TenantConfig(Section):
    """A tenant: its own flow in every band, a default objective, rate limits."""

    name: str = Field(min_length=1, description="as in the key source; its fairness id")
    objective: str | None = Field(default=None,
                                  description="used when a request names none "
                                              "(default: flowControl.defaultObjective)")
    requests_per_s: float | None = Field(default=None, alias="requestsPerSecond", gt=0,
                                         description="beyond this rate (burst: one second's "
                                                     "worth, at least 1), 429")
    tokens_per_s: float | None = Field(default=None, alias="tokensPerSecond", gt=0,
                                       description="prompt plus output tokens per second "
                                                   "(max_tokens taken at admission, settled "
                                                   "with the real count at the answer's end); "
                                                   "beyond (burst: one second's worth), 429")
    max_priority: int | None = Field(default=None, alias="maxPriority",
                                     description="an objective the tenant names with a higher "
                                                 "priority runs at this one (a key does not "
                                                 "let a batch tenant claim another's band)")
    pass_transfer_fields: bool = Field(
        default=False, alias="passTransferFields",
        description="the tenant's kv_transfer_params and bootstrap_* body fields reach the "
                    "model servers as sent (a client that does its own prefill/decode "
                    "hand-over); off, as for every tenant not named here, the router drops "
                    "them, since they tell a model server which host and KV blocks to pull")


class TenantsConfig(Section):
    """API keys (Authorization: Bearer) that name tenants. Without keys there
    is no authentication: the fairness id comes from the llm-d header."""

    keys: KeysConfig | None = Field(default=None, description="unset: no keys, no 401s")
    tenants: list[TenantConfig] = Field(default_factory=list,
                                        description="settings per tenant; a tenant in the "
                                                    "keys without an entry gets the defaults")
    metric_tenants: int = Field(
        default=100, alias="metricTenants", ge=0,
        description="most tenant label values in /metrics: each tenant listed in `tenants`, "
                    "then others as they first send, up to this many in all; the rest "
                    "count under `other` (a series per tenant stays bounded)")

    @model_validator(mode="after")
    def _unique(self) -> TenantsConfig:
        _no_repeats("tenants", [t.name for t in self.tenants])
        trusted = [t.name for t in self.tenants if t.pass_transfer_fields]
        if trusted and self.keys is None:
            raise ValueError(f"tenants {', '.join(trusted)}: passTransferFields needs keys "
                             "(without them no client is known, so none is trusted); set "
                             "keys or remove passTransferFields")
        return self


def _no_repeats(what: str, names: list[Any]) -> None:
    dup = sorted({str(n) for n in names if names.count(n) > 1})
    if dup:
        raise ValueError(f"{what} must be unique; repeated: {', '.join(dup)}")


class FlowControlConfig(Section):
    """Priorities, shedding, tenants and fair queueing in the router. Strict
    priority bands; inside a band, fairness between flows (tenants); inside
    a flow, first come first served or earliest deadline."""

    enabled: bool = Field(default=False, description="hold requests in the router while "
                                                     "their endpoints are full; off: they go "
                                                     "to a full endpoint rather than wait "
                                                     "(shedding and tenants apply either way)")
    objectives: list[Objective] = Field(
        default_factory=list, description="objective names and their priorities; an unknown "
                                          "or absent objective has priority 0")
    default_objective: str | None = Field(default=None, alias="defaultObjective",
                                          description="the objective of a request that names "
                                                      "none (and whose tenant sets none)")
    queue_ttl_s: float = Field(default=30.0, alias="queueTTLSeconds", gt=0,
                               description="longest wait in the queue before a 429 (or the "
                                           "request's x-llm-d-slo-ttft-ms, if shorter)")
    max_queued: int = Field(default=10_000, alias="maxQueued", gt=0,
                            description="queued requests in all bands; beyond, 429 at once")
    bands: list[BandConfig] = Field(default_factory=list,
                                    description="caps per priority band; a band not listed "
                                                "gets the defaults of one")
    ordering: Literal["fcfs", "edf"] = Field(
        default="fcfs", description="inside a flow: fcfs (first come first served) or edf "
                                    "(earliest deadline: TTL or x-llm-d-slo-ttft-ms first)")
    fairness: FairnessConfig = Field(default_factory=FairnessConfig)
    saturation: FlowSaturationConfig = Field(default_factory=FlowSaturationConfig)
    turn_priority: TurnPriorityConfig = Field(default_factory=TurnPriorityConfig,
                                              alias="turnPriority")
    tenants: TenantsConfig = Field(default_factory=TenantsConfig)

    @model_validator(mode="after")
    def _consistent(self) -> FlowControlConfig:
        _no_repeats("objective names", [o.name for o in self.objectives])
        _no_repeats("bands' priorities", [b.priority for b in self.bands])
        known = {o.name for o in self.objectives}
        named = [("defaultObjective", self.default_objective)] + [
            (f"tenants.tenants[{i}].objective", t.objective)
            for i, t in enumerate(self.tenants.tenants)]
        for where, name in named:
            if name is not None and name not in known:
                raise ValueError(f"{where}: {name!r} is not in objectives; add it there or "
                                 "name one of: " + (", ".join(sorted(known)) or "(none)"))
        return self


class EndpointPickerConfig(Section):
    """``toposerve router --mode endpoint-picker``: the gRPC server (Envoy's
    external processing) a proxy asks which endpoint serves each request,
    as the Gateway API Inference Extension's endpoint picker
    (docs/endpoint-picker.md). server.host and server.port then serve only
    /health, /ready and /metrics."""

    host: str = Field(default="127.0.0.1", description="address the gRPC server listens on")
    port: int = Field(default=9002, ge=0, le=65535,
                      description="its port (9002: the port gateways expect an endpoint "
                                  "picker on)")
    fallbacks: int = Field(default=0, ge=0, le=16,
                           description="endpoints named after the picked one, best first, in "
                                       "x-gateway-destination-endpoint and its envoy.lb "
                                       "metadata (ip:port,ip:port,...), for a proxy that "
                                       "retries down the list; an ORIGINAL_DST cluster reads "
                                       "one address, so 0 there")


def _admission_moved(doc: Any) -> Any:
    """``admission`` (objectives, flowControl) was the place of flow control
    before ``flowControl`` took it all; an old file still loads, once warned."""
    if not isinstance(doc, dict) or "admission" not in doc:
        return doc
    old = doc["admission"]
    if "flowControl" in doc:
        raise ValueError("admission is the old place of flowControl: move admission."
                         "objectives and admission.flowControl.* into flowControl")
    if not isinstance(old, dict):
        raise ValueError("admission: expected a mapping (deprecated: use flowControl)")
    moved = dict(old.get("flowControl") or {})
    if "objectives" in old:
        moved["objectives"] = old["objectives"]
    extra = set(old) - {"objectives", "flowControl"}
    if extra:
        raise ValueError(f"admission.{sorted(extra)[0]}: unknown field (admission is "
                         "deprecated: use flowControl)")
    structlog.get_logger("router.config").warning(
        "config: admission is deprecated; its objectives and flowControl settings now live "
        "in flowControl (the file loads as it is, move them before the next release)")
    return {**{k: v for k, v in doc.items() if k != "admission"}, "flowControl": moved}


class RouterConfig(Section):
    """The router's configuration file."""

    api_version: Literal["toposerve.io/v1"] = Field(alias="apiVersion")
    kind: Literal["RouterConfig"] = Field(description="always RouterConfig")
    server: ServerConfig = Field(default_factory=ServerConfig)
    discovery: DiscoveryConfig
    scrape: ScrapeConfig = Field(default_factory=ScrapeConfig)
    profile: ProfileConfig = Field(default_factory=ProfileConfig)
    responses: ResponsesStoreConfig = Field(default_factory=ResponsesStoreConfig)
    kv_events: KVEventsConfig = Field(default_factory=KVEventsConfig, alias="kvEvents")
    saturation: SaturationConfig = Field(default_factory=SaturationConfig)
    flow_control: FlowControlConfig = Field(default_factory=FlowControlConfig,
                                            alias="flowControl")
    disaggregation: DisaggregationConfig = Field(default_factory=DisaggregationConfig)
    revisions: RevisionsConfig = Field(default_factory=RevisionsConfig)
    ha: HAConfig = Field(default_factory=HAConfig)
    endpoint_picker: EndpointPickerConfig = Field(default_factory=EndpointPickerConfig,
                                                  alias="endpointPicker")

    @model_validator(mode="after")
    def _ha_shares_responses(self) -> RouterConfig:
        if self.ha.enabled and self.responses.backend != "redis":
            raise ValueError("ha.enabled needs responses.backend: redis (with redisUrl), so "
                             "either replica continues the other's Responses chains")
        if self.server.workers > 1 and self.ha.enabled and self.ha.mode == "hot-standby":
            raise ValueError(f"server.workers ({self.server.workers}) needs ha.mode: "
                             "active-active: in a hot-standby pair one process leads")
        return self

    @model_validator(mode="after")
    def _events_read(self) -> RouterConfig:
        # KV events feed only the precise index: subscribed to under profiles
        # without prefix-precise they cost a socket a server and route nothing
        d = self.discovery
        pods = [p for p in (d.kubernetes, d.inference_pool) if p is not None]
        fed = any(e.kv_events for e in d.static) or any(
            p.kv_events_port is not None or p.kv_events_port_name is not None for p in pods)
        profiles = (self.profile, self.disaggregation.decode)
        if fed and not any(s.type == "prefix-precise" for p in profiles for s in p.scorers):
            structlog.get_logger("router.config").warning(
                "config: the model servers' KV events are configured but no scorer reads "
                "them: put prefix-precise in profile.scorers (in place of prefix-approx) to "
                "route by what the engines report cached")
        return self

    _admission_moved = model_validator(mode="before")(staticmethod(_admission_moved))


def load_router_config(path: str) -> RouterConfig:
    return load_file(path, RouterConfig, "RouterConfig")


def quick_document(endpoints: list[str], host: str, port: int) -> dict[str, Any]:
    """The default profile over a static list, for ``--endpoint`` quick starts."""
    return {"apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
            "server": {"host": host, "port": port},
            "discovery": {"static": [{"url": u.rstrip("/")} for u in endpoints]}}

