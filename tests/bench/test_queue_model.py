"""The benchmark's queueing model: FIFO prefills, the simulator's cache, and
the least-TTFT oracle's choices, in numbers worked out by hand."""

from __future__ import annotations

import pytest

from bench.queue_model import model_ttfts_ms
from bench.workloads import TraceRequest, text_tokens

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`

# 1 ms overhead, 0.1 ms a token, wall time = model time
SIM = {"time_scale": 1.0, "overhead_s": 0.001, "prefill_s_per_token": 0.0001, "block_size": 16}
SHARED = text_tokens(1600, "shared")  # 100 blocks


def req(at_s: float, tail: str, tail_tokens: int = 160) -> TraceRequest:
    return TraceRequest(at_s=at_s, prompt=SHARED + text_tokens(tail_tokens, tail), max_tokens=1)


def test_round_robin_queues_and_caches_like_the_simulator() -> None:
    reqs = [req(0.0, "a"), req(0.0, "b"), req(0.0, "c"), req(1.0, "d")]
    got = model_ttfts_ms(reqs, SIM, 2, 10_000, "round-robin")
    cold = 1 + 0.1 * 1760  # overhead + every token: 177 ms
    warm = 1 + 0.1 * 160  # the shared 1,600 tokens cached: 17 ms
    # a and b start at once on servers 0 and 1; c waits behind a on server 0
    # and finds the shared prefix cached; d (server 1, idle again) too
    assert got == pytest.approx([cold, cold, cold + warm, warm])


def test_least_ttft_trades_a_queue_against_a_recompute() -> None:
    # a fills server 0's cache; b arrives while a still runs: waiting for
    # server 0 (177 - 10 = 167 ms, then 17) beats recomputing on server 1
    # (177); c arrives later, when server 0 is idle and warm
    reqs = [req(0.0, "a"), req(0.010, "b"), req(0.5, "c")]
    got = model_ttfts_ms(reqs, SIM, 2, 10_000, "least-ttft")
    assert got == pytest.approx([177, 177, 17])
    # with a 3,000-token tail, waiting 167 ms and then prefilling 3,000
    # tokens (468 ms) loses to prefilling all 4,600 on the idle server (461)
    reqs = [req(0.0, "a"), req(0.010, "b", tail_tokens=3000)]
    got = model_ttfts_ms(reqs, SIM, 2, 10_000, "least-ttft")
    assert got == pytest.approx([177, 1 + 0.1 * 4600])


def test_a_small_cache_evicts() -> None:
    reqs = [req(0.0, "a"), req(1.0, "b")]
    # 50 blocks keep the head of a's 110 (tails go first, as in vLLM):
    # b finds 800 of its 1,760 tokens
    got = model_ttfts_ms(reqs, SIM, 1, 50, "least-ttft")
    assert got[1] == pytest.approx(1 + 0.1 * 960)


def test_unknown_policy() -> None:
    with pytest.raises(ValueError, match="unknown policy"):
        model_ttfts_ms([req(0.0, "a")], SIM, 1, 10, "random")
