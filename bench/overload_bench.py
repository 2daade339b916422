"""Critical traffic under a 10x burst of sheddable batch traffic, side by
side in one run: our router with flow control, ours without, and
vllm-router with its admission settings (a concurrency limit, a queue and
its timeout). Then the effect of turn priority: agent sessions' next turns
beside cold requests of the same band while the endpoints are full, with
turn priority on and off. Prints tables, writes JSON and a PNG.

    python -m bench.overload_bench [--quick] [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from bench.report import pct
from harness.procs import MODEL, Proc, Procs
from toposerve.localcluster.results import pyplot, save, write
from toposerve.localcluster.results import table as md_table

REPO = Path(__file__).resolve().parents[1]
PEERS = REPO / ".venv-peers" / "bin"

# Real time (time_scale 1): a critical request's TTFT is mostly its own
# prefill (500 uncached tokens, 25 ms), so a router that keeps room for it
# keeps it near its unloaded value. Batch requests decode 100 tokens (1 s).
# Each server runs 16 sequences; the burst asks for about 80 at once.
SLOTS = 16  # per endpoint: its sequences, ours and vllm-router's limit (x N_SIMS)
SIM: dict[str, Any] = {"time_scale": 1.0, "overhead_s": 0.002, "prefill_s_per_token": 0.00005,
                       "decode_s_per_token": 0.01, "max_num_seqs": SLOTS}
N_SIMS = 2
CRITICAL_RATE = 8.0  # requests a second
BURST = 10  # batch traffic is this many times the critical rate
SLO_MS = 100.0  # a critical answer counts toward goodput when its first token is this early


@dataclass
class Traffic:
    """Open-loop requests, evenly spaced."""

    name: str
    rate: float
    duration_s: float
    prompt_bytes: int
    max_tokens: int
    headers: dict[str, str] = field(default_factory=dict)
    stream: bool = True
    start_s: float = 0.0


@dataclass
class Outcome:
    traffic: str
    status: int  # HTTP status; 598 transport error, 599 an error inside the stream
    ttft: float | None
    e2e: float


def prompt(tag: str, size: int) -> str:
    """Unique from its first bytes, so no two requests share a cached prefix."""
    head = f"{tag} "
    return head + "x" * max(0, size - len(head))


async def one(session: aiohttp.ClientSession, url: str, t: Traffic, i: int,
              timeout_s: float) -> Outcome:
    body = {"model": MODEL, "prompt": prompt(f"{t.name}-{i}-{time.monotonic_ns()}",
                                             t.prompt_bytes),
            "max_tokens": t.max_tokens, "stream": t.stream}
    headers = {"Content-Type": "application/json", **t.headers}
    t0 = time.monotonic()
    ttft = None
    try:
        async with session.post(url + "/v1/completions", data=orjson.dumps(body),
                                headers=headers,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
            if r.status != 200 or not t.stream:
                await r.read()
                return Outcome(t.name, r.status, time.monotonic() - t0 if r.status == 200
                               else None, time.monotonic() - t0)
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                if b'"error"' in line:
                    return Outcome(t.name, 599, ttft, time.monotonic() - t0)
                ttft = ttft or time.monotonic() - t0
    except (aiohttp.ClientError, TimeoutError):
        return Outcome(t.name, 598, ttft, time.monotonic() - t0)
    return Outcome(t.name, 200, ttft, time.monotonic() - t0)


async def drive(url: str, traffics: list[Traffic], timeout_s: float = 30) -> list[Outcome]:
    """Sends every traffic at its rate and returns every request's outcome."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        t0 = time.monotonic()
        tasks: list[asyncio.Task[Outcome]] = []

        async def send(t: Traffic) -> None:
            n = int(t.rate * t.duration_s)
            for i in range(n):
                delay = t0 + t.start_s + i / t.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(asyncio.create_task(one(session, url, t, i, timeout_s)))

        await asyncio.gather(*(send(t) for t in traffics))
        return list(await asyncio.gather(*tasks))


