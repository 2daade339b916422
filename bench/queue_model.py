"""A queueing model of the benchmark's simulators, for open-loop traces: what
TTFT a router that knew every queue and cache exactly could reach.

The floor (every reusable token a hit, nothing queued) ignores that requests
arrive together; this model does not. Each modelled server runs prefills
one at a time in arrival order, as the simulator does (it holds one lock for
all of a prompt's chunks), costing the simulator's overhead plus its
uncached tokens' prefill time, and keeps the simulator's own LRU block
cache. Decoding is left out: in the router benchmark it runs beside
prefills and never delays them. The model is checked by round-robin, which
it places as the benchmark's round-robin router does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.workloads import TraceRequest
from toposerve.simulator.kvcache import BlockCache
from toposerve.wire.hashing import byte_block_hashes
from toposerve.wire.tokens import BYTES_PER_TOKEN


@dataclass
class Server:
    cache: BlockCache
    free_at: float = 0.0  # wall second its queued prefills are done


def first_token_at(s: Server, at_s: float, tokens: int, keys: list[int],
                   sim: dict[str, Any]) -> float:
    """When a prompt of ``tokens`` arriving at ``at_s`` would have its first
    token on ``s``: after the prefills queued there, its overhead and the
    tokens ``s`` does not hold."""
    uncached = max(0, tokens - s.cache.held_prefix(keys) * int(sim["block_size"]))
    return max(at_s, s.free_at) + float(sim["time_scale"]) * (
        float(sim["overhead_s"]) + uncached * float(sim["prefill_s_per_token"]))


def model_ttfts_ms(reqs: list[TraceRequest], sim: dict[str, Any], n_servers: int,
                   cache_blocks: int, policy: str) -> list[float]:
    """TTFT of each request in wall ms. ``policy``: "round-robin", or
    "least-ttft": each request goes where its first token comes soonest
    given the exact queues and caches (greedy, so a strong placement, not a
    proven optimum)."""
    if policy not in ("round-robin", "least-ttft"):
        raise ValueError(f"unknown policy {policy!r}")
    block_bytes = int(sim["block_size"]) * BYTES_PER_TOKEN
    servers = [Server(BlockCache(cache_blocks, int(sim["block_size"])))
               for _ in range(n_servers)]
    out = []
    for i, r in enumerate(sorted(reqs, key=lambda r: r.at_s)):
        prompt = r.prompt.encode()
        keys = byte_block_hashes(prompt, block_bytes)
        tokens = len(prompt) // BYTES_PER_TOKEN
        candidates = [servers[i % n_servers]] if policy == "round-robin" else servers
        s, first = min(((c, first_token_at(c, r.at_s, tokens, keys, sim))
                        for c in candidates), key=lambda pair: pair[1])
        s.free_at = first
        s.cache.store(keys, [])  # refreshes the hits and adds the rest, as the simulator does
        out.append(1000 * (first - r.at_s))
    return out
