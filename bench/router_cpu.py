"""Where a router's CPU goes: watching idle servers, per request and per
relayed SSE event, ours against the Rust routers, each in front of its own
four fresh simulators.

    python -m bench.router_cpu            # table + bench/results/router_cpu.{json,md}

Idle: CPU a second while no request comes (health checks, scrapes), the
router's and its servers' (answering them, on top of their own background
work, which is the same under every router).
Per request: one-token streamed completions (one event each). Per event:
200-token streams from a simulator paced so each token is its own write
(as in the agentic benchmark); the per-request share is subtracted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.flags import count
from bench.http_stack import EVENT_SIM, EVENT_STREAM_TOKENS, streams
from bench.router_bench import REPO, ROUTERS, Start, ours_at, ours_with, peers_missing
from harness.procs import Procs
from toposerve.localcluster.results import table, write

CONTENDERS: dict[str, Start] = {
    **{name: ROUTERS[name] for name in ("toposerve", "smg cache_aware",
                                        "sglang-router cache_aware", "round-robin")},
    # what the shipped 5 s health interval saves
    "toposerve[previous health check: every 1 s]": ours_with(health_s=1.0),
}
# CPU times tick every 10 ms: 20 s idle reads to 0.5 ms a second
SIMS, IDLE_S, REQUESTS, STREAMS, WIDTH = 4, 20.0, 1000, 64, 32


def measure(tmp: Path, name: str) -> dict[str, Any]:
    procs = Procs(tmp)
    try:
        sims = [procs.sim(**EVENT_SIM) for _ in range(SIMS)]
        router = CONTENDERS[name](procs, sims)
        asyncio.run(streams(router.url, 16, 8, 1))  # connections made, code warm
        time.sleep(1.0)
        cpu0, sims0 = router.cpu_seconds(), sum(s.cpu_seconds() for s in sims)
        time.sleep(IDLE_S)
        idle = (router.cpu_seconds() - cpu0) / IDLE_S
        # what answering the router's health checks and scrapes costs the servers
        sims_idle = (sum(s.cpu_seconds() for s in sims) - sims0) / IDLE_S
        cpu0 = router.cpu_seconds()
        asyncio.run(streams(router.url, REQUESTS, WIDTH, 1))
        per_request = (router.cpu_seconds() - cpu0) / REQUESTS
        cpu0 = router.cpu_seconds()
        events = asyncio.run(streams(router.url, STREAMS, WIDTH, EVENT_STREAM_TOKENS))
        per_event = (router.cpu_seconds() - cpu0 - STREAMS * per_request) / (events - STREAMS)
    finally:
        procs.close()
    return {"router": name, "idle_cpu_ms_per_s": round(idle * 1e3, 2),
            "servers_idle_cpu_ms_per_s": round(sims_idle * 1e3, 2),
            "cpu_ms_per_request": round(per_request * 1e3, 3),
            "cpu_us_per_sse_event": round(per_event * 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.router_cpu", description=__doc__)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--against", metavar="REV",
                    help="also measure our router as committed at REV (an A/B in one run)")
    ap.add_argument("--rounds", type=count, default=1,
                    help="measure every router this many times, interleaved (rows per round)")
    args = ap.parse_args(argv)
    if err := peers_missing():
        print(err, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        if args.against:
            name, start = ours_at(args.against, Path(tmp))
            CONTENDERS[name] = start
        rows = [measure(Path(tmp), name) for _ in range(args.rounds) for name in CONTENDERS]
    md = table(["router", f"idle CPU ms a second, {SIMS} servers",
                "the servers' idle CPU ms a second", "CPU ms per one-token request",
                "CPU us per further SSE event"],
               ([r["router"], f"{r['idle_cpu_ms_per_s']:.1f}",
                 f"{r['servers_idle_cpu_ms_per_s']:.1f}", f"{r['cpu_ms_per_request']:.2f}",
                 f"{r['cpu_us_per_sse_event']:.0f}"] for r in rows), "lrrrr")
    write(Path(args.out), "router_cpu", md, {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
