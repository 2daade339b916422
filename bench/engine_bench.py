"""The router benchmark on real engines (``python -m bench.router_bench
--engine vllm``): each router in front of the same two vLLM servers (the
CPU build ``make engines`` caches, one core each, with the engine tier's
flags), their prefix caches emptied before each router, through agentic
sessions and a KV-pressure workload scaled to the tiny model's length.

Hits come from the engines, not the routers: ``vllm:prefix_cache_hits_total``
over ``vllm:prefix_cache_queries_total`` (the counters' change over the
run) and the ``cached_tokens`` each answer's usage reports. Here the
engines, not the routers, bound the speed: 2 cores run both servers and
the router.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import tokenizers

from bench.replay import Run, Target, replay_agentic
from bench.report import medians, pct
from bench.router_bench import PEERS, ROUTERS, SCRAPE_S, Start, bars, order, ours_with
from bench.workloads import AgentSession, AgentTurn, agentic, text_tokens
from harness.engines import installed
from harness.procs import Proc, Procs
from harness.vllm import (
    BLOCK_SIZE,
    KV_CACHE_BYTES,
    MAX_MODEL_LEN,
    MODEL,
    VllmServer,
    router_config,
    start_many,
)
from toposerve.localcluster.results import table as md_table
from toposerve.localcluster.results import write
from toposerve.router.config import ProfileConfig

N_ENGINES = 2  # one a core
# the tiny model's KV: 2 layers x (K + V) x 128 hidden x 2 bytes a token
KV_TOKENS = KV_CACHE_BYTES // (2 * 2 * 128 * 2)
# The agentic study's token counts times this: system prompts of about
# 300 of the tiny model's tokens at the median (the filler text is about 3
# model tokens a workload token), heavy-tailed up to SYSTEM_CAP.
SCALE = 1 / 2000
OUTPUT_SCALE = 1 / 20  # answers as the simulator runs them: 16 tokens at the median
SYSTEM_CAP = 1000  # model tokens: a session's turns still fit beside it
FIT = int(0.8 * MAX_MODEL_LEN)  # a prompt and its answer, with room for answers re-tokenised
PER_MESSAGE = 6  # ChatML's <|im_start|>role\n ... <|im_end|>\n
TIME_SCALE = 0.1  # think times and arrivals: 2 s at the median becomes 0.2 s
KV_PRESSURE = 2.0  # the sessions' working set over both servers' KV caches
# greedy and fixed-length: every router's run asks the engines for the same work
BODY = {"ignore_eos": True, "temperature": 0}
# toposerve as docs/engines.md deploys it in front of vLLM (the default
# profile with prefix-precise, fed by the KV events), and as shipped (the
# approximate index alone)
PRECISE = "toposerve"
APPROX = "toposerve[approx]"
ENGINE_ROUTERS = ("round-robin", PRECISE, "vllm-router cache_aware", "vllm-router kv_aware",
                  "sglang-router cache_aware", "smg cache_aware")
CHOICES = (*ENGINE_ROUTERS, APPROX)
WORKLOADS = ("agentic", "kv-pressure")
WORKERS_TIMEOUT_S = 120.0
SOURCE_COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total",
                   "vllm:request_success_total", "vllm:generation_tokens_total",
                   "vllm:time_to_first_token_seconds_sum",
                   "vllm:time_to_first_token_seconds_count")


class Fit:
    """Sizes the sessions in the tiny model's own tokens (its tokenizer)."""

    def __init__(self, model: Path) -> None:
        self.tok = tokenizers.Tokenizer.from_file(str(model / "tokenizer.json"))

    def tokens(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids) + PER_MESSAGE

    def session(self, s: AgentSession) -> AgentSession:
        """``s`` with its system prompt cut to SYSTEM_CAP and only the
        turns whose prompt and answer fit in FIT."""
        system = s.system
        offsets = self.tok.encode(system, add_special_tokens=False).offsets
        if len(offsets) + PER_MESSAGE > SYSTEM_CAP:  # cut where its token SYSTEM_CAP starts
            system = system[: offsets[SYSTEM_CAP - PER_MESSAGE][0]]
        used = self.tokens(system)
        turns: list[AgentTurn] = []
        for k, t in enumerate(s.turns):
            # the replay's user text for this turn (bench.replay._agent)
            used += self.tokens(text_tokens(t.user_tokens, f"user-{s.sid}-{k}"))
            if used + t.max_tokens > FIT:
                break
            turns.append(t)
            used += t.max_tokens + PER_MESSAGE
        return replace(s, system=system, turns=turns)

    def working_set(self, s: AgentSession) -> int:
        """Model tokens the session's cache comes to (its last prompt and
        answer, and its sub-agents' own turns)."""
        total = self.tokens(s.system)
        for k, t in enumerate(s.turns):
            total += self.tokens(text_tokens(t.user_tokens, f"user-{s.sid}-{k}")) + t.max_tokens
            total += sum(self.tokens(text_tokens(size, "")) + 8
                         for sizes in t.subagents for size in sizes)
        return total


