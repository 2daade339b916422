"""``make bench``: the same simulators, the same workloads, the routers side
by side in one run. Prints a table, writes JSON and a PNG plot.

    python -m bench.router_bench [--quick] [--out bench/results]
    python -m bench.router_bench --sim-cmd 'PATH --port {port} ...'  # another simulator
    python -m bench.router_bench --engine vllm  # two real vLLM servers (bench.engine_bench)
    python -m bench.router_bench --replicas 1 2 4  # ours active-active behind Envoy (issue 45)
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import math
import os
import secrets
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.flags import count
from bench.queue_model import model_ttfts_ms
from bench.replay import (
    Result,
    Run,
    added_latency,
    big_prompts,
    replay_agentic,
    replay_trace,
)
from bench.report import medians, pct
from bench.workloads import AgentSession, TraceRequest, agentic, mooncake, working_set_tokens
from harness import redis_proc
from harness.envoy import start_plain_envoy
from harness.procs import MODEL, Proc, Procs
from toposerve.localcluster.ports import free_port
from toposerve.localcluster.results import pyplot, save, write
from toposerve.localcluster.results import table as md_table
from toposerve.router.config import ScrapeConfig
from toposerve.wire.hashing import byte_block_hashes
from toposerve.wire.tokens import BYTES_PER_TOKEN

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / ".venv-peers" / "bin"
MOONCAKE = REPO.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"
SIM_BLOCK_BYTES = 64  # 16 tokens of 4 bytes: the simulator's block
# 10K prefill tokens/s and 20 ms a decoded token (model time, run 5x faster).
# Agentic: 100K tokens of KV cache each, so a well-routed fleet holds its
# working set and one that sprays every session everywhere does not.
SIM: dict[str, Any] = {"time_scale": 0.2, "overhead_s": 0.01, "prefill_s_per_token": 0.0001,
                       "decode_s_per_token": 0.02, "max_num_seqs": 32, "block_size": 16}
# The Mooncake trace reuses prefixes minutes apart, and "available reuse"
# counts a prefix shared with any earlier prompt: the four caches together
# hold the replay's distinct prompt tokens (about 7M of its 3,000
# requests at a quarter of their length), so what a router captures is
# its placement, not the cache size (at 40,000 blocks every router lost a
# tenth of the reuse to evictions).
CACHE_BLOCKS = {"agentic": 6250, "mooncake": 120_000, "uneven": 6250}
N_SIMS = 4
# KV-cache pressure: more agentic sessions than the fleet's caches hold.
# Each simulator caches a quarter of the sessions' working set over
# KV_PRESSURE (workloads.working_set_tokens: for 32 sessions of 6 turns,
# 2,800-3,200 blocks, 45-50K tokens, each), so prefixes are evicted whatever
# the placement and a router that keeps a session where its prefix still is,
# and spreads the sessions' footprints evenly, loses the least to it.
KV_PRESSURE = 2.5
KV_PRESSURE_SESSIONS = 32
KV_PRESSURE_TURNS = 6
# Uneven endpoints: the agentic sessions (the same seeds) on four simulators,
# the first of which (where a tie goes first) prefills and decodes 4x slower
# and runs 4 sequences at a time, not 32: a load-blind router that keeps a
# session there for its prefix makes that session wait.
SLOW_SIM: dict[str, Any] = {"prefill_s_per_token": 4 * SIM["prefill_s_per_token"],
                            "decode_s_per_token": 4 * SIM["decode_s_per_token"],
                            "max_num_seqs": 4}
WORKLOADS = ("agentic", "mooncake", "kv-pressure", "uneven")
CLOSED_LOOP = ("agentic", "kv-pressure", "uneven")  # agentic sessions
# what a run on another simulator (--sim-cmd) adds to its workloads' names
EXTERNAL = " (external sim)"
# routers that read the simulators' KV events, which an external simulator
# is not started to publish here
NEEDS_EVENTS = ("vllm-router kv_aware",)


def kv_pressure_blocks(sessions: list[AgentSession]) -> int:
    """Blocks a simulator caches under KV-cache pressure: the sessions'
    working set is KV_PRESSURE times the fleet's blocks together."""
    block: int = SIM["block_size"]
    return max(1, math.ceil(working_set_tokens(sessions) / KV_PRESSURE / N_SIMS / block))


def cache_blocks(workload: str, payload: Any) -> int:
    """Blocks each simulator caches for ``workload`` (its ``payload`` sizes
    the KV-pressure one)."""
    return kv_pressure_blocks(payload) if workload == "kv-pressure" else CACHE_BLOCKS[workload]


def sim_flags(workload: str, payload: Any, index: int) -> dict[str, Any]:
    """Flags of the ``index``-th simulator for ``workload``."""
    flags = {**SIM, "num_gpu_blocks": cache_blocks(workload, payload)}
    if workload == "uneven" and index == 0:
        flags.update(SLOW_SIM)
    return flags


