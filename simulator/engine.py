"""The simulator's latency model.

TTFT = KV pull (a decode handed a remote prefill: the blocks it lacks) +
queueing + overhead + uncached prompt tokens x prefill time per token.
Sequences beyond ``max_num_seqs`` wait; prefills run one chunk of at most
``max_num_batched_tokens`` at a time, so long uncached prompts delay those
behind them as on a real engine. Decode costs a per-token time that grows
with the number of running sequences, and with ``prefill_stalls_decode``
a decode step waits while a prefill chunk runs. Model time is multiplied by
``time_scale`` so benchmarks run fast.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from toposerve.simulator.config import SimConfig
from toposerve.simulator.kvcache import BlockCache, block_hashes
from toposerve.topology.distance import transfer_seconds
from toposerve.topology.model import Tier


@dataclass
class Stats:
    running: int = 0
    waiting: int = 0
    private_blocks: int = 0  # blocks of generated tokens, one set per sequence
    prefix_queries: int = 0  # tokens looked up
    prefix_hits: int = 0  # tokens found cached
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_done: int = 0
    ttfts: list[float] = field(default_factory=list)


@dataclass
class Job:
    tokens: list[int]
    max_tokens: int
    skip_prefill: bool = False  # KV arrives from a remote prefill
    pull_tier: Tier | None = None  # the tier it arrives over (None: free)
    pull_s: float = 0.0  # model seconds the pull took
    pull_bytes: int = 0
    bootstrap_room: int | None = None  # SGLang prefill mode: the room whose KV this makes
    cached_tokens: int = 0
    ttft: float = 0.0


class Engine:
    def __init__(self, cfg: SimConfig, cache: BlockCache) -> None:
        self.cfg = cfg
        self.cache = cache
        self.stats = Stats()
        self._slots = asyncio.Semaphore(cfg.max_num_seqs)
        self._links = cfg.links  # what a KV pull costs, per tier
        # prompt blocks of running sequences, shared between sequences with a
        # common prefix as paged attention shares them: hash -> users
        self._shared: dict[int, int] = {}
        self._prefill = asyncio.Lock()  # FIFO: asyncio locks wake waiters in order
        # set while no prefill chunk runs: with prefill_stalls_decode, decode
        # steps wait for it, as running sequences wait on a GPU busy with a
        # chunk (what a prefill/decode split spares its decode servers)
        self._no_chunk = asyncio.Event()
        self._no_chunk.set()
        # called after each prefill stores blocks, so KV events go out per step
        self.after_store: Callable[[], Awaitable[None]] | None = None

    async def _sleep(self, model_seconds: float) -> None:
        if model_seconds > 0:
            await asyncio.sleep(model_seconds * self.cfg.time_scale)

    def _blocks(self, n_tokens: int) -> int:
        return -(-n_tokens // self.cfg.block_size)

    async def _prefill_job(self, job: Job) -> list[int]:
        hashes = block_hashes(job.tokens, self.cfg.block_size)
        async with self._prefill:
            # looked up when the prefill is scheduled, not on arrival: blocks an
            # earlier request computed meanwhile are hits, as in vLLM v1
            hit_blocks = self.cache.cached_prefix(hashes)
            job.cached_tokens = hit_blocks * self.cfg.block_size
            self.stats.prefix_queries += len(job.tokens)
            self.stats.prefix_hits += job.cached_tokens
            remaining = 0 if job.skip_prefill else len(job.tokens) - job.cached_tokens
            await self._sleep(self.cfg.overhead_s)
            # chunked prefill, all chunks under the lock: vLLM runs a started
            # prefill's chunks before it admits the requests waiting behind it
            while remaining > 0:
                chunk = min(remaining, self.cfg.max_num_batched_tokens)
                self._no_chunk.clear()
                try:
                    await self._sleep(chunk * self.cfg.prefill_s_per_token)
                finally:
                    self._no_chunk.set()
                remaining -= chunk
            self.cache.store(hashes, job.tokens)
            if self.after_store is not None:
                await self.after_store()
        return hashes

    async def _pull(self, job: Job) -> None:
        """Fetch a remote prefill's KV, but only the blocks this server does
        not hold already (as vLLM's NixlConnector does). Waiting for it holds
        no batch slot."""
        if job.pull_tier is None:
            return
        held = self.cache.cached_prefix(block_hashes(job.tokens, self.cfg.block_size))
        missing = max(0, len(job.tokens) - held * self.cfg.block_size)
        job.pull_bytes = missing * self.cfg.kv_bytes_per_token
        if job.pull_bytes:
            job.pull_s = transfer_seconds(job.pull_bytes, self._links[job.pull_tier])
            await self._sleep(job.pull_s)

    async def generate(self, job: Job) -> AsyncIterator[int]:
        """Yields how many new tokens are ready, until ``max_tokens`` are out."""
        start = time.monotonic()
        self.stats.waiting += 1
        try:
            await self._pull(job)
            await self._slots.acquire()
        finally:
            self.stats.waiting -= 1
        private = self._blocks(job.max_tokens + len(job.tokens) % self.cfg.block_size)
        self.stats.running += 1
        self.stats.private_blocks += private
        hashes: list[int] = []
        try:
            hashes = await self._prefill_job(job)
            for h in hashes:
                self._shared[h] = self._shared.get(h, 0) + 1
            self.stats.prompt_tokens += len(job.tokens)
            job.ttft = time.monotonic() - start
            self.stats.ttfts.append(job.ttft)
            produced = 0
            # the first token comes with the prefill
            if job.max_tokens > 0:
                produced = 1
                yield 1
            step_floor = 0.002 / self.cfg.time_scale  # coalesce tokens under ~2 ms of wall time
            while produced < job.max_tokens:
                per_token = self.cfg.decode_s_per_token * (
                    1 + self.cfg.decode_slowdown_per_seq * self.stats.running)
                n = max(1, min(job.max_tokens - produced,
                               int(step_floor / per_token) if per_token else job.max_tokens))
                if self.cfg.prefill_stalls_decode:
                    await self._no_chunk.wait()
                await self._sleep(per_token * n)
                produced += n
                yield n
            self.stats.generation_tokens += produced
            self.stats.requests_done += 1
        finally:
            self.stats.running -= 1
            self.stats.private_blocks -= private
            for h in hashes:
                left = self._shared[h] - 1
                if left:
                    self._shared[h] = left
                else:
                    del self._shared[h]
            self._slots.release()

    @property
    def kv_usage(self) -> float:
        used = len(self._shared) + self.stats.private_blocks
        return min(1.0, used / self.cfg.num_gpu_blocks)
