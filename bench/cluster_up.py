"""``make scale``: how long ``toposerve cluster up`` takes for N fake nodes
(warm tool cache), for each N given. Prints a table, writes JSON.

    python -m bench.cluster_up --nodes 100 1000
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.flags import count
from toposerve.localcluster.cluster import ClusterSpec, down, running_clusters, up
from toposerve.localcluster.results import table, write_json

REPO = Path(__file__).resolve().parents[1]


def _progress(n: int) -> Callable[[str], None]:
    return lambda m: print(f"  [{n} nodes] {m}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cluster_up", description=__doc__)
    ap.add_argument("--nodes", type=count, nargs="+", default=[100, 1000])
    ap.add_argument("--profile", default="gb200-nvl72")
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args(argv)
    rows = []
    for n in args.nodes:
        name = f"scale-{n}"
        if name in running_clusters():
            down(name)
        t0 = time.monotonic()
        up(ClusterSpec(name=name, groups=[(args.profile, n)]), progress=_progress(n))
        took = time.monotonic() - t0
        t1 = time.monotonic()
        down(name, progress=lambda m: None)
        rows.append({"nodes": n, "profile": args.profile, "up_seconds": round(took, 1),
                     "down_seconds": round(time.monotonic() - t1, 1)})
    print(table(["nodes", "profile", "cluster up (s)", "cluster down (s)"],
                ([r["nodes"], r["profile"], r["up_seconds"], r["down_seconds"]] for r in rows),
                "rlrr"))
    write_json(Path(args.out) / "cluster_up.json", rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