def external_sims(procs: Procs, template: str, workload: str, payload: Any) -> list[Proc]:
    """N_SIMS simulators of someone else's from a command template, each on
    a loopback port of its own: ``{port}``, ``{model}``, ``{blocks}`` (the
    workload's cache blocks) and ``{block_size}`` are filled in."""
    out = []
    for _ in range(N_SIMS):
        port = free_port()
        argv = shlex.split(template.format(port=port, model=MODEL, block_size=SIM["block_size"],
                                           blocks=cache_blocks(workload, payload)))
        out.append(procs.command(argv, "external-sim", f"http://127.0.0.1:{port}",
                                 ("/health", "/v1/models")))
    return out
# The trace's clock runs this much faster in the replay: about 60 requests
# a second, where round-robin's four simulators are saturated (finding half
# the reuse, they prefill a quarter more tokens) and a cache-aware fleet's
# still have room. bench.load_sweep shows other loads.
MOONCAKE_COMPRESSION = 20.0
# 16 minutes of the trace: its share of reusable prompt tokens grows from
# 22% over the first 1,000 requests to 32% over 3,000
MOONCAKE_REQUESTS = 3000


def mooncake_requests(compression: float = MOONCAKE_COMPRESSION, quick: bool = False,
                      trace: Path = MOONCAKE, requests: int = MOONCAKE_REQUESTS,
                      spread: bool = True) -> list[TraceRequest]:
    """The Mooncake replay's requests: the trace's first ``requests`` (200
    for --quick), at a quarter of their length; ``spread`` over each tick
    (workloads.spread_ticks) or each tick's sent together."""
    return mooncake(trace, limit=200 if quick else requests, time_compression=compression,
                    token_scale=0.25, spread=spread)


def peers_missing() -> str | None:
    """The error to print when the Rust routers are not installed, else None."""
    missing = [p for p in ("vllm-router", "sglang-router", "smg") if not (PEERS / p).exists()]
    return (f"error: peer routers missing ({', '.join(missing)}): run `make peers`"
            if missing else None)


