"""The extender's filter calls while its pod watch thread is busy applying
status updates, at each given interpreter switch interval (how long a busy
thread may hold the GIL while another waits; Python's default is 5 ms),
in interleaved rounds on the same state.

    python -m bench.extender_gil [--nodes 1000] [--calls 400] [--rounds 3]
                                 [--switch-ms 5 1]

One process: the extender's state of ``--nodes`` hgx-h100 nodes with P/D
groups and bound pods of no group; a thread replays those pods' watch
events as the pod watch does (decode, then ``ClusterState.pod``) without
pause, while the main thread times filter calls through
``Extender.answer``, 2 ms apart. Wall time is what the scheduler waits;
CPU time (the calling thread's) is the call's own work. Writes
bench/results/extender_gil.{md,json}.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson

from bench.flags import count, positive
from bench.report import pct
from harness import extender_objects as k
from toposerve.localcluster.results import table, write
from toposerve.scheduler_ext.config import ExtenderConfig
from toposerve.scheduler_ext.server import Extender

GROUPS, MEMBERS = 40, 8


def _setup(nodes: int) -> tuple[Extender, list[bytes], list[bytes]]:
    """The warmed extender, the filter bodies to time, and the pod events
    the busy thread replays: pods of no group, bound; after the first pass
    each is a status update that changes nothing placement reads (most of
    a watch's events), so the thread's work is decoding and comparing."""
    planned = k.planned(("hgx-h100", nodes))
    state = k.cluster_state(planned, templates=[k.template("gpu4", 4)])
    names = [n.name for n in planned]
    members = []
    for g in range(GROUPS):
        for p in k.toposerve_pods(f"g{g}", MEMBERS, claim_template="gpu4", role="decode",
                                  uid_prefix=f"g{g}", profile="hgx-h100"):
            state.pod("ADDED", p)
            members.append(p)
    loose = [k.pod(f"o{i}", uid=f"o{i}", claim_template="gpu4", profile="hgx-h100")
             for i in range(200)]
    events = []
    for i, p in enumerate(loose):
        p = {**p, "spec": {**p["spec"], "nodeName": names[i % len(names)]}}
        state.pod("ADDED", p)
        events.append(orjson.dumps({"type": "MODIFIED", "object": p}))
    ext = Extender(ExtenderConfig(), state)
    ext.warm()
    waiting = [k.pod(f"w{i}", uid=f"w{i}", claim_template="gpu4", profile="hgx-h100")
               for i in range(200)]
    bodies = [orjson.dumps({"Pod": p, "NodeNames": names}) for p in members + waiting]
    return ext, bodies, events


def _round(ext: Extender, bodies: list[bytes], events: list[bytes], interval: float,
           calls: int) -> tuple[list[float], list[float]]:
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            for raw in events:
                ev = orjson.loads(raw)
                ext.state.pod(ev["type"], ev["object"])

    before = sys.getswitchinterval()
    sys.setswitchinterval(interval)
    busy = threading.Thread(target=watch, daemon=True)
    busy.start()
    wall, cpu = [], []
    try:
        for i in range(calls):
            body = bodies[i % len(bodies)]
            t0, c0 = time.perf_counter(), time.thread_time()
            ext.answer("filter", body)
            cpu.append(1000 * (time.thread_time() - c0))
            wall.append(1000 * (time.perf_counter() - t0))
            time.sleep(0.002)
    finally:
        stop.set()
        busy.join()
        sys.setswitchinterval(before)
    return wall, cpu


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=count, default=1000)
    ap.add_argument("--calls", type=count, default=400, help="filter calls a round")
    ap.add_argument("--rounds", type=count, default=3, help="rounds of each, interleaved")
    ap.add_argument("--switch-ms", type=positive, nargs="+", default=[5.0, 1.0],
                    help="switch intervals to compare, ms (the first is the baseline)")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args(argv)
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    ext, bodies, events = _setup(args.nodes)
    got: dict[float, tuple[list[float], list[float]]] = {ms: ([], []) for ms in args.switch_ms}
    for r in range(args.rounds):
        for ms, (walls, cpus) in got.items():
            wall, cpu = _round(ext, bodies, events, ms / 1000, args.calls)
            walls.extend(wall)
            cpus.extend(cpu)
            print(f"round {r + 1}/{args.rounds} {ms:g} ms: wall p99 {pct(wall, 0.99):.2f} ms",
                  file=sys.stderr)
    rows: list[dict[str, Any]] = [
        {"switch_ms": ms, "calls": len(wall), "wall_p50": pct(wall, 0.5),
         "wall_p99": pct(wall, 0.99), "wall_max": max(wall), "cpu_p50": pct(cpu, 0.5),
         "cpu_p99": pct(cpu, 0.99)} for ms, (wall, cpu) in got.items()]
    base = rows[0]["wall_p99"]
    md = table(["switch interval ms", "calls", "wall p50 ms", "wall p99 ms", "wall max ms",
                "CPU p50 ms", "CPU p99 ms", "wall p99 / first"],
               [[f"{r['switch_ms']:g}", r["calls"], f"{r['wall_p50']:.2f}",
                 f"{r['wall_p99']:.2f}", f"{r['wall_max']:.2f}", f"{r['cpu_p50']:.2f}",
                 f"{r['cpu_p99']:.2f}", f"{r['wall_p99'] / base:.2f}" if base else ""]
                for r in rows], "rrrrrrrr")
    write(args.out, "extender_gil", md, {"nodes": args.nodes, "rounds": args.rounds,
                                         "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