def overload(critical: dict[str, str], batch: dict[str, str], duration_s: float,
             rate: float = CRITICAL_RATE, batch_tokens: int = 100
             ) -> tuple[list[Traffic], list[Traffic]]:
    """The unloaded phase (critical traffic alone) and the overloaded one
    (the same critical traffic over a burst of sheddable batch traffic)."""
    crit = Traffic("critical", rate, duration_s, 2000, 8, critical)
    burst = Traffic("batch", rate * BURST, duration_s, 200, batch_tokens, batch, stream=False)
    return [crit], [crit, burst]


@dataclass
class Row:
    router: str
    ttft_p50_unloaded_ms: float
    ttft_p99_unloaded_ms: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    p99_ratio: float  # overloaded over unloaded
    goodput_rps: float  # critical answers within SLO_MS, per second
    critical_failed: int
    batch_ok: int
    batch_429: int
    batch_other: int


def ttfts_ms(outs: list[Outcome], name: str) -> list[float]:
    return [1000 * o.ttft for o in outs if o.traffic == name and o.status == 200 and o.ttft]


def row(router: str, unloaded: list[Outcome], loaded: list[Outcome], duration_s: float) -> Row:
    base, over = ttfts_ms(unloaded, "critical"), ttfts_ms(loaded, "critical")
    batch = [o for o in loaded if o.traffic == "batch"]
    return Row(router, pct(base, 0.5), pct(base, 0.99), pct(over, 0.5), pct(over, 0.99),
               pct(over, 0.99) / pct(base, 0.99),
               sum(1 for t in over if t <= SLO_MS) / duration_s,
               sum(1 for o in loaded if o.traffic == "critical" and o.status != 200),
               sum(1 for o in batch if o.status == 200), sum(1 for o in batch if o.status == 429),
               sum(1 for o in batch if o.status not in (200, 429)))


# --- contenders --------------------------------------------------------------------
CRITICAL_HEADERS = {"x-llm-d-inference-objective": "critical"}
BATCH_HEADERS = {"x-llm-d-inference-objective": "batch"}
Start = Callable[[Procs, list[Proc]], Proc]


def flow_config(**extra: Any) -> dict[str, Any]:
    """Our router's flow control for these simulators: critical and batch
    bands, the router's own count of requests in flight, batch shed from
    40% of the slots and wholly from 80%, so the last fifth stays free."""
    return {"flowControl": {
        "enabled": True, "queueTTLSeconds": 2,
        "objectives": [{"name": "critical", "priority": 10}, {"name": "batch", "priority": -1}],
        "saturation": {"detector": "concurrency", "maxConcurrency": SLOTS, "shedStart": 0.4,
                       "shedAll": 0.8}, **extra}}


def ours(config: dict[str, Any] | None) -> Start:
    def start(procs: Procs, sims: list[Proc]) -> Proc:
        return procs.router(config or {}, endpoints=[s.url for s in sims])
    return start


def vllm_router(queue: int) -> Start:
    """vllm-router's admission: a limit on concurrent requests (the
    servers' sequences), a FIFO queue of ``queue`` behind it (0: 429 at
    once) with a 2 s timeout, its token-bucket rate limit at its default
    (refilled at the concurrency limit)."""
    def start(procs: Procs, sims: list[Proc]) -> Proc:
        from bench.router_bench import launch_peer

        return launch_peer(procs, "vllm-router", [
            "--policy", "round_robin", "--worker-urls", *(s.url for s in sims),
            "--max-concurrent-requests", str(SLOTS * len(sims)), "--queue-size", str(queue),
            "--queue-timeout-secs", "2"], ("/health", "/v1/models"))
    return start


CONTENDERS: dict[str, Start] = {
    "toposerve, flow control": ours(flow_config()),
    "toposerve, no flow control": ours(None),
    "vllm-router (limit 32, queue 100, 2 s)": vllm_router(100),
    "vllm-router (limit 32, no queue)": vllm_router(0),
}


def run_overload(procs: Procs, name: str, start: Start, duration_s: float) -> Row:
    sims = [procs.sim(**SIM) for _ in range(N_SIMS)]
    router = start(procs, sims)
    unloaded, loaded = overload(CRITICAL_HEADERS, BATCH_HEADERS, duration_s)
    base = asyncio.run(drive(router.url, unloaded))
    over = asyncio.run(drive(router.url, loaded))
    for p in [router, *sims]:
        p.stop()
    return row(name, base, over, duration_s)


