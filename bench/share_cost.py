"""What sharing one view costs a request, in process: the work each
router process (replica or worker) adds for every request routed by any
of them, beside what routing that request costs where it is routed.

    python -m bench.share_cost [--requests 4000] [--rounds 3]

Four healthy endpoints, the default profile. Each request is scheduled and
recorded where it goes (``schedule``: the filters, scorers and picker, and
the scorers' record of the answer), its decision message built and encoded
as the publisher sends it (``publish``), and, in a second router state,
decoded, checked and replayed into that profile's scorers as a peer does
(``replay``). Prompts: 20 shared system prompts of 8 KB, each followed by
0.2-6 KB of its own, 50 sessions. The calling thread's CPU time, the median
of ``--rounds``. Not counted: HTTP, the relay of the answer, the bus
(Redis or the workers' hub) and the in-flight reports, which are sent per
interval, not per request. Writes bench/results/share_cost.{md,json}.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from bench.flags import count
from harness.router_state import MODEL, make_state
from toposerve.localcluster.results import table, write
from toposerve.router.ha.replication import message, replay
from toposerve.router.ha.snapshot import decision
from toposerve.router.request import RequestContext
from toposerve.router.scheduling.profile import Scheduler
from toposerve.router.state import RouterState

STAGE = "profile"


def _router() -> tuple[RouterState, Scheduler]:
    state = make_state()
    return state, Scheduler(state, state.config.profile, None)


def _prompts(n: int, seed: int) -> list[tuple[bytes, str]]:
    rnd = random.Random(seed)
    systems = [rnd.randbytes(8192) for _ in range(20)]
    return [(systems[i % 20] + rnd.randbytes(rnd.randint(200, 6000)), f"s{i % 50}")
            for i in range(n)]


def measure(n: int, seed: int) -> dict[str, float]:
    """µs a request for each part, one round."""
    _, sched = _router()
    peer_state, peer = _router()
    peers = {STAGE: peer}
    msgs, took = [], {"schedule": 0.0, "publish": 0.0, "replay": 0.0}
    for seq, (prompt, session) in enumerate(_prompts(n, seed), 1):
        ctx = RequestContext(model=MODEL, prompt=prompt, session=session)
        t0 = time.thread_time()
        d = sched.schedule(ctx)
        d.answered(d.ranked[0])
        t1 = time.thread_time()
        msgs.append(orjson.dumps(message("a", seq, STAGE, ctx, d.ranked[0])))
        t2 = time.thread_time()
        took["schedule"] += t1 - t0
        took["publish"] += t2 - t1
    t0 = time.thread_time()
    replayed = 0
    for raw in msgs:
        doc = orjson.loads(raw)
        decision(doc)
        replayed += replay(doc, peers, peer_state.pool)
    took["replay"] = time.thread_time() - t0
    if replayed != n:  # a stage or endpoint the peer did not know: nothing was timed
        raise RuntimeError(f"the peer replayed {replayed} of {n} decisions")
    return {k: 1e6 * v / n for k, v in took.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.share_cost",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=count, default=4000)
    ap.add_argument("--rounds", type=count, default=3)
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    args = ap.parse_args(argv)
    rounds = [measure(args.requests, seed) for seed in range(args.rounds)]
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    share = med["publish"] + med["replay"]
    md = table(["requests", "rounds", "schedule µs", "publish µs", "replay at a peer µs",
                "publish + replay / schedule"],
               [[args.requests, args.rounds, f"{med['schedule']:.1f}", f"{med['publish']:.1f}",
                 f"{med['replay']:.1f}", f"{share / med['schedule']:.2f}"]], "rrrrrr")
    doc: dict[str, Any] = {"requests": args.requests, "rounds": rounds, "median": med}
    write(args.out, "share_cost", md, doc)
    print(f"each further process sharing the view adds {med['replay']:.1f} µs a request "
          "(its replay); the router that routed it adds the publish", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
