"""Evictions from a real vLLM's small KV cache leave the router's precise
index: once more distinct prompts than the cache holds have gone by, the
first one's blocks are removed (vLLM's ``BlockRemoved`` events), the
index holds no more of that server than its cache can, and what the
router predicts is left of the evicted prompt is what the engine's
``cached_tokens`` finds; what is still cached still routes home. Last,
the cache is emptied (``/reset_prefix_cache``: vLLM's ``AllBlocksCleared``)
and the server's entries go with it, which also leaves the shared server
as the other tests expect it."""

from __future__ import annotations

import uuid
from pathlib import Path

import httpx
import pytest

from harness.procs import Proc, Procs
from harness.vllm import BLOCK_SIZE, VllmServer, router_config
from harness.waiting import wait_for
from tests.engine.routing import complete, held, precise_only, settled

pytestmark = pytest.mark.engine
FLOOD_WORDS = 1800  # about as many tokens: 56 full blocks, well within the model's 2048


def routed(router: Proc, prompt: str) -> tuple[str, float, int]:
    """Where the router sent ``prompt``, the share of its blocks the router
    believed held there, and the engine's cached tokens."""
    name = "toposerve_router_prefix_match_ratio"
    before = router.metric(name + "_sum"), router.metric(name + "_count")
    r = complete(router.url, prompt)
    after = router.metric(name + "_sum"), router.metric(name + "_count")
    assert after[1] == before[1] + 1
    cached = r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    return r.headers["x-toposerve-endpoint"], after[0] - before[0], cached


def test_evicted_blocks_leave_the_index(procs: Procs, engines: list[VllmServer],
                                        model_dir: Path) -> None:
    router = procs.router({**router_config(engines, model_dir), "profile": precise_only(7)})
    home = engines[0]
    capacity = int(httpx.get(home.url + "/metrics").text.split(
        'num_gpu_blocks="', 1)[1].split('"', 1)[0])
    try:
        salt = uuid.uuid4().hex
        first = f"[{salt} first] " + "story " * 600
        before = wait_for("the replayed blocks to settle", lambda: settled(router, home),
                          timeout=30)[0]
        # behind the router's back: it learns of it from the events alone
        blocks = complete(home.url, first).json()["usage"]["prompt_tokens"] // BLOCK_SIZE
        # (a cache already full evicts as much as it stores)
        wait_for("the router to index the first prompt",
                 lambda: held(router, home) >= min(before + blocks, capacity - 1), timeout=30)
        where, share, cached = routed(router, first)
        assert where == home.hostport and share == pytest.approx(1) and cached > 0, (
            where, share, cached)
        # more distinct blocks than the cache holds, each prompt a chain of its own:
        # vLLM evicts the least recently used, the first prompt's among them
        flood = [f"[{salt} flood {i}] " + "word " * FLOOD_WORDS
                 for i in range(capacity // (FLOOD_WORDS // BLOCK_SIZE) + 2)]
        last = 0
        for prompt in flood:
            last = complete(home.url, prompt).json()["usage"]["prompt_tokens"] // BLOCK_SIZE
        assert len(flood) * last > capacity
        # the removals applied: the index holds no more than the cache can
        now = wait_for("the removals to settle", lambda: settled(router, home), timeout=30)[0]
        assert last <= now <= capacity, (last, now, capacity)
        print(f"[engine] index of {home.hostport}: {before:.0f} blocks, {now:.0f} after "
              f"{len(flood)} prompts of {last} blocks (cache: {capacity})")
        # the first prompt, evicted (vLLM may keep its head, freed last): the
        # router predicts what the engine still holds of it, no more
        where, share, cached = routed(router, first)
        kept = round(share * blocks)
        assert abs(share * blocks - kept) < 1e-6 and kept < blocks, (share, blocks)
        assert cached == kept * BLOCK_SIZE, (where, kept, cached)
        print(f"[engine] {kept} of the first prompt's {blocks} blocks left, as predicted")
        # the last prompt, still cached, goes home and is found there whole
        where, share, cached = routed(router, flood[-1])
        assert where == home.hostport and share == pytest.approx(1), (where, share)
        assert cached >= (last - 1) * BLOCK_SIZE, (cached, last)
        # an emptied cache (vLLM's AllBlocksCleared) leaves nothing of it in the index
        home.reset_cache()
        wait_for("the cleared cache to leave the index", lambda: held(router, home) == 0,
                 timeout=30)
        where, share, cached = routed(router, flood[-1])
        assert (share, cached) == (0, 0), (where, share, cached)
    finally:
        home.reset_cache()  # the other tests find the shared server's cache empty