def sessions(fit: Fit, workload: str, count: int, turns: int, seed: int) -> list[AgentSession]:
    """agentic: ``count`` sessions; kv-pressure: as many as make a working
    set KV_PRESSURE times both servers' caches (``count`` at least)."""
    if workload == "agentic":
        return [fit.session(s) for s in agentic(count, turns, SCALE, seed, OUTPUT_SCALE)]
    out: list[AgentSession] = []
    total = 0
    # the sessions of a seed come from one random stream: more is the same ones and others
    for s in agentic(max(count, 1000), turns, SCALE, seed + 1000, OUTPUT_SCALE):
        if total >= KV_PRESSURE * N_ENGINES * KV_TOKENS and len(out) >= count:
            break
        out.append(fitted := fit.session(s))
        total += fit.working_set(fitted)
    return out


@dataclass
class EngineRow:
    workload: str
    router: str
    seed: int
    sessions: int
    requests: int
    failed: int
    hit_rate: float  # vllm:prefix_cache_hits_total / queries_total, both engines
    cached_share: float  # sum of usage cached_tokens / prompt_tokens
    ttft_p50_ms: float
    ttft_p99_ms: float
    engine_ttft_ms: float  # the engines' own mean TTFT (their histogram)
    # the clients' mean TTFT minus the engines': the router, the network and
    # the engines' HTTP front ends
    outside_engine_ms: float
    throughput_rps: float
    tokens_per_s: float  # generated
    max_over_mean_load: float  # requests each engine served
    router_cpu_ms_per_request: float


def as_proc(s: VllmServer) -> Proc:
    """A view of ``s`` that the peer routers' starters take (bench.router_bench.peer)."""
    return Proc(s.url, s.popen, s.log, {"kv_events": s.kv_events, "model": MODEL,
                                        "block_size": BLOCK_SIZE})


def with_workers(start: Start) -> Start:
    """A peer router's ``start``, returning once it lists every server as a
    healthy worker: its /health answers before it has registered any, and
    registering a vLLM server takes sglang-router seconds (it looks for
    SGLang's metadata first), so requests sent at once get 503."""
    def go(procs: Procs, servers: list[Proc]) -> Proc:
        router = start(procs, servers)
        deadline = time.monotonic() + WORKERS_TIMEOUT_S
        while True:
            with contextlib.suppress(httpx.HTTPError, ValueError):
                workers = httpx.get(router.url + "/workers", timeout=2).json()["workers"]
                if len(workers) >= len(servers) and all(w.get("is_healthy", True)
                                                        for w in workers):
                    return router
            if time.monotonic() > deadline:
                raise RuntimeError(f"{router.log.name}: not every server a healthy worker "
                                   f"after {WORKERS_TIMEOUT_S:.0f}s (GET /workers)")
            time.sleep(0.2)
    return go


def precise_profile() -> dict[str, Any]:
    """The default profile, its prefix scorer reading the engines' KV
    events (docs/engines.md): the other scorers as shipped."""
    scorers = [s.model_dump(by_alias=True) for s in ProfileConfig().scorers]
    for s in scorers:
        if s["type"] == "prefix-approx":
            s["type"] = "prefix-precise"
    return {"scorers": scorers}


def starters(servers: list[VllmServer], model: Path) -> dict[str, Start]:
    """How each router starts in front of ``servers``."""
    return {**{n: with_workers(ROUTERS[n]) for n in ENGINE_ROUTERS if n != PRECISE},
            # the scrape as shipped: Procs.router's 0.05 s for tests would have
            # each engine render its /metrics 20 times a second on its one core
            PRECISE: lambda procs, _: procs.router({**router_config(servers, model),
                                                    "profile": precise_profile(),
                                                    "scrape": {"intervalSeconds": SCRAPE_S}}),
            APPROX: ours_with()}


def missing(name: str) -> str | None:
    """Why the router ``name`` cannot run here, or None."""
    if name.startswith("toposerve"):
        return None
    binary = "vllm-router" if name == "round-robin" else name.split()[0]
    if not (PEERS / binary).exists():
        return f"{binary} is not installed in {PEERS.parent} (run `make peers`)"
    return None


def counters(servers: list[VllmServer]) -> list[dict[str, float]]:
    out = []
    for s in servers:
        c = as_proc(s).counters()
        out.append({k: c.get(k, 0.0) for k in SOURCE_COUNTERS})
    return out


