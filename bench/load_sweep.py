"""How far below round-robin a router gets as load rises: the Mooncake
replay at several time compressions (more compression, more requests a
second on the same four simulators), each through round-robin, our router
and the strongest peer, next to the queueing model's round-robin and
least-TTFT oracle at the same load (bench.queue_model).

One load point says little about a cache-aware router: at light load
round-robin hardly queues and reuse saves only prefill time; near
round-robin's capacity its queues grow and reuse saves the queueing too;
past the fleet's capacity every router queues. Prints a table, writes JSON
and a PNG plot.

    python -m bench.load_sweep [--compressions 8 12 16 18 20 22] [--quick] [--model-only]
                               [--trace conversation_trace.jsonl] [--requests 3000]
                               [--arrivals spread|tick]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.flags import count, positive
from bench.router_bench import (
    CACHE_BLOCKS,
    MOONCAKE,
    MOONCAKE_REQUESTS,
    REPO,
    ROUTERS,
    modelled,
    mooncake_requests,
    peers_missing,
    run_one,
)
from toposerve.localcluster.results import pyplot, save, write
from toposerve.localcluster.results import table as md_table

ROUND_ROBIN = "round-robin"
DEFAULT_ROUTERS = [ROUND_ROBIN, "toposerve", "sglang-router cache_aware"]


@dataclass
class Point:
    compression: float
    offered_rps: float  # the replay's requests over the span of their send times
    router: str  # a router, or "model: <policy>" for the queueing model
    ttft_p50_ms: float
    ttft_p99_ms: float
    captured: float | None = None  # share of the available reuse; None for the model
    failed: int = 0


def below(points: list[Point], compression: float, router: str,
          base: str = ROUND_ROBIN) -> float:
    """How far ``router``'s TTFT p50 is below ``base``'s at one load (0.5 = half)."""
    p50 = {p.router: p.ttft_p50_ms for p in points if p.compression == compression}
    return 1 - p50[router] / p50[base] if router in p50 and base in p50 else float("nan")


def table(points: list[Point]) -> str:
    routers = list(dict.fromkeys(p.router for p in points if not p.router.startswith("model")))
    head = ["compression", "offered req/s"]
    head += [f"{r} p50 / p99 ms" for r in routers]
    head += [f"{r} p50 below round-robin" for r in routers if r != ROUND_ROBIN]
    head += ["model: round-robin p50 ms", "model: oracle p50 ms",
             "model: oracle p50 below round-robin", "failed"]
    lines = []
    for c in dict.fromkeys(p.compression for p in points):
        at = {p.router: p for p in points if p.compression == c}
        cells = [f"x{c:g}", f"{next(iter(at.values())).offered_rps:.1f}"]
        cells += [f"{at[r].ttft_p50_ms:.0f} / {at[r].ttft_p99_ms:.0f}" if r in at else ""
                  for r in routers]
        cells += [f"{below(points, c, r):.0%}" for r in routers if r != ROUND_ROBIN]
        rr, oracle = at.get("model: round-robin"), at.get("model: least-ttft")
        cells += ([f"{rr.ttft_p50_ms:.0f}", f"{oracle.ttft_p50_ms:.0f}",
                   f"{below(points, c, 'model: least-ttft', 'model: round-robin'):.0%}"]
                  if rr and oracle else ["", "", ""])
        cells.append(str(sum(p.failed for p in at.values())))
        lines.append(cells)
    return md_table(head, lines, "r" * len(head))


def plot(points: list[Point], path: Path) -> None:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.8))
    loads = sorted({p.offered_rps for p in points})
    names = list(dict.fromkeys(p.router for p in points))
    colours = dict(zip(names, plt.rcParams["axes.prop_cycle"].by_key()["color"], strict=False))
    for name in names:
        mine = sorted((p for p in points if p.router == name), key=lambda p: p.offered_rps)
        style = {"linestyle": "--"} if name.startswith("model") else {"marker": "o"}
        left.plot([p.offered_rps for p in mine], [p.ttft_p50_ms for p in mine],
                  color=colours.get(name), label=name, **style)
        base = "model: round-robin" if name.startswith("model") else ROUND_ROBIN
        if name not in (ROUND_ROBIN, "model: round-robin"):
            right.plot([p.offered_rps for p in mine],
                       [100 * below(points, p.compression, name, base) for p in mine],
                       color=colours.get(name), label=f"{name} (against its round-robin)"
                       if name.startswith("model") else name, **style)
    left.set_yscale("log")
    left.set_title("Mooncake replay: TTFT p50 (ms) against load")
    right.set_title("TTFT p50 below round-robin (%) against load")
    right.axhline(85, color="grey", linewidth=0.8, linestyle=":")
    right.annotate("85%", (0, 85), xycoords=("axes fraction", "data"), fontsize=8,
                   color="grey", va="bottom")
    for ax in (left, right):
        ax.set_xlabel("offered requests/s (4 simulators)")
        ax.set_xticks(loads, [f"{x:.0f}" for x in loads])
        ax.legend(fontsize=8)
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.load_sweep", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--compressions", nargs="+", type=positive, default=[8, 12, 16, 18, 20, 22],
                    help="how many times faster than the trace's clock to replay it")
    ap.add_argument("--routers", nargs="+", default=DEFAULT_ROUTERS, choices=list(ROUTERS))
    ap.add_argument("--quick", action="store_true", help="200 requests, for a smoke test")
    ap.add_argument("--model-only", action="store_true",
                    help="only the queueing model (seconds, no processes)")
    ap.add_argument("--trace", type=Path, default=MOONCAKE,
                    help="a trace in the Mooncake JSONL format (timestamp, input_length, "
                         "output_length, hash_ids)")
    ap.add_argument("--requests", type=count, default=MOONCAKE_REQUESTS,
                    help="how many of the trace's first requests to replay")
    ap.add_argument("--arrivals", choices=["spread", "tick"], default="spread",
                    help="spread: each tick's requests spaced over the tick; tick: sent "
                         "together, as stamped")
    args = ap.parse_args(argv)
    if ROUND_ROBIN not in args.routers:
        ap.error("the sweep compares against round-robin: keep it in --routers")
    if not args.trace.exists():
        print(f"error: the trace is missing: {args.trace} (give one with --trace)",
              file=sys.stderr)
        return 2
    if not args.model_only and (err := peers_missing()):
        print(err, file=sys.stderr)
        return 2
    points: list[Point] = []
    with tempfile.TemporaryDirectory() as tmp:
        for c in args.compressions:
            reqs = mooncake_requests(c, quick=args.quick, trace=args.trace,
                                     requests=args.requests, spread=args.arrivals == "spread")
            span = max(r.at_s for r in reqs) - min(r.at_s for r in reqs)
            rps = len(reqs) / span if span > 0 else float("nan")
            for policy, m in modelled(reqs, CACHE_BLOCKS["mooncake"]).items():
                points.append(Point(c, rps, f"model: {policy}", m["p50_ms"], m["p99_ms"]))
            for name in [] if args.model_only else args.routers:
                t0 = time.monotonic()
                row = run_one(Path(tmp), name, "mooncake", reqs)
                points.append(Point(c, rps, name, row.ttft_p50_ms, row.ttft_p99_ms,
                                    row.captured, row.failed))
                print(f"  x{c:<4g} {name:26} TTFT p50 {row.ttft_p50_ms:7.0f} ms  "
                      f"failed {row.failed}  ({time.monotonic() - t0:.0f}s)",
                      file=sys.stderr, flush=True)
    doc: dict[str, Any] = {"requests": len(reqs), "arrivals": args.arrivals,
                           "points": [asdict(p) for p in points]}
    write(Path(args.out), "load_sweep", table(points), doc,
                 lambda path: plot(points, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