def launch_peer(procs: Procs, binary: str, args: list[str],
                ready_paths: tuple[str, ...] = ("/health",)) -> Proc:
    """A Rust router from ``.venv-peers``, serving and exporting its metrics
    on loopback ports of its own."""
    port, prom = free_port(), free_port()
    argv = [str(PEERS / binary), *args, "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(prom)]
    return procs.command(argv, binary, f"http://127.0.0.1:{port}", ready_paths)


def sim_with_events(procs: Procs, **flags: Any) -> Proc:
    """A simulator that publishes its KV events as current vLLM does (the
    map encoding), for the routers that read them."""
    port = free_port()
    sim = procs.sim(kv_events_port=port, kv_events_encoding="map", **flags)
    sim.extra["kv_events"] = f"tcp://127.0.0.1:{port}"
    return sim


# how a contender starts, given the simulators it fronts
Start = Callable[[Procs, list[Proc]], Proc]


def peer(binary: str, *args: str, kv_events: bool = False) -> Start:
    """A peer router's starter; a server's ``extra`` may name its model
    and block size (a real engine's), else they are our simulator's."""
    def start(procs: Procs, sims: list[Proc]) -> Proc:
        argv = [*args, "--worker-urls", *(s.url for s in sims),
                "--max-payload-size", str(512 * 2**20)]
        if kv_events:  # vllm-router's kv_aware: events per worker, ids from its /tokenize
            for s in sims:
                argv += ["--kv-event-source", f"{s.url}={s.extra['kv_events']}"]
            argv += ["--kv-event-model", sims[0].extra.get("model", MODEL),
                     "--kv-event-block-size", str(sims[0].extra.get("block_size",
                                                                    SIM["block_size"]))]
        return launch_peer(procs, binary, argv, ("/health", "/v1/models"))
    return start


# as shipped; said explicitly, since Procs.router gives tests a 0.05 s scrape
SCRAPE_S = ScrapeConfig().interval_s


def ours_with(scorers: list[dict[str, Any]] | None = None, scrape_s: float = SCRAPE_S,
              health_s: float | None = None, workers: int = 1) -> Start:
    """Our router with other scorers (None: the default profile), another
    scrape interval or another health-check interval (None: as shipped),
    or ``workers`` processes on its port."""
    def start(procs: Procs, sims: list[Proc]) -> Proc:
        cfg: dict[str, Any] = {"scrape": {"intervalSeconds": scrape_s}}
        if health_s is not None:
            cfg["scrape"]["healthIntervalSeconds"] = health_s
        if workers > 1:
            cfg["server"] = {"workers": workers}
        if scorers is not None:
            cfg["profile"] = {"scorers": scorers}
        return procs.router(cfg, endpoints=[s.url for s in sims])
    return start


ours = ours_with()  # the default profile and scrape interval, as shipped


def start_redis(procs: Procs) -> str:
    """A redis-server on a loopback port of its own, with a password (the
    router refuses an open one), until ``procs`` closes: its URL."""
    port = free_port()
    log = procs.tmp / f"redis-{port}.log"
    url, p = redis_proc.start(secrets.token_hex(8), port, log=log)
    procs.all.append(Proc(f"redis://127.0.0.1:{port}", p, log))
    return url


def replicas(n: int) -> Start:
    """``n`` of our routers, active-active (``ha.mode: active-active``)
    over one Redis, behind Envoy's round robin (harness.envoy, one worker
    a replica): how routing holds up when no replica sees every request.
    The replicas ride in ``extra["behind"]`` so their CPU counts."""
    def start(procs: Procs, sims: list[Proc]) -> Proc:
        redis_url, group = start_redis(procs), f"bench-{secrets.token_hex(3)}"
        routers = [procs.router({
            "scrape": {"intervalSeconds": SCRAPE_S},
            "responses": {"backend": "redis", "redisUrl": redis_url},
            "ha": {"enabled": True, "mode": "active-active", "lease": {"name": group}}},
            endpoints=[s.url for s in sims]) for _ in range(n)]
        front = start_plain_envoy(procs, [r.url.removeprefix("http://") for r in routers],
                                  workers=n)
        front.extra["behind"] = routers
        return front
    return start


def replica_name(n: int) -> str:
    return f"{OURS} x{n} active-active, Envoy round robin"


def checkout(rev: str, tmp: Path) -> Path:
    """``rev``'s tree (a git archive of it) under ``tmp``, with the import
    root of its code (``import_root``)."""
    tree = tmp / f"toposerve-at-{rev}"
    if not tree.exists():
        tree.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
        import_root(tree)
    return tree


def import_root(tree: Path) -> Path:
    """A folder that, first on ``sys.path`` with ``tree`` the working
    directory, makes ``toposerve`` the code of ``tree`` rather than the
    installed one: a link to the root package's folder, holding a link to
    each folder pyproject maps under it. A tree from before the one
    import name has no map: its CLI folder, toposerve_cli, stands in as
    ``toposerve``, and its top-level packages import from the working
    directory."""
    root = tree / ".import"
    setuptools = tomllib.loads((tree / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders: dict[str, str] = setuptools.get("package-dir", {"toposerve": "toposerve_cli"})
    root.mkdir(exist_ok=True)
    (root / "toposerve").symlink_to(tree / folders["toposerve"])
    for name, folder in folders.items():
        if name != "toposerve":  # toposerve.<x>: a folder at the top of the tree
            (tree / folders["toposerve"] / name.split(".")[1]).symlink_to(tree / folder)
    return root


def ours_at(rev: str, tmp: Path) -> tuple[str, Start]:
    """Our router as committed at ``rev`` (from a git archive of it), with
    the default profile: the other side of an A/B in the same run."""
    tree = checkout(rev, tmp)

    def start(procs: Procs, sims: list[Proc]) -> Proc:
        # `python -m toposerve.main` imports from its working directory
        # first, then PYTHONPATH, then the installed package
        here, path = os.getcwd(), os.environ.get("PYTHONPATH")
        os.chdir(tree)
        os.environ["PYTHONPATH"] = str(tree / ".import")
        try:
            return ours(procs, sims)
        finally:
            os.chdir(here)
            if path is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = path
    return f"{OURS}@{rev}", start


# --ablation: other scorer sets, to show why the default is the default
ABLATIONS: dict[str, Start] = {
    "toposerve[prefix only]": ours_with([{"type": "prefix-approx", "weight": 1}]),
    "toposerve[prefill-cost only]": ours_with([{"type": "prefill-cost", "weight": 1}]),
    "toposerve[previous default: prefix 3, cost 1, room 1, conv 2, session 2]": ours_with([
        {"type": "prefix-approx", "weight": 3}, {"type": "prefill-cost", "weight": 1},
        {"type": "cache-room", "weight": 1}, {"type": "conversations", "weight": 2},
        {"type": "session", "weight": 2}]),
    "toposerve[no conversations: prefix 4, cost 1, room 1, session 2]": ours_with([
        {"type": "prefix-approx", "weight": 4}, {"type": "prefill-cost", "weight": 1},
        {"type": "cache-room", "weight": 1}, {"type": "session", "weight": 2}]),
    "toposerve[no cache-room: prefix 4, cost 1, conv 2, session 2]": ours_with([
        {"type": "prefix-approx", "weight": 4}, {"type": "prefill-cost", "weight": 1},
        {"type": "conversations", "weight": 2}, {"type": "session", "weight": 2}]),
    "toposerve[llm-d-like: prefix 3, queue 1, kv 1]": ours_with([
        {"type": "prefix-approx", "weight": 3}, {"type": "queue", "weight": 1},
        {"type": "kv-usage", "weight": 1}]),
    # the default profile reads scraped load only to tell saturation: what a
    # faster scrape (the previous default) buys for its CPU
    "toposerve[previous scrape: every 0.2 s]": ours_with(scrape_s=0.2),
}

ROUTERS: dict[str, Start] = {
    "round-robin": peer("vllm-router", "--policy", "round_robin"),
    "toposerve": ours,
    "vllm-router cache_aware": peer("vllm-router", "--policy", "cache_aware"),
    "vllm-router kv_aware": peer("vllm-router", "--policy", "kv_aware", kv_events=True),
    "vllm-router power_of_two": peer("vllm-router", "--policy", "power_of_two"),
    "sglang-router cache_aware": peer("sglang-router", "launch", "--policy", "cache_aware"),
    "smg cache_aware": peer("smg", "launch", "--policy", "cache_aware"),
}


def reusable_tokens(run: Run) -> list[tuple[Result, int]]:
    """Each request with its prompt tokens shared with any earlier prompt, at
    the simulator's block size, in arrival order."""
    seen: set[int] = set()
    out = []
    for r in sorted(run.results, key=lambda r: r.started):
        keys = byte_block_hashes(r.prompt, SIM_BLOCK_BYTES)
        n = 0
        for k in keys:
            if k not in seen:
                break
            n += 1
        out.append((r, n * SIM_BLOCK_BYTES // BYTES_PER_TOKEN))
        seen.update(keys)
    return out


def floor_ttfts_ms(reuse: list[tuple[Result, int]]) -> list[float]:
    """The TTFT each request would see if every reusable token were a hit and
    nothing queued: the engine's overhead plus its own unavoidable prefill."""
    return [1000 * SIM["time_scale"] * (
        SIM["overhead_s"] + (len(r.prompt) // BYTES_PER_TOKEN - n) * SIM["prefill_s_per_token"])
        for r, n in reuse]


@dataclass
class Row:
    workload: str
    router: str
    requests: int
    failed: int
    hit_rate: float
    captured: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    outside_engine_ms: float  # mean TTFT seen by clients minus the engines' own mean TTFT
    floor_p50_ms: float  # TTFT with every reusable token hit and no queueing
    floor_p99_ms: float
    throughput_rps: float
    max_over_mean_load: float  # requests served
    max_over_mean_work: float  # tokens computed: uncached prompt + generated
    cpu_ms_per_request: float
    seed: int = 0  # the repeat (agentic: its workload's seed); a median row's is meaningless
    cache_blocks: int = 0  # each simulator's
    first_share: float = 0.0  # requests the first simulator served (uneven: the slow one)


def run_one(tmp: Path, name: str, workload: str, payload: Any, seed: int = 0,
            sim_cmd: str | None = None) -> Row:
    """``name`` in front of fresh simulators (ours, or N_SIMS of ``sim_cmd``,
    whose hit counters, if any, count its own tokens: no reuse captured and
    no floor then) through ``workload``."""
    procs = Procs(tmp)
    try:
        sims = (external_sims(procs, sim_cmd, workload, payload) if sim_cmd else
                [sim_with_events(procs, **sim_flags(workload, payload, i)) for i in range(N_SIMS)])
        router = ROUTERS[name](procs, sims)
        time.sleep(0.5)
        parts = [router, *router.extra.get("behind", [])]  # a front and the routers behind
        cpu0 = sum(p.cpu_seconds() for p in parts)
        if workload in CLOSED_LOOP:
            run = asyncio.run(replay_agentic(router.url, payload, SIM["time_scale"]))
        else:
            run = asyncio.run(replay_trace(router.url, payload, 1.0))
        cpu = sum(p.cpu_seconds() for p in parts) - cpu0
        counters = [s.counters() for s in sims]
    finally:
        procs.close()
    hits = sum(c.get("vllm:prefix_cache_hits_total", 0) for c in counters)
    queries = sum(c.get("vllm:prefix_cache_queries_total", 0) for c in counters)
    served = [c.get("vllm:request_success_total", 0) for c in counters]
    work = [c.get("vllm:prompt_tokens_total", 0) - c.get("vllm:prefix_cache_hits_total", 0)
            + c.get("vllm:generation_tokens_total", 0) for c in counters]
    ok = run.ok
    ttfts = [r.ttft * 1000 for r in ok if r.ttft is not None]
    reuse = reusable_tokens(run)
    avail = 0 if sim_cmd else sum(n for _, n in reuse)
    floor = [math.nan] if sim_cmd else floor_ttfts_ms(reuse)
    ttft_n = sum(c.get("vllm:time_to_first_token_seconds_count", 0) for c in counters)
    engine_ms = 1000 * sum(c.get("vllm:time_to_first_token_seconds_sum", 0)
                           for c in counters) / max(1, ttft_n)
    return Row(workload=workload + (EXTERNAL if sim_cmd else ""), router=name,
               requests=len(run.results), failed=len(run.results) - len(ok),
               hit_rate=hits / queries if queries else math.nan,
               captured=hits / avail if avail else math.nan, ttft_p50_ms=pct(ttfts, 0.5),
               ttft_p99_ms=pct(ttfts, 0.99),
               outside_engine_ms=statistics.mean(ttfts) - engine_ms if ttfts else 0.0,
               floor_p50_ms=pct(floor, 0.5), floor_p99_ms=pct(floor, 0.99),
               throughput_rps=len(ok) / run.wall_s,
               max_over_mean_load=max(served) / statistics.mean(served) if any(served) else 0,
               max_over_mean_work=max(work) / statistics.mean(work) if any(work) else 0,
               cpu_ms_per_request=1000 * cpu / max(1, len(run.results)), seed=seed,
               cache_blocks=cache_blocks(workload, payload),
               first_share=served[0] / sum(served) if any(served) else 0.0)


def overheads(tmp: Path, names: list[str], n: int, big_n: int, big_tokens: int,
              idle_s: float) -> dict[str, dict[str, float]]:
    """Latency each router adds to a direct call (p50), its CPU per big
    request, and its CPU while no request comes (what watching the servers
    costs). Every router stands in front of the same two simulators and the
    latency rounds interleave (direct, each router, again), so the machine's
    noise falls on all of them alike."""
    out: dict[str, dict[str, float]] = {}
    procs = Procs(tmp)
    try:
        # two servers: power_of_two refuses to start with one
        sims = [sim_with_events(procs, time_scale=0.0001, max_model_len=4_000_000)
                for _ in range(2)]
        routers = {name: ROUTERS[name](procs, sims) for name in names}
        time.sleep(1.0)
        idle0 = {name: r.cpu_seconds() for name, r in routers.items()}
        time.sleep(idle_s)
        idle = {name: 1000 * (r.cpu_seconds() - idle0[name]) / idle_s
                for name, r in routers.items()}
        urls = {k: r.url for k, r in routers.items()}
        added = added_latency(sims[0].url, urls, n)
        added_ttft = added_latency(sims[0].url, urls, n, stream=True)
        for name, router in routers.items():
            cpu0 = router.cpu_seconds()
            ok = asyncio.run(big_prompts(router.url, big_n, big_tokens))
            cpu = router.cpu_seconds() - cpu0
            out[name] = {"added_p50_ms": 1000 * added[name],
                         "added_ttft_p50_ms": 1000 * added_ttft[name],
                         "big_prompt_cpu_ms": 1000 * cpu / max(1, ok), "big_prompt_ok": ok,
                         "idle_cpu_ms_per_s": idle[name]}
            print(f"  overhead {name}: +{out[name]['added_p50_ms']:.2f} ms p50, "
                  f"+{out[name]['added_ttft_p50_ms']:.2f} ms TTFT p50 streamed, "
                  f"{out[name]['big_prompt_cpu_ms']:.1f} ms CPU per {big_tokens}-token request, "
                  f"{idle[name]:.1f} ms CPU a second idle", file=sys.stderr, flush=True)
    finally:
        procs.close()
    return out


def share(x: float) -> str:
    """A ratio as a percentage; n/a where it was not measured (another
    simulator's runs: reuse captured, and hits where it counts none)."""
    return "n/a" if math.isnan(x) else f"{x:.1%}"


def table(rows: list[Row], over: dict[str, dict[str, float]]) -> str:
    def line(r: Row) -> list[object]:
        o = over.get(r.router, {})
        return [r.workload, r.router, share(r.hit_rate), share(r.captured),
                f"{r.ttft_p50_ms:.0f}", f"{r.ttft_p99_ms:.0f}", f"{r.outside_engine_ms:.1f}",
                f"{r.throughput_rps:.1f}", f"{r.max_over_mean_load:.2f}",
                f"{r.max_over_mean_work:.2f}", f"{r.cpu_ms_per_request:.2f}",
                *(f"{o.get(k, float('nan')):.{d}f}" for k, d in (
                    ("added_p50_ms", 2), ("added_ttft_p50_ms", 2), ("big_prompt_cpu_ms", 1),
                    ("idle_cpu_ms_per_s", 1))), r.failed]
    return md_table(["workload", "router", "hit rate", "reuse captured", "TTFT p50 ms",
                  "TTFT p99 ms", "TTFT outside engine ms", "req/s", "max/mean requests",
                  "max/mean work", "router CPU ms/req", "added p50 ms",
                  "added TTFT p50 ms, streamed", "CPU ms per 195K req",
                  "idle CPU ms/s, 2 servers", "failed"], map(line, rows), "ll" + "r" * 14)


def modelled(reqs: list[TraceRequest], cache_blocks: int) -> dict[str, dict[str, float]]:
    """TTFT p50/p99 (wall ms) of round-robin and of a least-TTFT oracle in
    the queueing model of these simulators (bench.queue_model)."""
    out = {}
    for policy in ("round-robin", "least-ttft"):
        t = model_ttfts_ms(reqs, SIM, N_SIMS, cache_blocks, policy)
        out[policy] = {"p50_ms": pct(t, 0.5), "p99_ms": pct(t, 0.99)}
    return out


def floors(rows: list[Row], models: dict[str, dict[str, dict[str, float]]]) -> str:
    """Per workload: the TTFT no router can beat on these simulators (every
    reusable token a hit, no queueing), next to round-robin's; for open-loop
    workloads also the queueing model's round-robin and oracle. Not for another
    simulator's runs: the floor is ours."""
    lines = []
    ours = [r for r in rows if not r.workload.endswith(EXTERNAL)]
    if not ours:
        return ""
    for wl in dict.fromkeys(r.workload for r in ours):
        mine = [r for r in rows if r.workload == wl]
        p50 = statistics.median(r.floor_p50_ms for r in mine)
        p99 = statistics.median(r.floor_p99_ms for r in mine)
        rr = next((r.ttft_p50_ms for r in mine if r.router == "round-robin"), None)
        # blank when round-robin was not run (--routers without it)
        line = [wl, f"{p50:.0f}", f"{p99:.0f}",
                *(["", ""] if rr is None else [f"{rr:.0f}", f"{1 - p50 / rr:.0%}"])]
        if m := models.get(wl):
            mrr, oracle = m["round-robin"]["p50_ms"], m["least-ttft"]
            line += [f"{mrr:.0f}", f"{oracle['p50_ms']:.0f} / {oracle['p99_ms']:.0f}",
                     f"{1 - oracle['p50_ms'] / mrr:.0%}"]
        else:
            line += ["", "", ""]  # closed loop: arrivals hang on the answers, not modelled
        lines.append(line)
    return md_table(["workload", "TTFT p50 floor ms", "TTFT p99 floor ms", "round-robin p50 ms",
                  "floor p50 below round-robin", "modelled round-robin p50 ms",
                  "modelled oracle p50 / p99 ms", "oracle p50 below round-robin (model)"],
                 lines, "l" + "r" * 7)


OURS = "toposerve"


def is_peer(name: str) -> bool:
    return not name.startswith(OURS)


def per_seed(runs: list[Row]) -> str:
    """Every run by itself, seed by seed, and per workload on how many seeds
    ours had the lower TTFT p50 and p99 than every peer in the run."""
    each = md_table(["workload", "seed", "router", "TTFT p50 ms", "TTFT p99 ms", "hit rate",
                  "reuse captured", "router CPU ms/req", "served by the first simulator"],
                 ([r.workload, r.seed, r.router, f"{r.ttft_p50_ms:.1f}", f"{r.ttft_p99_ms:.0f}",
                   share(r.hit_rate), share(r.captured), f"{r.cpu_ms_per_request:.2f}",
                   f"{r.first_share:.1%}"] for r in runs), "lrlrrrrrr")
    ahead = []
    for wl in dict.fromkeys(r.workload for r in runs):
        seeds = sorted({r.seed for r in runs if r.workload == wl})
        p50s, p99s, ahead50, ahead99 = [], [], 0, 0
        for seed in seeds:
            mine = [r for r in runs if r.workload == wl and r.seed == seed]
            ours = next((r for r in mine if r.router == OURS), None)
            peers = [r for r in mine if is_peer(r.router)]
            if ours is None or not peers:
                continue
            b50 = min(r.ttft_p50_ms for r in peers)
            b99 = min(r.ttft_p99_ms for r in peers)
            ahead50 += ours.ttft_p50_ms < b50
            ahead99 += ours.ttft_p99_ms < b99
            p50s.append(f"{ours.ttft_p50_ms / b50:.2f}")
            p99s.append(f"{ours.ttft_p99_ms / b99:.2f}")
        if p50s:
            ahead.append([wl, len(p50s), f"{ahead50}/{len(p50s)}", f"{ahead99}/{len(p50s)}",
                          " ".join(p50s), " ".join(p99s)])
    return each + "\n\n" + md_table(
        ["workload", "seeds", "ours ahead of every peer at p50", "at p99",
         "ours / best peer p50, per seed", "ours / best peer p99, per seed"], ahead, "lrrrll")


def plot_seeds(runs: list[Row], path: Path) -> None:
    """TTFT p50 and p99 of every run, seed by seed."""
    plt = pyplot()
    groups = list(dict.fromkeys((r.workload, r.seed) for r in runs))
    names = list(dict.fromkeys(r.router for r in runs))
    fig, axes = plt.subplots(2, 1, figsize=(max(8, 1.2 * len(groups) + 4), 7))
    width = 0.8 / len(names)
    colors = plt.get_cmap("tab20")
    for ax, field, label in zip(axes, ("ttft_p50_ms", "ttft_p99_ms"),
                                ("TTFT p50 (ms)", "TTFT p99 (ms)"), strict=True):
        for i, name in enumerate(names):
            vals = [next((getattr(r, field) for r in runs if (r.workload, r.seed) == g
                          and r.router == name), 0) for g in groups]
            ax.bar([x + i * width for x in range(len(groups))], vals, width, label=name,
                   color=colors(i % colors.N))
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(groups))],
                      [f"{wl} #{seed}" for wl, seed in groups])
        ax.set_yscale("log")  # a loaded run's seconds next to a quiet one's milliseconds
        ax.set_title(f"{label}, each run")
    axes[0].legend(fontsize=8, ncol=3)
    save(fig, path)


def replica_table(rows: list[Row], counts: list[int]) -> str:
    """Per workload, each active-active replica count against one replica
    behind the same front: hit rate in points, TTFT p50/p99 as ratios."""
    lines = []
    for wl in dict.fromkeys(r.workload for r in rows):
        by = {r.router: r for r in rows if r.workload == wl}
        one = by.get(replica_name(min(counts)))
        for n in counts:
            r = by.get(replica_name(n))
            if r is None or one is None:
                continue
            lines.append([wl, n, share(r.hit_rate),
                          f"{100 * (r.hit_rate - one.hit_rate):+.1f}", f"{r.ttft_p50_ms:.0f}",
                          f"{r.ttft_p99_ms:.0f}", f"{r.ttft_p50_ms / one.ttft_p50_ms:.2f}",
                          f"{r.ttft_p99_ms / one.ttft_p99_ms:.2f}",
                          f"{r.cpu_ms_per_request:.2f}", r.failed])
    base = min(counts)
    return md_table(["workload", "replicas", "hit rate (simulators' counters)",
                     f"points over {base}", "TTFT p50 ms", "TTFT p99 ms", f"p50 / {base}",
                     f"p99 / {base}", "CPU ms/req (Envoy + replicas)", "failed"],
                    lines, "lr" + "r" * 8)


def order(names: list[str], repeat: int) -> list[str]:
    """The routers rotated by one each repeat, so a drift in the shared
    machine's load does not always fall on the same router."""
    k = repeat % len(names) if names else 0
    return names[k:] + names[:k]


def bars(rows: Sequence[Any], workloads: list[str], metrics: list[tuple[str, str]],
         title: str, path: Path, hatched: Callable[[str], bool] = lambda _: False) -> None:
    """A panel a metric (row field, label) of bars by workload, one a
    router in the rows' order; ``hatched`` routers striped."""
    plt = pyplot()
    names = list(dict.fromkeys(r.router for r in rows))
    fig, axes = plt.subplots(1, len(metrics), figsize=(16, 4.8))
    width = 0.8 / len(names)
    colors = plt.get_cmap("tab20")  # tab10 repeats after ten routers
    for ax, (field, label) in zip(axes, metrics, strict=True):
        for i, name in enumerate(names):
            vals = [next((getattr(r, field) for r in rows
                          if r.workload == w and r.router == name), 0) for w in workloads]
            ax.bar([x + i * width for x in range(len(workloads))], vals, width, label=name,
                   color=colors(i % colors.N), hatch="//" if hatched(name) else None)
        ax.set_xticks([x + 0.4 - width / 2 for x in range(len(workloads))], workloads)
        ax.set_title(label)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    fig.suptitle(title)
    save(fig, path, rect=(0, 0.12, 1, 1))


def plot(rows: list[Row], path: Path) -> None:
    bars(rows, sorted({r.workload for r in rows}),
         [("ttft_p50_ms", "TTFT p50 (ms)"), ("ttft_p99_ms", "TTFT p99 (ms)"),
          ("captured", "share of available reuse captured")],
         "toposerve router vs peers: same simulators, same workloads, one run", path,
         hatched=lambda name: name.startswith("toposerve["))  # ablations


def runnable(workloads: list[str], external: bool, trace: Path) -> list[str]:
    """The workloads that can run here, each once, saying why of those
    that cannot: Mooncake without its ``trace``, uneven on another
    simulator (``external``: it slows one of ours by its flags)."""
    names = list(dict.fromkeys(workloads))
    if "mooncake" in names and not trace.exists():
        print(f"skipping the Mooncake workload: {trace} not found", file=sys.stderr)
        names.remove("mooncake")
    if external and "uneven" in names:
        print("skipping the uneven workload: it slows one of our simulators by its flags",
              file=sys.stderr)
        names.remove("uneven")
    return names


def main(argv: list[str] | None = None) -> int:
    # here, not at the top: bench.engine_bench starts its routers with this module's
    from bench.engine_bench import CHOICES as ENGINE_CHOICES
    from bench.engine_bench import run as run_engines

    ap = argparse.ArgumentParser(prog="python -m bench.router_bench", description=__doc__)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--quick", action="store_true", help="a smaller run, for a smoke test")
    ap.add_argument("--engine", choices=("sim", "vllm"), default="sim",
                    help="vllm: two real vLLM CPU servers (`make engines`) instead of "
                         "simulators, on agentic and kv-pressure sessions the tiny model "
                         "fits, hits from the engines' own counters (bench.engine_bench)")
    ap.add_argument("--routers", nargs="+",
                    choices=list(dict.fromkeys([*ROUTERS, *ABLATIONS, *ENGINE_CHOICES])),
                    help="default: every router of the mode")
    ap.add_argument("--ablation", action="store_true",
                    help="also run other scorer sets of our router")
    ap.add_argument("--sessions", type=count,
                    help="agentic sessions (default 16; --engine vllm: 8, or 4 --quick)")
    ap.add_argument("--repeats", "--seeds", type=count, default=1, dest="repeats",
                    help="runs per workload and router (agentic: a new seed each), the "
                         "routers' order rotated each time; the main table shows medians, "
                         "failures summed, the per-seed table every run")
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS,
                    help="kv-pressure: more agentic sessions than the caches hold; uneven: "
                         "the agentic sessions with one simulator 4x slower (default: "
                         "agentic mooncake; --engine vllm: agentic kv-pressure)")
    ap.add_argument("--sim-cmd", metavar="TEMPLATE",
                    help="run every workload on N_SIMS of another simulator instead of ours: "
                         "a command line with {port} (and optionally {model}, {blocks}, "
                         "{block_size}) filled in per simulator, serving on 127.0.0.1:{port} "
                         "(docs/benchmarks.md: llm-d-inference-sim); not for uneven, and "
                         "without the routers that read KV events")
    ap.add_argument("--name", help="the results' file name (default: router_bench, "
                                   "router_bench_external with --sim-cmd)")
    ap.add_argument("--no-overheads", action="store_true",
                    help="skip the idle latency and CPU runs (their columns read nan)")
    ap.add_argument("--against", metavar="REV",
                    help="also run our router as committed at REV (an A/B in one run)")
    ap.add_argument("--replicas", type=count, nargs="+", metavar="N",
                    help="instead of the routers (with --routers, beside them): N of ours "
                         "active-active over one Redis behind Envoy's round robin, for each "
                         "N; a table against the fewest (issue 45)")
    args = ap.parse_args(argv)
    if args.engine == "vllm":
        return run_engines(args)
    replicated = {replica_name(n): replicas(n) for n in args.replicas or ()}
    ROUTERS.update(replicated)
    args.routers = args.routers or ([] if replicated else list(ROUTERS))
    args.routers += [r for r in replicated if r not in args.routers]
    args.workloads = args.workloads or ["agentic", "mooncake"]
    args.sessions = args.sessions or 16
    if args.ablation:
        args.routers += [a for a in ABLATIONS if a not in args.routers]
    ROUTERS.update(ABLATIONS)
    if any(is_peer(n) for n in args.routers) and (err := peers_missing()):
        print(err, file=sys.stderr)
        return 2
    # the same every repeat, and about 8 s to synthesise: built once
    trace = functools.cache(lambda: mooncake_requests(quick=args.quick))

    def payloads(wl: str, repeat: int) -> Any:
        if wl in ("agentic", "uneven"):  # another seed each repeat: other sessions, same shape
            return agentic(sessions=6 if args.quick else args.sessions,
                           turns=4 if args.quick else 8, seed=repeat)
        if wl == "kv-pressure":
            return agentic(sessions=12 if args.quick else KV_PRESSURE_SESSIONS,
                           turns=4 if args.quick else KV_PRESSURE_TURNS, seed=repeat)
        return trace()

    names = runnable(args.workloads, bool(args.sim_cmd), MOONCAKE)
    if not names:
        print("error: no workload left to run (the lines above say why); pick others with "
              "--workloads", file=sys.stderr)
        return 2
    if args.sim_cmd:
        for r in NEEDS_EVENTS:
            if r in args.routers:
                print(f"skipping {r}: it reads KV events the external simulators do not "
                      "publish here", file=sys.stderr)
                args.routers.remove(r)
    runs: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        if args.against:
            name, start = ours_at(args.against, Path(tmp))
            ROUTERS[name] = start
            args.routers.append(name)
        for wl in names:
            for repeat in range(args.repeats):
                payload = payloads(wl, repeat)
                for name in order(args.routers, repeat):
                    t0 = time.monotonic()
                    row = run_one(Path(tmp), name, wl, payload, repeat, args.sim_cmd)
                    runs.append(row)
                    print(f"  {wl:9} #{repeat} {name:26} TTFT p50 {row.ttft_p50_ms:7.0f} ms  "
                          f"hit {row.hit_rate:6.1%}  failed {row.failed}  "
                          f"({time.monotonic() - t0:.0f}s)", file=sys.stderr, flush=True)
        over = {} if args.no_overheads else overheads(
            Path(tmp), args.routers, 50 if args.quick else 200, 5 if args.quick else 100,
            195_000, 3.0 if args.quick else 10.0)
    # rows in a stable order whatever order each repeat ran them in
    runs.sort(key=lambda r: (names.index(r.workload.removesuffix(EXTERNAL)), r.seed,
                             args.routers.index(r.router)))
    rows = medians(runs, ("workload", "router"))
    models = {wl: modelled(payloads(wl, 0), CACHE_BLOCKS[wl]) for wl in names
              if wl == "mooncake"}  # the open-loop one

    def plots(path: Path) -> None:
        plot(rows, path)
        plot_seeds(runs, path.with_name(path.stem + "_seeds.png"))

    name = args.name or ("router_bench_external" if args.sim_cmd else "router_bench")
    write(Path(args.out), name,
                 "\n\n".join(t for t in (
                     replica_table(rows, args.replicas) if args.replicas else "",
                     table(rows, over), floors(rows, models), per_seed(runs)) if t), {
                     "sim": SIM, "sims": N_SIMS, "repeats": args.repeats,
                     "slow_sim": SLOW_SIM, "kv_pressure": KV_PRESSURE, "sim_cmd": args.sim_cmd,
                     "replicas": args.replicas,
                     "rows": [asdict(r) for r in rows], "runs": [asdict(r) for r in runs],
                     "overheads": over, "modelled": models}, plots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
