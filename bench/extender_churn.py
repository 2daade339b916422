"""What node churn costs the extender's next call: a P/D slice member's
filter, in process (the calling thread's CPU time), right after a node
joins, leaves or is relabelled into another rack, against the same call
with nothing changed.

    python -m bench.extender_churn [--nodes 1000 5000] [--events 40]

The state is ``bench.extender_bench``'s HGX rows: ``--nodes`` hgx-h100
nodes with 100 P/D slices whose domains are decided first. Then, for each
of ``--events`` rounds: a held member's filter (steady), a node event, the
same filter again (after the event). Writes
bench/results/extender_churn.{md,json}.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import structlog

from bench.extender_bench import PD_SLICES, _latency_extender, _requests
from bench.flags import count
from bench.report import pct
from harness import extender_objects as k
from toposerve.localcluster.results import table, write
from toposerve.scheduler_ext.server import Extender
from toposerve.topology.layout import PlannedNode

EVENTS = ("join", "leave", "relabel")


def _event(ext: Extender, kind: str, i: int, planned: list[PlannedNode], nodes: int) -> None:
    """Node ``i``'s event of ``kind``: a new node joins (``planned`` past the
    first ``nodes``), an old one (never the slices' first racks) leaves, or
    one moves to another rack."""
    if kind == "join":
        ext.state.node("ADDED", k.node(planned[nodes + i]))
        return
    victim = planned[nodes - 1 - i]
    if kind == "leave":
        ext.state.node("DELETED", k.node(victim))
        return
    moved = k.node(victim)
    labels = moved["metadata"]["labels"]
    other = k.node(planned[nodes - 1 - i - 8])["metadata"]["labels"]  # two racks over
    for key in ("topology.toposerve.io/block", "topology.toposerve.io/rack"):
        labels[key] = other[key]
    ext.state.node("MODIFIED", moved)


def measure(nodes: int, events: int) -> list[dict[str, Any]]:
    ext = _latency_extender(nodes, "hgx-h100")
    # planned once: the first ``nodes`` are the state's, the rest join
    planned = k.planned(("hgx-h100", nodes + events))
    reqs = [orjson.dumps(r) for r in _requests(nodes, PD_SLICES + events, "hgx-h100")
            ["pd-slice"]]
    for body in reqs[:PD_SLICES]:  # every slice decided
        ext.answer("filter", body)
    rows = []
    for kind in EVENTS:
        steady, after = [], []
        for i in range(events):
            body = reqs[PD_SLICES + i]
            t0 = time.thread_time()
            ext.answer("filter", body)
            steady.append(1000 * (time.thread_time() - t0))
            _event(ext, kind, EVENTS.index(kind) * events + i, planned, nodes)  # a node each
            t0 = time.thread_time()
            ext.answer("filter", body)
            after.append(1000 * (time.thread_time() - t0))
        rows.append({"nodes": nodes, "event": kind, "calls": events,
                     "steady_p50": pct(steady, 0.5), "after_p50": pct(after, 0.5),
                     "after_max": max(after)})
        print(f"{nodes} nodes, {kind}: after p50 {rows[-1]['after_p50']:.2f} ms",
              file=sys.stderr)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.extender_churn",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=count, nargs="+", default=[1000, 5000])
    ap.add_argument("--events", type=count, default=40, help="events of each kind")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args(argv)
    # every slice decided (16 GPUs each on 8-GPU nodes) and a node of its own for each
    # event, taken from the end, clear of the slices' racks
    least = PD_SLICES * 2 + len(EVENTS) * args.events + 8
    if min(args.nodes) < least:
        ap.error(f"--nodes {min(args.nodes)}: with --events {args.events}, at least {least} "
                 f"(the slices' {PD_SLICES * 2} nodes and a node for each event)")
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    rows = [r for n in args.nodes for r in measure(n, args.events)]
    md = table(["nodes", "node event", "calls", "filter p50 ms, nothing changed",
                "filter p50 ms, after the event", "after / nothing", "filter max ms, after"],
               [[r["nodes"], r["event"], r["calls"], f"{r['steady_p50']:.2f}",
                 f"{r['after_p50']:.2f}", f"{r['after_p50'] / r['steady_p50']:.1f}",
                 f"{r['after_max']:.2f}"] for r in rows], "rlrrrrr")
    write(args.out, "extender_churn", md, {"events": args.events, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
