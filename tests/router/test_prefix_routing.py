"""Prefix-aware routing against real simulators: sessions stay on their
endpoint until it saturates, and the KV-event (precise) path and the
approximate path make the same decisions on a controlled workload."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import httpx

from harness.procs import MODEL, Proc, Procs
from harness.waiting import wait_for
from toposerve.localcluster.ports import free_port
from toposerve.wire.prompt import chat_prompt
from toposerve.wire.tokens import ByteTokenizer


def chat(router: Proc, messages: list[dict[str, str]], session: str | None = None,
         max_tokens: int = 4) -> tuple[str, dict[str, Any]]:
    headers = {"x-session-id": session} if session else {}
    r = httpx.post(router.url + "/v1/chat/completions", headers=headers, timeout=30,
                   json={"model": MODEL, "messages": messages, "max_tokens": max_tokens})
    assert r.status_code == 200, r.text
    return r.headers["x-toposerve-endpoint"], r.json()


def router_waiting(router: Proc, endpoint: str) -> float:
    """Waiting requests at ``endpoint`` as the router last scraped them."""
    return sum(s.value for s in router.samples()
               if s.name == "toposerve_router_endpoint_waiting"
               and s.labels.get("endpoint") == endpoint)


def turn_messages(session: int, turns: int) -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": f"You are agent {session}. " + "rules " * 200}]
    for t in range(turns):
        msgs.append({"role": "user", "content": f"step {t} of task {session}: " + "ctx " * 60})
        msgs.append({"role": "assistant", "content": "ok " * 10})
    return msgs[:-1]


def test_sessions_stick_until_saturated(procs: Procs) -> None:
    sims = [procs.sim(max_num_seqs=2, decode_s_per_token=0.02, time_scale=0.1)
            for _ in range(3)]
    router = procs.router({"saturation": {"queueThreshold": 2}}, endpoints=[s.url for s in sims])
    placed: dict[int, set[str]] = {}
    for turn in range(1, 6):
        for session in range(6):
            ep, body = chat(router, turn_messages(session, turn), session=f"s{session}")
            placed.setdefault(session, set()).add(ep)
            if turn > 1:  # the earlier turns' prompt is cached where they ran
                assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert all(len(eps) == 1 for eps in placed.values()), placed
    assert len({next(iter(e)) for e in placed.values()}) > 1  # sessions spread out
    # saturate session 0's endpoint directly, bypassing the router
    home = next(iter(placed[0]))
    busy = next(s for s in sims if s.url.endswith(home))
    flood = [threading.Thread(target=httpx.post, args=(busy.url + "/v1/completions",),
                              kwargs={"json": {"prompt": f"flood {i}", "max_tokens": 300},
                                      "timeout": 60}) for i in range(6)]
    for t in flood:
        t.start()
    # until the router's own view (its last scrape) shows the queue
    wait_for(f"the router to see {home} saturated",
             lambda: router_waiting(router, home) >= 2, timeout=15, interval=0.05)
    ep, _ = chat(router, turn_messages(0, 6), session="s0")
    assert ep != home  # saturated: the session moves on
    for t in flood:
        t.join()
    ep2, _ = chat(router, turn_messages(0, 7), session="s0")
    assert ep2 == ep  # and sticks to its new home


def _kv_sims(procs: Procs, n: int, encoding: str) -> list[tuple[Proc, str, str]]:
    out = []
    for _ in range(n):
        pub, rep = free_port(), free_port()
        sim = procs.sim(kv_events_port=pub, kv_events_replay_port=rep,
                        kv_events_encoding=encoding, time_scale=0.01)
        out.append((sim, f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}"))
    return out


def _workload() -> list[list[dict[str, str]]]:
    # 4 sessions of 4 turns, interleaved; sessions 0 and 1 share a long system prompt
    reqs = []
    for turn in range(1, 5):
        for s in range(4):
            msgs = turn_messages(s % 2 if s < 2 else s, turn)
            msgs[1]["content"] += f" session {s}"
            reqs.append(msgs)
    return reqs


def precise_blocks(router: Proc) -> float:
    return sum(s.value for s in router.samples()
               if s.name == "toposerve_router_prefix_index_blocks"
               and s.labels.get("index") == "precise")


def _run(router: Proc, sims: list[Proc], precise: bool) -> tuple[list[int], int]:
    index = {s.url.removeprefix("http://"): i for i, s in enumerate(sims)}
    decisions, cached = [], 0
    held: list[set[tuple[int, ...]]] = [set() for _ in sims]  # block chains each sim holds
    for msgs in _workload():
        ep, body = chat(router, msgs, max_tokens=1)
        decisions.append(index[ep])
        cached += body["usage"]["prompt_tokens_details"]["cached_tokens"]
        if precise:  # the next decision needs this one's KV events in the index
            tokens = ByteTokenizer().encode(chat_prompt(msgs))
            held[index[ep]] |= {tuple(tokens[:k]) for k in range(16, len(tokens) + 1, 16)}
            want = sum(len(h) for h in held)
            wait_for(f"{want} blocks in the precise index",
                     lambda: precise_blocks(router) >= want)  # noqa: B023
    return decisions, cached


def test_precise_and_approx_agree(procs: Procs) -> None:
    scorers = {"approx": {"type": "prefix-approx", "weight": 1, "params": {"blockBytes": 64}},
               "precise": {"type": "prefix-precise", "weight": 1}}
    results = {}
    for kind, encoding in (("approx", "array"), ("precise", "map")):
        sims = _kv_sims(procs, 3, encoding)
        cfg = {"profile": {"scorers": [scorers[kind]],
                           "picker": {"type": "max-score", "params": {"seed": 7}}},
               "kvEvents": {"tokenizer": "bytes", "blockSize": 16},
               "discovery": {"static": [{"url": s.url, "kvEvents": pub, "kvEventsReplay": rep}
                                        for s, pub, rep in sims]}}
        router = procs.router(cfg)
        results[kind] = _run(router, [s for s, _, _ in sims], kind == "precise")
    (d_approx, c_approx), (d_precise, c_precise) = results["approx"], results["precise"]
    assert d_approx == d_precise
    assert c_approx == c_precise > 0


def test_precise_index_replays_history(procs: Procs) -> None:
    """Blocks stored before the router connected arrive by replay."""
    sims = _kv_sims(procs, 2, "array")
    warm, _, _ = sims[1]
    msgs = turn_messages(9, 3)
    httpx.post(warm.url + "/v1/chat/completions", timeout=30,
               json={"model": MODEL, "messages": msgs, "max_tokens": 1})
    router = procs.router({
        "profile": {"scorers": [{"type": "prefix-precise", "weight": 1}]},
        "kvEvents": {"tokenizer": "bytes"},
        "discovery": {"static": [{"url": s.url, "kvEvents": pub, "kvEventsReplay": rep}
                                 for s, pub, rep in sims]}})
    wait_for("the replayed blocks", lambda: precise_blocks(router) > 0)
    for _ in range(5):
        ep, body = chat(router, msgs, max_tokens=1)
        assert ep == warm.url.removeprefix("http://")
        assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    assert precise_blocks(router) > 0


def test_precise_with_a_hugging_face_tokenizer(procs: Procs, tmp_path: Path) -> None:
    """A real ``tokenizers`` tokenizer file, shared by the servers and the
    router: the KV-event path keys blocks by real token ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = [f"w{i}" for i in range(500)]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(["[UNK]", *words])},
                                     unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    sims = []
    for _ in range(2):
        pub, rep = free_port(), free_port()
        sims.append((procs.sim(kv_events_port=pub, kv_events_replay_port=rep,
                               tokenizer=str(path), time_scale=0.01),
                     f"tcp://127.0.0.1:{pub}", f"tcp://127.0.0.1:{rep}"))
    router = procs.router({
        "profile": {"scorers": [{"type": "prefix-precise", "weight": 1}]},
        "kvEvents": {"tokenizer": str(path), "blockSize": 16},
        "discovery": {"static": [{"url": s.url, "kvEvents": pub, "kvEventsReplay": rep}
                                 for s, pub, rep in sims]}})
    text = " ".join(words[i % 500] for i in range(400))
    warm = sims[1][0]
    r = httpx.post(warm.url + "/v1/completions", json={"prompt": text, "max_tokens": 1})
    assert r.json()["usage"]["prompt_tokens"] == 400  # real tokens, not bytes
    wait_for("the warm server's blocks", lambda: precise_blocks(router) >= 400 // 16)
    for i in range(4):
        r = httpx.post(router.url + "/v1/completions",
                       json={"prompt": text + f" w{i}", "max_tokens": 1})
        assert r.headers["x-toposerve-endpoint"] == warm.url.removeprefix("http://")
        assert r.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == 400


def test_prefill_speed_learned_from_streamed_answers(procs: Procs) -> None:
    """The relay times each streamed answer's first byte against the prefill
    that stood before it: a simulator four times slower to prefill is
    learned as about that much slower, and the gauge shows each speed."""
    fast = procs.sim(prefill_s_per_token=0.0001, time_scale=0.2)
    slow = procs.sim(prefill_s_per_token=0.0004, time_scale=0.2)
    router = procs.router(endpoints=[fast.url, slow.url])
    served: set[str] = set()
    for i in range(8):  # unrelated prompts of about 3,000 tokens: no cache hits
        prompt = f"task {i}: " + f"words of task {i} " * 700
        with httpx.stream("POST", router.url + "/v1/completions", timeout=30, json={
                "model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": True}) as r:
            assert r.status_code == 200
            served.add(r.headers["x-toposerve-endpoint"])
            r.read()
    assert served == {fast.url.removeprefix("http://"), slow.url.removeprefix("http://")}
    speed = {s.labels["endpoint"]: s.value for s in router.samples()
             if s.name == "toposerve_router_endpoint_prefill_seconds_per_token"}
    f, sl = speed[fast.url.removeprefix("http://")], speed[slow.url.removeprefix("http://")]
    assert 0 < f < sl
    assert 2.5 < sl / f < 6, speed  # prefill dominates what the first byte waits for
