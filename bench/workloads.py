"""Benchmark workloads, scaled to this machine but keeping their shape.

* ``agentic``: coding-agent sessions shaped by llm-d's study of production
  agent traffic (docs/design.md §8): long, slowly growing prompts, heavy-
  tailed think times, sub-agent groups that share their parent's prefix.
  Closed loop: each turn appends the real answer of the previous one.
* ``mooncake``: the Mooncake conversation trace, replayed open-loop at its
  recorded (compressed) times, text synthesised from its block ids.

The router benchmark also runs the agentic sessions under KV-cache pressure
(more sessions than the fleet's caches hold: ``working_set_tokens`` sizes
them) and against uneven endpoints (one slow simulator).
"""

from __future__ import annotations

import itertools
import json
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from toposerve.wire.tokens import BYTES_PER_TOKEN

MOONCAKE_BLOCK_TOKENS = 512
_ALPHABET = "abcdefghijklmnopqrstuvwxyz      ,.\n"


def text_tokens(n_tokens: int, seed: int | str) -> str:
    """Deterministic filler of exactly ``n_tokens`` byte-tokens (ASCII)."""
    rng = random.Random(seed)
    return "".join(rng.choices(_ALPHABET, k=n_tokens * BYTES_PER_TOKEN))


def lognormal(rng: random.Random, p50: float, p90: float, cap: float) -> float:
    sigma = math.log(p90 / p50) / 1.2816
    return min(cap, p50 * math.exp(rng.gauss(0, sigma)))


@dataclass
class AgentTurn:
    user_tokens: int
    max_tokens: int
    think_s: float  # model seconds before this turn
    subagents: list[list[int]] = field(default_factory=list)  # per sub-agent: user tokens


@dataclass
class AgentSession:
    sid: int
    start_s: float
    system: str
    turns: list[AgentTurn]


def agentic(sessions: int = 16, turns: int = 8, scale: float = 1 / 20,
            seed: int = 0, output_scale: float | None = None) -> list[AgentSession]:
    """p50/p90/p99 from the study, multiplied by ``scale`` for token counts
    (``output_scale``, when given, for the answers' instead)."""
    out_scale = scale if output_scale is None else output_scale
    rng = random.Random(seed)
    out = []
    for s in range(sessions):
        base = int(lognormal(rng, 195_000 * scale, 521_000 * scale, 849_000 * scale))
        ts = []
        for _ in range(turns):
            subs = []
            if rng.random() < 0.25:  # a group of sub-agents forks off this turn
                # at least a token: a small scale must not make an empty message
                subs = [[max(1, int(lognormal(rng, 632 * scale * 4, 5000 * scale,
                                              20_000 * scale)))]
                        * rng.randint(1, 2) for _ in range(rng.randint(2, 4))]
            ts.append(AgentTurn(
                user_tokens=max(4, int(lognormal(rng, 632 * scale, 2500 * scale,
                                                 10_000 * scale))),
                max_tokens=max(2, int(lognormal(rng, 317 * out_scale, 1705 * out_scale,
                                                7551 * out_scale))),
                think_s=lognormal(rng, 2.0, 24.0, 30.0), subagents=subs))
        out.append(AgentSession(sid=s, start_s=rng.uniform(0, 10), turns=ts,
                                system=text_tokens(base, f"system-{seed}-{s}")))
    return out


def working_set_tokens(sessions: list[AgentSession]) -> int:
    """Prompt tokens the sessions' caches come to by their last turns, at
    the replay's byte tokens: each system prompt, every user turn and answer
    (at most ``max_tokens``), and each sub-agent's own turns and answers
    (they share their parent's first two messages). What a fleet must hold
    for no session to lose its prefix."""
    total = 0
    for s in sessions:
        total += len(s.system) // BYTES_PER_TOKEN
        for t in s.turns:
            total += t.user_tokens + t.max_tokens
            total += sum(size + 8 for sizes in t.subagents for size in sizes)
    return total


@dataclass
class TraceRequest:
    at_s: float
    prompt: str
    max_tokens: int


def spread_ticks(stamps_ms: list[float]) -> list[float]:
    """Arrival times for a trace whose clock ticks coarsely (Mooncake's
    conversation trace stamps about ten requests with each 3-second tick):
    the requests of a tick spaced evenly, in trace order, until the next
    tick; the last tick's as wide as the one before it."""
    ticks = sorted(set(stamps_ms))
    width = {t: nxt - t for t, nxt in itertools.pairwise(ticks)}
    if ticks:
        width[ticks[-1]] = width[ticks[-2]] if len(ticks) > 1 else 0.0
    count = Counter(stamps_ms)
    seen: dict[float, int] = {}
    out = []
    for t in stamps_ms:
        k = seen[t] = seen.get(t, -1) + 1
        out.append(t + k * width[t] / count[t])
    return out


def mooncake(path: Path, limit: int = 500, time_compression: float = 8.0,
             token_scale: float = 0.5, output_scale: float = 0.1,
             spread: bool = False) -> list[TraceRequest]:
    """The first ``limit`` requests; block texts are shared by block id, so
    shared ids become shared prefixes; the tail is unique per request.
    ``spread``: each tick's requests spaced over the tick (spread_ticks)
    instead of sent together."""
    blocks: dict[int, str] = {}
    block_tokens = max(1, int(MOONCAKE_BLOCK_TOKENS * token_scale))
    with path.open() as f:
        recs = [json.loads(line) for _, line in zip(range(limit), f, strict=False)]
    stamps = [float(r["timestamp"]) for r in recs]
    arrivals = spread_ticks(stamps) if spread else stamps
    out = []
    for i, (rec, at_ms) in enumerate(zip(recs, arrivals, strict=True)):
        ids = rec["hash_ids"]
        body = "".join(blocks.setdefault(h, text_tokens(block_tokens, f"mc-{h}")) for h in ids)
        want = int(rec["input_length"] * token_scale)
        have = len(body) // BYTES_PER_TOKEN
        if want > have:
            body += text_tokens(want - have, f"mc-tail-{i}")
        out.append(TraceRequest(at_s=at_ms / 1000 / time_compression,
                                prompt=body[: want * BYTES_PER_TOKEN] or body,
                                max_tokens=max(1, int(rec["output_length"] * output_scale))))
    return out
