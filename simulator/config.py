"""Settings of one simulated model server."""

from __future__ import annotations

from enum import StrEnum

from pydantic import ConfigDict, Field, field_validator

from toposerve.topology.config_file import ConfigError
from toposerve.topology.model import Tier, TierLink
from toposerve.topology.place import NodePlace
from toposerve.topology.profiles import load_profile
from toposerve.wire.kv_events import EventEncoding
from toposerve.wire.kv_transfer import SGLANG_BOOTSTRAP_PORT


class Dialect(StrEnum):
    VLLM = "vllm"
    SGLANG = "sglang"


class DisaggregationMode(StrEnum):
    """SGLang's --disaggregation-mode."""

    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


class SimConfig(NodePlace):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    model: str = "toposerve/sim-model"
    served_model_names: list[str] = Field(default_factory=list)
    dialect: Dialect = Dialect.VLLM
    tokenizer: str | None = Field(default=None, description="HF tokenizer.json; default: bytes")
    max_model_len: int = Field(default=1_048_576, gt=0)
    # the router's largest body (8 MiB) with the largest chain it assembles
    # (responses.maxChainBytes, 8 MiB), escaped: a bound, not 256 MiB a request
    max_body_bytes: int = Field(default=32 * 2**20, gt=0,
                                description="larger request bodies get 413")
    # latency model, in model seconds (scaled by time_scale)
    overhead_s: float = Field(default=0.010, ge=0)
    prefill_s_per_token: float = Field(default=0.000_05, ge=0, description="uncached tokens")
    decode_s_per_token: float = Field(default=0.020, ge=0)
    decode_slowdown_per_seq: float = Field(default=0.002, ge=0,
                                           description="extra decode time per running sequence")
    max_num_seqs: int = Field(default=256, gt=0)
    max_num_batched_tokens: int = Field(default=8192, gt=0, description="prefill chunk size")
    prefill_stalls_decode: bool = Field(
        default=False, description="decode steps wait while a prefill chunk runs (the "
                                   "interference a prefill/decode split removes)")
    time_scale: float = Field(default=1.0, gt=0, description="wall seconds per model second")
    # KV cache
    block_size: int = Field(default=16, gt=0)
    num_gpu_blocks: int = Field(default=65_536, gt=0)
    kv_events_port: int | None = Field(default=None, ge=0, le=65535)
    kv_events_replay_port: int | None = Field(default=None, ge=0, le=65535)
    kv_events_encoding: EventEncoding = EventEncoding.ARRAY
    kv_events_topic: str = ""
    engine_id: str | None = None
    # SGLang prefill/decode (with --dialect sglang; vLLM's flow needs no flag)
    disaggregation_mode: DisaggregationMode = DisaggregationMode.NULL
    disaggregation_bootstrap_port: int = Field(default=SGLANG_BOOTSTRAP_PORT, ge=0, le=65535,
                                               description="prefill mode: the bootstrap port")
    disaggregation_bootstrap_timeout_s: float = Field(
        default=30.0, gt=0, description="how long a room waits for its prefill (wall seconds)")
    # A decode server's KV pull from its prefill server (either hand-over)
    # costs what the shared topology model says for the tier the two nodes
    # share (their places: node, nvlink_domain, rack, block, zone); without
    # a node, nothing.
    hardware_profile: str = Field(default="gb200-nvl72",
                                  description="the profile whose tier links price a KV pull")
    kv_bytes_per_token: int = Field(default=327_680, ge=0,
                                    description="KV-cache bytes per token (Llama-3-70B, bf16)")
    # failure injection
    error_rate: float = Field(default=0.0, ge=0, le=1, description="500 before any byte")
    hang_rate: float = Field(default=0.0, ge=0, le=1, description="accept, never answer")
    midstream_failure_rate: float = Field(default=0.0, ge=0, le=1,
                                          description="drop the connection mid-stream")
    crash_after: int | None = Field(default=None, ge=1, description="exit after N requests")
    slow_start_s: float = Field(default=0.0, ge=0, description="unready for this long")
    seed: int = 0

    @classmethod
    def spelled(cls, field: str) -> str:
        return "--" + field.replace("_", "-")  # toposerve sim's flags fill it

    @field_validator("hardware_profile")
    @classmethod
    def _known_profile(cls, v: str) -> str:
        try:
            load_profile(v)
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return v

    @property
    def names(self) -> list[str]:
        return self.served_model_names or [self.model]

    @property
    def links(self) -> dict[Tier, TierLink]:
        return load_profile(self.hardware_profile).links()