# --- turn priority ---------------------------------------------------------------------
@dataclass
class TurnRow:
    turn_priority: str
    agent_ttft_p50_ms: float
    agent_ttft_p99_ms: float
    session_s: float  # median time from a session's first turn to its last answer
    cold_ttft_p50_ms: float
    cold_ttft_p99_ms: float
    failed: int


TURN_COLD_RATE = 45.0  # a tenth above what one server of 4 sequences answers (~40/s)


async def agents_and_cold(url: str, sessions: int, turns: int, duration_s: float
                          ) -> tuple[list[list[Outcome]], list[Outcome]]:
    """Agent sessions (a turn, a short think, the next turn extending the
    conversation, so its prefix is cached) beside open-loop cold requests
    that keep the server full, all in one band."""
    async def agent(k: int, session: aiohttp.ClientSession) -> list[Outcome]:
        await asyncio.sleep(0.5 + k * 0.1)  # once the cold queue has formed
        out: list[Outcome] = []
        history = prompt(f"agent-{k}-{time.monotonic_ns()}", 1600)
        for n in range(turns):
            history += f" turn {n}: " + "y" * 400
            out.append(await one_prompt(session, url, {"x-session-id": f"s{k}"}, history))
            await asyncio.sleep(0.05)
        return out

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        cold = asyncio.create_task(drive(url, [Traffic("cold", TURN_COLD_RATE, duration_s,
                                                       1600, 8)]))
        agents = await asyncio.gather(*(agent(k, session) for k in range(sessions)))
        return list(agents), await cold


async def one_prompt(session: aiohttp.ClientSession, url: str, headers: dict[str, str],
                     text: str) -> Outcome:
    body = {"model": MODEL, "prompt": text, "max_tokens": 8, "stream": True}
    t0 = time.monotonic()
    ttft = None
    async with session.post(url + "/v1/completions", data=orjson.dumps(body),
                            headers={"Content-Type": "application/json", **headers}) as r:
        if r.status != 200:
            await r.read()
            return Outcome("agent", r.status, None, time.monotonic() - t0)
        async for raw in r.content:
            if raw.startswith(b"data: ") and ttft is None:
                ttft = time.monotonic() - t0
    return Outcome("agent", 200, ttft, time.monotonic() - t0)


