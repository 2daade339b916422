"""Load and faults on the real vLLM servers: the second of the shared
pair takes them (``max_num_seqs`` of 4, so a few long requests fill it),
the first is the other server behind the router; the one killed is
restarted in place before the test ends, so the package's other tests
find it as they expect.

* Load from the engine's own metrics: requests sent to the server behind
  the router's back keep its queue full (vLLM's ``num_requests_waiting``);
  the router's queue scorer sends new work to the other server while the
  queue lasts, and work comes back once it is gone.
* ``kill -9`` mid-stream: the client (the OpenAI SDK, streaming) gets an
  SSE error event within seconds, the router forgets the server's blocks
  at once and sends nothing there while it is down; restarted on the same
  port (a new process, an empty cache), it holds nothing in the router's
  index until its own events say so, and takes work again."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from harness.procs import Procs
from harness.vllm import BLOCK_SIZE, MAX_MODEL_LEN, MODEL, VllmServer, router_config
from harness.waiting import wait_for
from tests.engine.routing import (
    FIXED,
    chat,
    endpoint_metric,
    healthy,
    held,
    precise_only,
    settled,
)

pytestmark = pytest.mark.engine
LONG = MAX_MODEL_LEN - 64  # output tokens of a stream that lasts seconds
# output tokens of a flood request: its seqs use a quarter of the KV cache, so
# the queue (the queue scorer), not the cache (the not-saturated filter), decides
FLOOD_TOKENS = 512


class Flood:
    """``count`` long streamed requests to ``engine`` directly, each sent
    again as it ends, until the flood ends, which closes them (vLLM aborts
    them): more than it runs at once keeps its queue full however fast it
    decodes."""

    def __init__(self, engine: VllmServer, count: int) -> None:
        self.engine, self.count = engine, count
        self.stop = threading.Event()
        self.pool = ThreadPoolExecutor(count)

    def _one(self, i: int) -> None:
        body = {"model": MODEL, "prompt": f"Tell me everything, {i}.", "max_tokens": FLOOD_TOKENS,
                "stream": True, **FIXED}
        while not self.stop.is_set():
            with httpx.stream("POST", self.engine.url + "/v1/completions", json=body,
                              timeout=60) as r:
                assert r.status_code == 200
                for _ in r.iter_bytes():
                    if self.stop.is_set():
                        return

    def __enter__(self) -> Flood:
        self.futures = [self.pool.submit(self._one, i) for i in range(self.count)]
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.pool.shutdown()
        for f in self.futures:
            f.result()  # a request that failed fails the test


def test_a_full_queue_sends_new_work_to_the_other_server(
        procs: Procs, engines: list[VllmServer], model_dir: Path) -> None:
    other, full = engines
    # no saturation filter: should the flood fill the full server's KV past
    # its threshold, the filter would decide ("only-candidate"), not the queue
    router = procs.router({**router_config([other, full], model_dir), "profile": {
        "filters": [{"type": "model"}, {"type": "healthy"}],
        "scorers": [{"type": "prefix-precise", "weight": 2}, {"type": "queue", "weight": 1}],
        "picker": {"type": "max-score", "params": {"seed": 5}}},
        "scrape": {"intervalSeconds": 0.1}})
    salt = uuid.uuid4().hex
    waiting = "toposerve_router_endpoint_waiting"
    by_queue = "toposerve_router_decisions_total"
    try:
        with Flood(full, full.max_num_seqs + 3):
            wait_for("the router to scrape the full server's queue",
                     lambda: endpoint_metric(router, waiting, full) >= 1, timeout=60)
            before = router.metric(by_queue, reason="queue")
            # each its own prompt from the first token: no prefix to follow
            where = [chat(router.url, f"[{i} {salt}] Hello.").headers["x-toposerve-endpoint"]
                     for i in range(6)]
            # the queue lasted while they were sent: each was a choice against it
            assert endpoint_metric(router, waiting, full) >= 1
        assert where == [other.hostport] * 6
        assert router.metric(by_queue, reason="queue") == before + 6
    finally:
        full.reset_cache()  # the flood's blocks, which the other tests do not expect
    wait_for("the full server's queue to empty",
             lambda: endpoint_metric(router, waiting, full) == 0, timeout=60)
    # its queue gone, it takes work again: a prompt cached there goes there
    kept = f"[{salt} kept] " + "A long story. " * 40
    blocks = chat(full.url, kept).json()["usage"]["prompt_tokens"] // BLOCK_SIZE
    wait_for("the router to index the prompt", lambda: held(router, full) >= blocks,
             timeout=30)
    r = chat(router.url, kept + " Again.")
    assert r.headers["x-toposerve-endpoint"] == full.hostport


def test_a_server_killed_mid_stream_and_restarted(
        procs: Procs, engines: list[VllmServer], model_dir: Path) -> None:
    other, victim = engines
    try:
        killed_mid_stream_and_restarted(procs, other, victim, model_dir)
    finally:
        if victim.popen.poll() is not None:  # the test failed before it was back
            victim.restart()
            victim.wait_ready()


def killed_mid_stream_and_restarted(procs: Procs, other: VllmServer, victim: VllmServer,
                                    model_dir: Path) -> None:
    router = procs.router({**router_config([other, victim], model_dir), "profile": precise_only(5),
        "scrape": {"intervalSeconds": 0.1}})
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0,
                           timeout=30)
    salt = uuid.uuid4().hex
    kept = f"[{salt} kept] " + "A long story. " * 100
    before = wait_for("the replayed blocks to settle", lambda: settled(router, victim),
                      timeout=30)[0]
    # cached there behind the router's back: the stream follows it there
    blocks = chat(victim.url, kept).json()["usage"]["prompt_tokens"] // BLOCK_SIZE
    wait_for("the router to index the prompt",
             lambda: held(router, victim) >= before + blocks, timeout=30)
    with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": kept}], max_tokens=LONG // 2,
            stream=True, extra_body=FIXED) as streamed:
        assert streamed.headers["x-toposerve-endpoint"] == victim.hostport
        chunks = iter(streamed.parse())
        # killed as soon as the answer has begun: on a quiet machine the tiny
        # model makes the whole answer within the time a few chunks are read
        next(chunks)
        victim.kill()  # the whole process group, as a node or OOM kill does
        killed = time.monotonic()
        after: list[Any] = []
        with pytest.raises(openai.APIError) as err:
            after.extend(chunks)
            # not raised: say whether the answer had ended before the kill
            ends = [c.choices[0].finish_reason for c in after if c.choices]
            print(f"[engine] no error: {len(after)} chunks after the kill, ends {ends[-1:]}")
    took = time.monotonic() - killed
    assert took < 10, took
    assert isinstance(err.value.body, dict), err.value.body
    assert err.value.body["code"] == 502 and victim.hostport in err.value.body["message"]
    print(f"[engine] SSE error {took:.2f}s after kill -9: {err.value.body['message']}")
    # its blocks are gone with it, and so is its work
    wait_for("the killed server's blocks to leave the index",
             lambda: held(router, victim) == 0, timeout=10)
    wait_for("the router to mark it unhealthy", lambda: not healthy(router, victim),
             timeout=10)
    for i in range(3):
        r = chat(router.url, f"{kept} [{i}]")
        assert r.headers["x-toposerve-endpoint"] == other.hostport
    # a new process on the same port: back, with nothing cached
    started = time.monotonic()
    victim.restart()
    victim.wait_ready()
    wait_for("the router to take it back", lambda: healthy(router, victim), timeout=30)
    print(f"[engine] restarted and taken back in {time.monotonic() - started:.1f}s")
    assert held(router, victim) == 0
    # its own events are heard again, and work follows them there
    fresh = f"[{salt} fresh] " + "Another story. " * 100
    blocks = chat(victim.url, fresh).json()["usage"]["prompt_tokens"] // BLOCK_SIZE
    wait_for("the router to index the new process's blocks",
             lambda: held(router, victim) >= blocks, timeout=30)
    r = chat(router.url, fresh + " Again.")
    assert r.headers["x-toposerve-endpoint"] == victim.hostport
    assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] >= (
        (blocks - 1) * BLOCK_SIZE)