def run_one(tmp: Path, servers: list[VllmServer], start: Start, name: str, workload: str,
            payload: list[AgentSession], seed: int) -> tuple[EngineRow, dict[str, int]]:
    """``name`` through ``payload``: its row, and its failed answers by what they said."""
    for s in servers:
        s.reset_cache()  # each router begins on empty caches
    procs = Procs(tmp)
    try:
        router = start(procs, [as_proc(s) for s in servers])
        time.sleep(0.5)
        before = counters(servers)
        cpu0 = router.cpu_seconds()
        run: Run = asyncio.run(replay_agentic(Target(router.url, MODEL, BODY), payload,
                                              TIME_SCALE, timeout_s=300))
        cpu = router.cpu_seconds() - cpu0
        after = counters(servers)
    finally:
        procs.close()
    d = [{k: a[k] - b[k] for k in a} for a, b in zip(after, before, strict=True)]

    def total(k: str) -> float:
        return sum(x[k] for x in d)

    ok = run.ok
    ttfts = [1000 * r.ttft for r in ok if r.ttft is not None]
    served = [x["vllm:request_success_total"] for x in d]
    prompt = sum(r.prompt_tokens for r in ok)
    queries = total("vllm:prefix_cache_queries_total")
    engine_ttft = 1000 * total("vllm:time_to_first_token_seconds_sum") / max(
        1.0, total("vllm:time_to_first_token_seconds_count"))
    return EngineRow(
        workload=workload, router=name, seed=seed, sessions=len(payload),
        requests=len(run.results), failed=len(run.results) - len(ok),
        hit_rate=total("vllm:prefix_cache_hits_total") / queries if queries else 0.0,
        cached_share=sum(r.cached_tokens for r in ok) / prompt if prompt else 0.0,
        ttft_p50_ms=pct(ttfts, 0.5), ttft_p99_ms=pct(ttfts, 0.99),
        engine_ttft_ms=engine_ttft,
        outside_engine_ms=(statistics.mean(ttfts) if ttfts else 0.0) - engine_ttft,
        throughput_rps=len(ok) / run.wall_s,
        tokens_per_s=sum(r.completion_tokens for r in ok) / run.wall_s,
        max_over_mean_load=max(served) / statistics.mean(served) if any(served) else 0.0,
        router_cpu_ms_per_request=1000 * cpu / max(1, len(run.results))), run.errors()


def table(rows: list[EngineRow], per_seed: bool = False) -> str:
    """The medians over seeds, or (``per_seed``) each run with its seed."""
    return md_table(
        ["workload", "router", *(["seed"] if per_seed else []), "sessions", "requests",
         "hit rate (engine counters)", "cached share (usage)", "TTFT p50 ms", "TTFT p99 ms",
         "engine TTFT mean ms", "TTFT outside engine ms", "req/s", "tokens/s",
         "max/mean requests", "router CPU ms/req", "failed"],
        ([r.workload, r.router, *([r.seed] if per_seed else []), r.sessions, r.requests,
          f"{r.hit_rate:.1%}", f"{r.cached_share:.1%}", f"{r.ttft_p50_ms:.0f}",
          f"{r.ttft_p99_ms:.0f}", f"{r.engine_ttft_ms:.0f}", f"{r.outside_engine_ms:.0f}",
          f"{r.throughput_rps:.2f}",
          f"{r.tokens_per_s:.0f}", f"{r.max_over_mean_load:.2f}",
          f"{r.router_cpu_ms_per_request:.2f}", r.failed] for r in rows),
        "ll" + "r" * (14 if per_seed else 13))


def against_peers(runs: list[EngineRow]) -> str:
    """Per workload, on how many seeds ours (precise) had a hit rate at
    least the best peer's and TTFT p50 and p99 at most the best peer's."""
    lines = []
    for wl in dict.fromkeys(r.workload for r in runs):
        seeds = sorted({r.seed for r in runs if r.workload == wl})
        hit = p50 = p99 = n = 0
        for seed in seeds:
            mine = [r for r in runs if (r.workload, r.seed) == (wl, seed)]
            ours = next((r for r in mine if r.router == PRECISE), None)
            peers = [r for r in mine if not r.router.startswith("toposerve")]
            if ours is None or not peers:
                continue
            n += 1
            hit += ours.hit_rate >= max(r.hit_rate for r in peers)
            p50 += ours.ttft_p50_ms <= min(r.ttft_p50_ms for r in peers)
            p99 += ours.ttft_p99_ms <= min(r.ttft_p99_ms for r in peers)
        if n:
            lines.append([wl, n, f"{hit}/{n}", f"{p50}/{n}", f"{p99}/{n}"])
    return md_table(["workload", "seeds", "hit rate >= best peer", "TTFT p50 <= best peer",
                     "TTFT p99 <= best peer"], lines, "lrrrr") if lines else ""


