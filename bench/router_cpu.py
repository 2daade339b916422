"""Where a router's CPU goes: per request and per relayed SSE event, ours
against the Rust routers, each in front of its own fresh simulators.

    python -m bench.router_cpu            # table + bench/results/router_cpu.{json,md}

Per request: one-token streamed completions (one event each). Per event:
200-token streams from a simulator paced so each token is its own write
(as in the agentic benchmark); the per-request share is subtracted.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.http_stack import EVENT_SIM, EVENT_STREAM_TOKENS, streams
from bench.procs import Procs
from bench.report import write
from bench.router_bench import REPO, ROUTERS, peers_missing

NAMES = ("toposerve", "sglang-router cache_aware", "round-robin")
REQUESTS, STREAMS, WIDTH = 1000, 64, 32


def measure(tmp: Path, name: str) -> dict[str, Any]:
    procs = Procs(tmp)
    try:
        router = ROUTERS[name](procs, [procs.sim(**EVENT_SIM)])
        asyncio.run(streams(router.url, 16, 8, 1))  # connections made, code warm
        cpu0 = router.cpu_seconds()
        asyncio.run(streams(router.url, REQUESTS, WIDTH, 1))
        per_request = (router.cpu_seconds() - cpu0) / REQUESTS
        cpu0 = router.cpu_seconds()
        events = asyncio.run(streams(router.url, STREAMS, WIDTH, EVENT_STREAM_TOKENS))
        per_event = (router.cpu_seconds() - cpu0 - STREAMS * per_request) / (events - STREAMS)
    finally:
        procs.close()
    return {"router": name, "cpu_ms_per_request": round(per_request * 1e3, 3),
            "cpu_us_per_sse_event": round(per_event * 1e6, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.router_cpu", description=__doc__)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args(argv)
    if err := peers_missing():
        print(err, file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        rows = [measure(Path(tmp), name) for name in NAMES]
    md = "\n".join([
        "| router | CPU ms per one-token request | CPU us per further SSE event |",
        "|---|---:|---:|",
        *(f"| {r['router']} | {r['cpu_ms_per_request']:.2f} | "
          f"{r['cpu_us_per_sse_event']:.0f} |" for r in rows)])
    write(Path(args.out), "router_cpu", md, {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