def run_turns(procs: Procs, enabled: bool, sessions: int, turns: int,
              duration_s: float) -> TurnRow:
    sim = procs.sim(**{**SIM, "max_num_seqs": 4})
    cfg = {"flowControl": {"enabled": True, "queueTTLSeconds": 30,
                           "saturation": {"detector": "concurrency", "maxConcurrency": 4},
                           "turnPriority": {"enabled": enabled, "warmSeconds": 10}}}
    router = procs.router(cfg, endpoints=[sim.url])
    agents, cold = asyncio.run(agents_and_cold(router.url, sessions, turns, duration_s))
    for p in (router, sim):
        p.stop()
    flat = [o for a in agents for o in a]
    spans = sorted(sum(o.e2e for o in a) for a in agents)
    a, c = ttfts_ms(flat, "agent"), ttfts_ms(cold, "cold")
    return TurnRow("on" if enabled else "off", pct(a, 0.5), pct(a, 0.99),
                   spans[len(spans) // 2], pct(c, 0.5), pct(c, 0.99),
                   sum(1 for o in flat + cold if o.status != 200))


# --- output -----------------------------------------------------------------------------
def table(rows: list[Row]) -> str:
    lines = [f"Critical traffic {CRITICAL_RATE:g}/s, batch (sheddable) {BURST}x; "
             f"{N_SIMS} simulators; goodput: critical answers with TTFT <= {SLO_MS:g} ms.", "",
             md_table(["router", "critical TTFT p50 / p99 unloaded ms",
                    "critical TTFT p50 / p99 overloaded ms", "p99 ratio", "critical goodput /s",
                    "critical failed", "batch ok", "batch 429", "batch other"],
                   ([r.router, f"{r.ttft_p50_unloaded_ms:.0f} / {r.ttft_p99_unloaded_ms:.0f}",
                     f"{r.ttft_p50_ms:.0f} / {r.ttft_p99_ms:.0f}", f"{r.p99_ratio:.2f}",
                     f"{r.goodput_rps:.1f}", r.critical_failed, r.batch_ok, r.batch_429,
                     r.batch_other] for r in rows), "l" + "r" * 8)]
    return "\n".join(lines)


def turn_table(rows: list[TurnRow]) -> str:
    return md_table(["turn priority", "agent turn TTFT p50 / p99 ms", "agent session s (median)",
                  "cold TTFT p50 / p99 ms", "failed"],
                 ([r.turn_priority, f"{r.agent_ttft_p50_ms:.0f} / {r.agent_ttft_p99_ms:.0f}",
                   f"{r.session_s:.2f}", f"{r.cold_ttft_p50_ms:.0f} / {r.cold_ttft_p99_ms:.0f}",
                   r.failed] for r in rows), "lrrrr")


def plot(rows: list[Row], turns: list[TurnRow], path: Path) -> None:
    fig, axes = pyplot().subplots(1, 3, figsize=(15, 4.5))
    names = [r.router for r in rows]
    x = range(len(rows))
    axes[0].bar([i - 0.2 for i in x], [r.ttft_p99_unloaded_ms for r in rows], 0.4,
                label="unloaded")
    axes[0].bar([i + 0.2 for i in x], [r.ttft_p99_ms for r in rows], 0.4, label="overloaded")
    axes[0].set_yscale("log")
    axes[0].set_title("critical TTFT p99 (ms, log)")
    axes[0].legend()
    axes[1].bar(list(x), [r.goodput_rps for r in rows])
    axes[1].axhline(CRITICAL_RATE, color="grey", linestyle="--", label="offered")
    axes[1].set_title(f"critical goodput (TTFT <= {SLO_MS:g} ms, /s)")
    axes[1].legend()
    for ax in axes[:2]:
        ax.set_xticks(list(x), [n.replace(", ", ",\n").replace(" (", "\n(") for n in names],
                      fontsize=8)
    labels = [f"turn priority {t.turn_priority}" for t in turns]
    axes[2].bar([i - 0.2 for i in range(len(turns))], [t.agent_ttft_p50_ms for t in turns], 0.4,
                label="agent turn p50")
    axes[2].bar([i + 0.2 for i in range(len(turns))], [t.cold_ttft_p50_ms for t in turns], 0.4,
                label="cold request p50")
    axes[2].set_xticks(list(range(len(turns))), labels)
    axes[2].set_title("TTFT with the endpoints full (ms)")
    axes[2].legend()
    fig.suptitle("flow control under a 10x sheddable burst, one run")
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.overload_bench", description=__doc__)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--quick", action="store_true", help="shorter phases, for a smoke test")
    ap.add_argument("--routers", nargs="+", default=list(CONTENDERS), choices=list(CONTENDERS))
    args = ap.parse_args(argv)
    if any(n.startswith("vllm-router") for n in args.routers) and not (
            PEERS / "vllm-router").exists():
        print("error: vllm-router missing: run `make peers`", file=sys.stderr)
        return 2
    duration = 3.0 if args.quick else 8.0
    with tempfile.TemporaryDirectory() as tmp:
        procs = Procs(Path(tmp))
        try:
            rows = [run_overload(procs, n, CONTENDERS[n], duration) for n in args.routers]
            turns = [run_turns(procs, on, 8, 4 if args.quick else 6, duration)
                     for on in (False, True)]
        finally:
            procs.close()
    md = table(rows) + "\n\nTurn priority (one band, endpoints full):\n\n" + turn_table(turns)
    write(Path(args.out), "overload", md,
                 {"sim": SIM, "slots": SLOTS, "critical_rate": CRITICAL_RATE, "burst": BURST,
                  "slo_ms": SLO_MS, "duration_s": duration,
                  "rows": [asdict(r) for r in rows], "turns": [asdict(t) for t in turns]},
                 lambda p: plot(rows, turns, p))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