def plot(rows: list[EngineRow], path: Path) -> None:
    bars(rows, list(dict.fromkeys(r.workload for r in rows)),
         [("hit_rate", "prefix-cache hit rate (engine counters)"),
          ("ttft_p50_ms", "TTFT p50 (ms)"), ("ttft_p99_ms", "TTFT p99 (ms)")],
         "routers in front of two real vLLM CPU servers (tiny model), medians over seeds",
         path)


def measure(tmp: Path, names: list[str], workloads: list[str], fit: Fit, model: Path,
            count: int, turns: int, seeds: int) -> tuple[list[EngineRow], dict[str, Any]]:
    """Every router through every workload and seed (the routers' order
    rotated each seed), on one pair of servers: the rows, and each run's
    failed answers."""
    runs: list[EngineRow] = []
    errors: dict[str, Any] = {}
    t0 = time.monotonic()
    servers = start_many(tmp, N_ENGINES)
    print(f"  two vLLM servers ready in {time.monotonic() - t0:.0f}s", file=sys.stderr)
    try:
        start = starters(servers, model)
        for wl in workloads:
            for seed in range(seeds):
                payload = sessions(fit, wl, count, turns, seed)
                for name in order(names, seed):
                    t0 = time.monotonic()
                    row, failed = run_one(tmp, servers, start[name], name, wl, payload, seed)
                    runs.append(row)
                    if failed:
                        errors[f"{wl} #{seed} {name}"] = failed
                    print(f"  {wl:11} #{seed} {name:26} hit {row.hit_rate:6.1%}  TTFT p50 "
                          f"{row.ttft_p50_ms:6.0f} ms p99 {row.ttft_p99_ms:6.0f} ms  "
                          f"failed {row.failed} {next(iter(failed), '')[:120]}  "
                          f"({time.monotonic() - t0:.0f}s)", file=sys.stderr, flush=True)
    finally:
        for s in servers:
            s.stop()
    return runs, errors


def run(args: argparse.Namespace) -> int:
    """router_bench's arguments: --routers, --workloads, --sessions,
    --repeats (seeds), --quick, --out, --name."""
    names: list[str] = args.routers or list(ENGINE_ROUTERS)
    if wrong := [n for n in names if n not in CHOICES]:
        print(f"error: --routers: {', '.join(wrong)} not run on real engines; choose from "
              f"{', '.join(CHOICES)}", file=sys.stderr)
        return 2
    workloads: list[str] = args.workloads or list(WORKLOADS)
    if wrong := [w for w in workloads if w not in WORKLOADS]:
        print(f"error: --workloads: {', '.join(wrong)} not run on real engines; choose from "
              f"{', '.join(WORKLOADS)}", file=sys.stderr)
        return 2
    skipped = {n: why for n in names if (why := missing(n)) is not None}
    for n, why in skipped.items():
        print(f"skipping {n}: {why}", file=sys.stderr)
    names = [n for n in names if n not in skipped]
    _, model = installed()
    with tempfile.TemporaryDirectory() as tmp:
        runs, errors = measure(Path(tmp), names, workloads, Fit(model), model,
                               args.sessions or (4 if args.quick else 8),
                               3 if args.quick else 4, args.repeats)
    runs.sort(key=lambda r: (workloads.index(r.workload), r.seed, names.index(r.router)))
    rows = medians(runs, ("workload", "router"), summed=("requests", "failed"))
    notes = "\n".join([*(f"skipped {n}: {why}" for n, why in skipped.items()),
                       *(f"failed, {k}: {n} x {what[:200]}" for k, e in errors.items()
                         for what, n in e.items())])
    write(Path(args.out), args.name or "router_bench_vllm",
          "\n\n".join(t for t in (table(rows), against_peers(runs),
                                   table(runs, per_seed=True) if args.repeats > 1 else "",
                                   notes) if t), {
              "engines": N_ENGINES, "model": MODEL, "block_size": BLOCK_SIZE,
              "kv_tokens_each": KV_TOKENS, "kv_pressure": KV_PRESSURE, "scale": SCALE,
              "output_scale": OUTPUT_SCALE, "time_scale": TIME_SCALE, "body": BODY,
              "seeds": args.repeats, "skipped": skipped, "errors": errors,
              "rows": [asdict(r) for r in rows],
              "runs": [asdict(r) for r in runs]}, lambda p: plot(rows, p))
    return 0
