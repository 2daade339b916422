"""Load and faults on the real vLLM servers: the second of the shared
pair takes them (``max_num_seqs`` of 4, so a few long requests fill it),
the first is the other server behind the router; the one killed is
restarted in place before the test ends, so the package's other tests
find it as they expect.

* Load from the engine's own metrics: requests sent to the server behind
  the router's back fill its queue (vLLM's ``num_requests_waiting``),
  which is held there by stopping its engine core; the router's queue
  scorer sends new work to the other server while the queue lasts, and
  work comes back once it is gone.
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

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.procs import Proc, Procs
from harness.vllm import (
    BLOCK_SIZE,
    MAX_MODEL_LEN,
    MODEL,
    VllmServer,
    ipc_dir,
    router_config,
)
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
# output tokens of the shortest flood request: the seqs running at once use
# under half of the KV cache, so the queue, not the cache, fills
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
        # lengths apart, so they end one by one and the queue never empties
        # while ended ones are sent again (all of one length ended together)
        body = {"model": MODEL, "prompt": f"Tell me everything, {i}.",
                "max_tokens": FLOOD_TOKENS + 48 * i, "stream": True, **FIXED}
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

    def running(self) -> bool:
        """True while every client is still at it; a client that failed
        fails the test at once, with its error, rather than a wait for a
        queue that can no longer form."""
        for f in self.futures:
            if f.done():
                f.result()  # raises what ended it
                raise AssertionError("a flood client stopped before the flood ended")
        return True

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.pool.shutdown()
        for f in self.futures:
            f.result()  # a request that failed fails the test


def _engine_waiting(engine: VllmServer) -> float:
    """The engine's own queue (its /metrics)."""
    text = httpx.get(engine.url + "/metrics", timeout=10).text
    return sum(s.value for f in text_string_to_metric_families(text)
               if f.name == "vllm:num_requests_waiting" for s in f.samples)


def _answered_by(router: Proc, content: str) -> str:
    """The endpoint that answered a chat through the router, or what
    happened instead (one sent to the frozen server waits there)."""
    try:
        r = httpx.post(router.url + "/v1/chat/completions", timeout=15, json={
            "model": MODEL, "messages": [{"role": "user", "content": content}],
            "max_tokens": 2, **FIXED})
    except httpx.TimeoutException:
        return "no answer in 15 s (the frozen server's?)"
    return str(r.headers.get("x-toposerve-endpoint", f"HTTP {r.status_code}: {r.text[:200]}"))


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
        with Flood(full, full.max_num_seqs + 8) as flood:
            for _ in range(20):
                wait_for("the router to scrape the full server's queue",
                         lambda: flood.running() and endpoint_metric(router, waiting, full) >= 1,
                         timeout=120, interval=0.05)
                # held while the six are sent (see engine_frozen)
                with full.engine_frozen():
                    if _engine_waiting(full) < 1:
                        print("[engine] the queue drained before it was held")
                        continue  # it drained before the freeze: caught again
                    wait_for("the router to read the held queue",
                             lambda: endpoint_metric(router, waiting, full) >= 1, timeout=10)
                    before = router.metric(by_queue, reason="queue")
                    # each its own prompt from the first token: no prefix to follow
                    where = [_answered_by(router, f"[{i} {salt}] Hello.") for i in range(6)]
                    decided = router.metric(by_queue, reason="queue") - before
                    break
            else:
                pytest.fail("20 times the full server's queue drained before it was held")
        assert where == [other.hostport] * 6
        assert decided == 6
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


def _killed_while_streaming(client: openai.OpenAI, router: Proc, victim: VllmServer,
                            kept: str) -> tuple[openai.APIError, float] | None:
    """``kept`` cached on ``victim`` behind the router's back, then streamed
    through the router (which follows it there) and ``victim`` killed (its
    whole process group, as a node or OOM kill does) the moment the
    answer's headers come: the SDK's error and how long after the kill it
    came, or None when the answer had ended whole before the kill landed
    (the tiny model makes ~900 tokens a second on a quiet core: a test
    process held off the CPU for a second misses it)."""
    before = wait_for("the replayed blocks to settle", lambda: settled(router, victim),
                      timeout=30)[0]
    blocks = chat(victim.url, kept).json()["usage"]["prompt_tokens"] // BLOCK_SIZE
    wait_for("the router to index the prompt",
             lambda: held(router, victim) >= before + blocks, timeout=30)
    with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=[{"role": "user", "content": kept}], max_tokens=LONG // 2,
            stream=True, stream_options={"include_usage": True}, extra_body=FIXED) as streamed:
        # the router's headers go out with the first event: the answer has begun
        victim.kill()
        killed = time.monotonic()
        assert streamed.headers["x-toposerve-endpoint"] == victim.hostport
        try:
            chunks = list(streamed.parse())
        except openai.APIError as err:
            return err, time.monotonic() - killed
    # no error: only an answer that was whole may end without one
    usage = chunks[-1].usage
    assert usage is not None and usage.completion_tokens == LONG // 2, chunks[-3:]
    print(f"[engine] the answer ended whole before kill -9 landed ({len(chunks)} chunks)")
    return None


def killed_mid_stream_and_restarted(procs: Procs, other: VllmServer, victim: VllmServer,
                                    model_dir: Path) -> None:
    router = procs.router({**router_config([other, victim], model_dir), "profile": precise_only(5),
        "scrape": {"intervalSeconds": 0.1}})
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0,
                           timeout=30)
    salt = uuid.uuid4().hex
    kept = f"[{salt} kept] " + "A long story. " * 100
    for _ in range(3):
        if (broke := _killed_while_streaming(client, router, victim, kept)) is not None:
            break
        victim.restart()  # and again, from an empty cache
        victim.wait_ready()
        wait_for("the router to take it back", lambda: healthy(router, victim), timeout=30)
    else:
        pytest.fail("three answers ended whole before kill -9 landed")
    err, took = broke
    assert took < 10, took
    assert isinstance(err.body, dict), err.body
    assert err.body["code"] == 502 and victim.hostport in err.body["message"]
    print(f"[engine] SSE error {took:.2f}s after kill -9: {err.body['message']}")
    # its blocks are gone with it, and so is its work
    wait_for("the killed server's blocks to leave the index",
             lambda: held(router, victim) == 0, timeout=10)
    wait_for("the router to mark it unhealthy", lambda: not healthy(router, victim),
             timeout=10)
    for i in range(3):
        r = chat(router.url, f"{kept} [{i}]")
        assert r.headers["x-toposerve-endpoint"] == other.hostport
    # a new process on the same port: back, with nothing cached, and the
    # sockets the killed one left in its own directory removed
    left = set(ipc_dir(victim.port).iterdir())
    assert left, "vLLM made its sockets elsewhere (VLLM_RPC_BASE_PATH)"
    started = time.monotonic()
    victim.restart()
    victim.wait_ready()
    assert left.isdisjoint(ipc_dir(victim.port).iterdir())
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
