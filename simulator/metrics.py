"""Prometheus metrics of the simulator, under vLLM's or SGLang's names and
labels (checked against tests/wire/fixtures: vLLM v0.33.0, SGLang v0.5.23)."""

from __future__ import annotations

import gzip
from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.exposition import choose_encoder, gzip_accepted

from toposerve.simulator.config import Dialect, DisaggregationMode, SimConfig
from toposerve.simulator.engine import Engine

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0)

# role -> (vLLM name, SGLang name)
NAMES = {
    "running": ("vllm:num_requests_running", "sglang:num_running_reqs"),
    "waiting": ("vllm:num_requests_waiting", "sglang:num_queue_reqs"),
    "usage": ("vllm:kv_cache_usage_perc", "sglang:token_usage"),
    # SGLang counts cached prompt tokens but not the tokens looked up
    "prefix_queries": ("vllm:prefix_cache_queries", "toposerve_sim_prefix_cache_queries"),
    "prefix_hits": ("vllm:prefix_cache_hits", "sglang:cached_tokens"),
    "prompt_tokens": ("vllm:prompt_tokens", "sglang:prompt_tokens"),
    "generation_tokens": ("vllm:generation_tokens", "sglang:generation_tokens"),
    "ttft": ("vllm:time_to_first_token_seconds", "sglang:time_to_first_token_seconds"),
    "success": ("vllm:request_success", "sglang:num_requests"),
    # the decode side of a hand-over: vLLM's NixlConnector metrics; SGLang
    # reports its transfers on the prefill side, so the simulator's own there
    "kv_pull_seconds": ("vllm:nixl_xfer_time_seconds", "toposerve_sim_kv_pull_seconds"),
    "kv_pull_bytes": ("vllm:nixl_bytes_transferred", "toposerve_sim_kv_pull_bytes"),
}

# SGLang's engine_type label, by --disaggregation-mode
SGLANG_ENGINE_TYPE = {DisaggregationMode.NULL: "unified", DisaggregationMode.PREFILL: "prefill",
                      DisaggregationMode.DECODE: "decode"}


class SimMetrics:
    def __init__(self, cfg: SimConfig, engine: Engine) -> None:
        # described on registering, so name[] finds the process collector's
        # series too (it describes none itself)
        self.registry = r = CollectorRegistry(auto_describe=True)
        # process_start_time_seconds among them, as vLLM's: a router tells a
        # restarted server by it
        ProcessCollector(registry=r)
        s = engine.stats
        vllm = cfg.dialect == Dialect.VLLM
        # vLLM: every series by engine index. SGLang: its tokenizer's series
        # by model and engine type, its scheduler's (the gauges) by rank too
        lab = {"model_name": cfg.names[0], **({"engine": "0"} if vllm else {
            "engine_type": SGLANG_ENGINE_TYPE[cfg.disaggregation_mode]})}
        gauge_lab = lab if vllm else {**lab, "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}

        def name(role: str) -> str:
            return NAMES[role][0 if vllm else 1]

        def gauge(role: str, doc: str, fn: Callable[[], float]) -> None:
            Gauge(name(role), doc, list(gauge_lab), registry=r).labels(
                **gauge_lab).set_function(fn)

        def counter(role: str, doc: str) -> Counter:
            return Counter(name(role), doc, list(lab), registry=r).labels(**lab)

        gauge("running", "Requests in model execution batches.", lambda: s.running)
        gauge("waiting", "Requests waiting to be processed.", lambda: s.waiting)
        gauge("usage", "KV-cache usage. 1 means 100 percent usage.", lambda: engine.kv_usage)
        self.prefix_queries = counter("prefix_queries", "Prefix cache queries, in tokens.")
        self.prefix_hits = counter("prefix_hits", "Prefix cache hits, in tokens.")
        self.prompt_tokens = counter("prompt_tokens", "Prefill tokens processed.")
        self.generation_tokens = counter("generation_tokens", "Generation tokens processed.")
        self.success = counter("success", "Requests finished.")
        self.ttft = Histogram(name("ttft"), "Histogram of time to first token in seconds.",
                              list(lab), buckets=TTFT_BUCKETS, registry=r).labels(**lab)
        self.kv_pull_seconds = Histogram(
            name("kv_pull_seconds"), "Histogram of transfer duration of KV pulled from a "
            "remote prefill.", list(lab), buckets=TTFT_BUCKETS, registry=r).labels(**lab)
        self.kv_pull_bytes = Histogram(
            name("kv_pull_bytes"), "Histogram of bytes per KV pull from a remote prefill.",
            list(lab), buckets=tuple(2.0 ** k for k in range(20, 41, 2)),
            registry=r).labels(**lab)
        # the simulator's own: which tier each pull crossed (no engine knows)
        self.kv_pulls = Counter("toposerve_sim_kv_pulls", "KV pulls from a remote prefill, "
                                "by the topology tier between the two nodes.", ["tier"],
                                registry=r)
        if vllm:
            info = {"block_size": str(cfg.block_size), "num_gpu_blocks": str(cfg.num_gpu_blocks),
                    "cache_dtype": "auto", "enable_prefix_caching": "True", "engine": "0"}
            Gauge("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                  list(info), registry=r).labels(**info).set(1)
        else:
            Gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", list(gauge_lab),
                  registry=r).labels(**gauge_lab).set_function(
                lambda: s.prefix_hits / s.prefix_queries if s.prefix_queries else 0.0)

    def render(self, names: Sequence[str] = (), accept: str = "",
               accept_encoding: str = "") -> tuple[bytes, dict[str, str]]:
        """Body and headers as vLLM's and SGLang's /metrics (prometheus_client's
        ASGI app) answer: only the series in ``names`` (the ``name[]`` query)
        when given, the format the Accept header asks for, and gzip when the
        client accepts it."""
        registry = self.registry.restricted_registry(names) if names else self.registry
        encoder, content_type = choose_encoder(accept)
        body, headers = encoder(registry), {"Content-Type": content_type}
        if gzip_accepted(accept_encoding):
            body, headers["Content-Encoding"] = gzip.compress(body), "gzip"
        return body, headers
