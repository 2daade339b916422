"""The scraper reads vLLM's and SGLang's /metrics; the simulator serves the
names and labels they serve."""

from __future__ import annotations

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.wire.conftest import fixture_text
from toposerve.router.pool.scrape import CACHE_INFO, KV_USAGE, RUNNING, WAITING, parse_load
from toposerve.simulator.config import SimConfig
from toposerve.simulator.server import SimServer

FIXTURES = {"vllm": "vllm_v0.33.0_metrics.txt", "sglang": "sglang_v0.5.23_metrics.txt"}


def _labels(text: str) -> dict[str, set[str]]:
    """Each sample's name -> its label names."""
    return {s.name: set(s.labels) for f in text_string_to_metric_families(text)
            for s in f.samples}


def test_vllm_v0_33_0() -> None:
    load, bs, nb = parse_load(fixture_text("vllm_v0.33.0_metrics.txt"))
    # summed over engines; waiting_by_reason is a breakdown, not more waiting
    assert (load.running, load.waiting, load.kv_usage) == (5, 5, 0.5)
    assert (bs, nb) == (16, 27264)


def test_vllm_v0_11_0() -> None:
    load, bs, nb = parse_load(fixture_text("vllm_v0.11.0_metrics.txt"))
    assert (load.running, load.waiting, load.kv_usage) == (1, 2, 0.125)
    assert (bs, nb) == (16, 4096)


def test_sglang_v0_5_23() -> None:
    load, bs, nb = parse_load(fixture_text("sglang_v0.5.23_metrics.txt"))
    # summed over DP ranks; num_grammar_queue_reqs and full_token_usage are other series
    assert (load.running, load.waiting, load.kv_usage) == (6, 2, 0.3)
    assert (bs, nb) == (None, None)


def test_the_scraped_names_are_the_engines() -> None:
    served = set(_labels(fixture_text(FIXTURES["vllm"]))) | set(
        _labels(fixture_text(FIXTURES["sglang"]))) | set(
        _labels(fixture_text("vllm_v0.11.0_metrics.txt")))
    assert RUNNING | WAITING | KV_USAGE | {CACHE_INFO} <= served


def _families(text: str) -> set[str]:
    return {f.name for f in text_string_to_metric_families(text)}


# cache_config_info carries every CacheConfig field, which changes by version:
# the simulator names those the router reads
CACHE_INFO_READ = {"block_size", "num_gpu_blocks", "engine"}
# series of vLLM's NixlConnector (a decode's KV pulls), not in a plain server's /metrics
NIXL = {"vllm:nixl_xfer_time_seconds", "vllm:nixl_bytes_transferred"}


@pytest.mark.parametrize("dialect", ["vllm", "sglang"])
def test_simulator_serves_the_engines_names_and_labels(dialect: str) -> None:
    sim = SimServer(SimConfig(dialect=dialect, model="Qwen/Qwen3-8B"))
    text = sim.metrics.render()[0].decode()
    ours, theirs = _labels(text), _labels(fixture_text(FIXTURES[dialect]))
    for name in set(ours) & set(theirs):
        # the same labels, but for those only a bigger deployment or a finished request has
        want = CACHE_INFO_READ if name == CACHE_INFO else theirs[name] - {
            "dp_rank", "reason", "finished_reason"}
        assert want <= ours[name] <= theirs[name], name
    assert (RUNNING | WAITING | KV_USAGE) & set(theirs) <= set(ours)
    # every series under the engine's prefix is one the engine serves
    # (prometheus_client's _created series, which both engines serve as well)
    engine_families = {f for f in _families(text)
                       if f.startswith(dialect + ":") and not f.endswith("_created")}
    assert engine_families - NIXL <= _families(fixture_text(FIXTURES[dialect]))
