"""NIC discovery time: what one rescan of ``toposerve driver net`` costs on
a node with many interfaces. Stand-ins (``harness.net_standins``): one veth
end per NIC in a network namespace of this run's own (their peers are the
virtual interfaces the filters drop) and a fake sysfs tree with their PCI
functions, RDMA devices and uverbs char devices. Each repeat times the two
edges (sysfs scan, netlink dump of links, addresses and routes), the join
with the filters and the pool with its attributes.

    python -m bench.net_discovery --nics 8 64 --repeats 50

Needs root (it creates a network namespace); nothing leaves the namespace.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.flags import count
from bench.report import pct
from harness.net_standins import many_nics, stand_ins
from toposerve.dra_driver.net.devices import discovered_pool
from toposerve.dra_driver.net.discovery import NetFilters, join, read_links, scan_pci
from toposerve.localcluster.results import table, write
from toposerve.topology.model import DomainPath

REPO = Path(__file__).resolve().parents[1]
STAGES = ("sysfs_ms", "netlink_ms", "join_ms", "pool_ms", "total_ms")


def _once(sysfs: Path, netns: str, dev: Path) -> tuple[dict[str, float], int]:
    t0 = time.perf_counter()
    pcis = scan_pci(sysfs)
    t1 = time.perf_counter()
    links, gateways = read_links(netns)
    t2 = time.perf_counter()
    nics = join(pcis, links, gateways, NetFilters(), dev)
    t3 = time.perf_counter()
    pool = discovered_pool("bench-node", DomainPath(rack="r0", host="bench-node"), nics)
    t4 = time.perf_counter()
    times = {"sysfs_ms": t1 - t0, "netlink_ms": t2 - t1, "join_ms": t3 - t2,
             "pool_ms": t4 - t3, "total_ms": t4 - t0}
    return {k: v * 1000 for k, v in times.items()}, len(pool.devices)


def run(count: int, repeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp, stand_ins(Path(tmp), many_nics(count)) as s:
        _once(s.sysfs, s.netns, s.dev)  # warm: imports, the catalog, page cache
        samples = [_once(s.sysfs, s.netns, s.dev) for _ in range(repeats)]
        links = len(read_links(s.netns)[0])
    devices = {n for _, n in samples}
    if devices != {count}:
        raise SystemExit(f"{count} NICs: discovery published {sorted(devices)} devices")
    row: dict[str, Any] = {"nics": count, "links": links, "repeats": repeats}
    for stage in STAGES:
        values = [t[stage] for t, _ in samples]
        row[stage] = round(statistics.median(values), 2)
        row[stage.replace("_ms", "_p99_ms")] = round(pct(values, 0.99), 2)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.net_discovery", description=__doc__)
    ap.add_argument("--nics", type=count, nargs="+", default=[8, 64],
                    help="NIC counts, one run each (default: 8 and 64)")
    ap.add_argument("--repeats", type=count, default=50)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    args = ap.parse_args(argv)
    rows = [run(n, args.repeats) for n in args.nics]
    base = rows[0]["total_ms"]
    md = table(["NICs", "links in netns", "sysfs scan (ms)", "netlink (ms)", "join (ms)",
                "pool (ms)", "total median (ms)", "total p99 (ms)", "total vs first row"],
               ([*(r[k] for k in ("nics", "links", "sysfs_ms", "netlink_ms", "join_ms",
                                  "pool_ms", "total_ms", "total_p99_ms")),
                 f"{r['total_ms'] / base:.1f}x"] for r in rows), "r" * 9)
    write(Path(args.out), "net_discovery", md, {"runs": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
