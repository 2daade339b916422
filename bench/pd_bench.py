"""Prefill/decode split across two GB200 NVL72 domains: where each router
puts a request's decode half, and what moving its KV there costs.

The fleet: two NVLink domains (racks) of one block, each with its own
prefill and decode servers, one node each. A decode server pulls from its
prefill server the KV blocks it does not hold yet, priced by the shared
topology model for the tier the two nodes share (gb200-nvl72: NVLink
900 GB/s inside a domain, the block's RDMA 50 GB/s across), at 320 KiB of
KV per token (Llama-3-70B in bf16). Every router faces fresh simulators and
the same Mooncake requests. vLLM's NixlConnector hand-over: ours, ours with a
topology-blind decode pick, vllm-router's P/D mode; SGLang's bootstrap
hand-over: ours, sglang-router's P/D mode (both Rust routers cache_aware).

    python -m bench.pd_bench [--quick] [--repeats N] [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.flags import count
from bench.replay import replay_trace
from bench.report import medians, pct
from bench.router_bench import (
    MOONCAKE,
    REPO,
    SIM,
    launch_peer,
    peers_missing,
)
from bench.workloads import mooncake
from harness.procs import Proc, Procs
from toposerve.localcluster.ports import free_port
from toposerve.localcluster.results import pyplot, save, write
from toposerve.localcluster.results import table as md_table
from toposerve.localcluster.scale.measure import by_label, scrape_url, totals
from toposerve.simulator.metrics import NAMES

DOMAINS = ("nvl72-a", "nvl72-b")
PER_DOMAIN = {"prefill": 2, "decode": 2}
OUTER = {"zone": "zone-1", "block": "block-1"}
# KV blocks a server caches (640K tokens; the 600 requests' distinct prompt
# tokens, 1.8M, spread over four prefill servers fit). The router bench's
# Mooncake caches are larger, for its 3,000 requests.
CACHE_BLOCKS = 40_000


@dataclass
class Server:
    proc: Proc
    role: str
    node: str
    domain: str
    bootstrap_port: int | None = None  # an SGLang prefill server's

    def entry(self) -> dict[str, Any]:
        """Its static endpoint in our router's config."""
        out = {"url": self.proc.url, "role": self.role, "node": self.node,
               "nvlinkDomain": self.domain, "rack": self.domain, **OUTER}
        return out | ({"bootstrapPort": self.bootstrap_port} if self.bootstrap_port else {})


def fleet(procs: Procs, protocol: str) -> list[Server]:
    """The simulators, speaking vLLM (``nixl``) or SGLang (``sglang``)."""
    out = []
    for d in DOMAINS:
        for role, n in PER_DOMAIN.items():
            for i in range(n):
                node = f"{d}-{role}-{i}"
                # prefill chunks stall the decode steps of the same server: the
                # interference a split removes and an aggregated server pays
                flags: dict[str, Any] = {"prefill_stalls_decode": True}
                port = None
                if protocol == "sglang":
                    flags.update(dialect="sglang", disaggregation_mode=role)
                    if role == "prefill":
                        port = flags["disaggregation_bootstrap_port"] = free_port()
                proc = procs.sim(**SIM, num_gpu_blocks=CACHE_BLOCKS, node=node,
                                 nvlink_domain=d, rack=d, zone=OUTER["zone"],
                                 block=OUTER["block"], **flags)
                out.append(Server(proc, role, node, d, port))
    return out


Start = Callable[[Procs, list[Server]], Proc]


@dataclass(frozen=True)
class Contender:
    protocol: str  # the hand-over the simulators speak: nixl (vLLM) or sglang
    start: Start


def ours(protocol: str, decode_scorers: list[dict[str, Any]] | None = None,
         **pd_extra: Any) -> Contender:
    def start(procs: Procs, servers: list[Server]) -> Proc:
        pd: dict[str, Any] = {"enabled": True, "protocol": protocol, **pd_extra}
        if decode_scorers is not None:
            pd["decode"] = {"scorers": decode_scorers}
        return procs.router({"discovery": {"static": [s.entry() for s in servers]},
                             "disaggregation": pd, "scrape": {"intervalSeconds": 0.2}})
    return Contender(protocol, start)


def peer(binary: str, *args: str) -> Start:
    """A Rust router in its P/D mode, with its cache_aware policy."""
    def start(procs: Procs, servers: list[Server]) -> Proc:
        argv = [*args, "--policy", "cache_aware"]
        for s in servers:
            argv += [f"--{s.role}", s.proc.url]
            argv += [str(s.bootstrap_port)] if s.bootstrap_port else []
        return launch_peer(procs, binary, argv)
    return start


BLIND = [{"type": "inflight-tokens", "weight": 1}, {"type": "queue", "weight": 1}]
ROUTERS: dict[str, Contender] = {
    # the shipped decode profile: near-prefill 4, inflight-tokens 1, queue 1
    "toposerve": ours("nixl"),
    "toposerve[topology-blind decode: inflight-tokens 1, queue 1]": ours("nixl", BLIND),
    "toposerve[minPrefillTokens 1024]": ours("nixl", minPrefillTokens=1024),
    # the same eight servers, no split: each prefills and decodes
    "toposerve[aggregated]": ours("nixl", enabled=False),
    "vllm-router pd cache_aware": Contender("nixl", peer(
        "vllm-router", "--vllm-pd-disaggregation", "--kv-connector", "nixl",
        "--max-payload-size", str(512 * 2**20))),
    "toposerve sglang": ours("sglang"),
    "sglang-router pd cache_aware": Contender("sglang", peer(
        "sglang-router", "launch", "--pd-disaggregation")),
}


@dataclass
class Row:
    protocol: str
    router: str
    requests: int
    failed: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    tpot_p50_ms: float  # time per output token after the first: where prefill stalls show
    e2e_p50_ms: float
    in_domain: float  # share of KV pulls that stayed inside the prefill's NVLink domain
    pulled_mb_per_request: float
    pull_ms_per_request: float  # wall time, mean over requests
    pull_share_of_ttft: float  # mean pull time over mean TTFT
    prefill_hit_rate: float


def pulls_by_tier(sim: Proc) -> dict[str, float]:
    return dict(totals(scrape_url(sim.url + "/metrics"), "toposerve_sim_kv_pulls_total",
                       by_label("tier")))


def run_one(tmp: Path, name: str, reqs: list[Any]) -> Row:
    procs = Procs(tmp)
    try:
        contender = ROUTERS[name]
        servers = fleet(procs, contender.protocol)
        router = contender.start(procs, servers)
        time.sleep(0.5)
        run = asyncio.run(replay_trace(router.url, reqs, 1.0))
        decode = [s.proc.counters() for s in servers if s.role == "decode"]
        prefill = [s.proc.counters() for s in servers if s.role == "prefill"]
        tiers: dict[str, float] = {}
        for s in servers:
            if s.role == "decode":
                for tier, n in pulls_by_tier(s.proc).items():
                    tiers[tier] = tiers.get(tier, 0.0) + n
    finally:
        procs.close()
    ok = run.ok
    ttfts = [1000 * r.ttft for r in ok if r.ttft is not None]
    n = max(1, len(ok))
    dialect = 0 if contender.protocol == "nixl" else 1  # which of the simulator's names

    def total(counters: list[dict[str, float]], role: str, suffix: str) -> float:
        return sum(c.get(NAMES[role][dialect] + suffix, 0.0) for c in counters)

    pull_s = total(decode, "kv_pull_seconds", "_sum")
    pulled = total(decode, "kv_pull_bytes", "_sum")
    hits = total(prefill, "prefix_hits", "_total")
    queries = total(prefill, "prefix_queries", "_total")
    pulls = sum(tiers.values())
    return Row(protocol=contender.protocol, router=name, requests=len(run.results),
               failed=len(run.results) - len(ok),
               ttft_p50_ms=pct(ttfts, 0.5), ttft_p99_ms=pct(ttfts, 0.99),
               tpot_p50_ms=pct([1000 * (r.e2e - r.ttft) / (r.completion_tokens - 1)
                                for r in ok if r.ttft is not None and r.completion_tokens > 1],
                               0.5),
               e2e_p50_ms=pct([1000 * r.e2e for r in ok], 0.5),
               in_domain=(tiers.get("nvlink", 0.0) + tiers.get("same_node", 0.0)) / pulls
               if pulls else float("nan"),
               pulled_mb_per_request=pulled / n / 1e6, pull_ms_per_request=1000 * pull_s / n,
               pull_share_of_ttft=1000 * pull_s / n / statistics.mean(ttfts)
               if ttfts else float("nan"),
               prefill_hit_rate=hits / queries if queries else 0.0)


def table(rows: list[Row]) -> str:
    lines = [md_table(
        ["hand-over", "router", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "e2e p50 ms",
         "pulls inside the NVLink domain", "KV pulled MB/req", "KV pull ms/req",
         "pull / mean TTFT", "prefill hit rate", "failed"],
        ([r.protocol, r.router, f"{r.ttft_p50_ms:.0f}", f"{r.ttft_p99_ms:.0f}",
          f"{r.tpot_p50_ms:.1f}", f"{r.e2e_p50_ms:.0f}",
          "-" if math.isnan(r.in_domain) else format(r.in_domain, ".0%"),
          f"{r.pulled_mb_per_request:.0f}", f"{r.pull_ms_per_request:.2f}",
          f"{r.pull_share_of_ttft:.1%}", f"{r.prefill_hit_rate:.1%}", r.failed] for r in rows),
        "ll" + "r" * 10)]
    # each router against the first of its hand-over (ours as shipped)
    for protocol in dict.fromkeys(r.protocol for r in rows):
        base, *others = [r for r in rows if r.protocol == protocol]
        if others and base.pull_ms_per_request:
            lines += ["", f"{protocol}, against {base.router}: " + "; ".join(
                f"{r.router} pulls {r.pull_ms_per_request / base.pull_ms_per_request:.1f}x as "
                f"long, TTFT p50 x{r.ttft_p50_ms / base.ttft_p50_ms:.2f}" for r in others)]
    return "\n".join(lines)


def short(name: str) -> str:
    """A plot label: a variant by what it changes ("topology-blind decode")."""
    return name.split("[", 1)[1].split(":")[0].rstrip("]") if "[" in name else name


def plot(rows: list[Row], path: Path) -> None:
    fig, axes = pyplot().subplots(1, 4, figsize=(18, 5))
    metrics = [("in_domain", "KV pulls inside the NVLink domain"),
               ("pull_ms_per_request", "KV pull ms per request (wall)"),
               ("ttft_p50_ms", "TTFT p50 (ms)"), ("tpot_p50_ms", "TPOT p50 (ms)")]
    for ax, (field, label) in zip(axes, metrics, strict=True):
        ax.bar(range(len(rows)), [getattr(r, field) for r in rows],
               color=[f"C{i}" for i in range(len(rows))])
        ax.set_xticks(range(len(rows)), [f"{short(r.router)} ({r.protocol})" for r in rows],
                      fontsize=7, rotation=35, ha="right")
        ax.set_title(label)
    fig.suptitle("prefill/decode across two GB200 NVL72 domains, same simulators and requests")
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.pd_bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--quick", action="store_true", help="a smaller run, for a smoke test")
    ap.add_argument("--repeats", type=count, default=1, help="runs per router; medians shown")
    ap.add_argument("--routers", nargs="*", default=list(ROUTERS), choices=list(ROUTERS))
    args = ap.parse_args(argv)
    if any(n.endswith("pd cache_aware") for n in args.routers) and (err := peers_missing()):
        print(err, file=sys.stderr)
        return 2
    if not MOONCAKE.exists():
        print(f"error: the Mooncake trace is missing ({MOONCAKE})", file=sys.stderr)
        return 2
    reqs = mooncake(MOONCAKE, limit=150 if args.quick else 600, time_compression=16,
                    token_scale=0.25)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for name in args.routers:
                t0 = time.monotonic()
                row = run_one(Path(tmp), name, reqs)
                runs.append(row)
                print(f"  #{repeat} {name:60} TTFT p50 {row.ttft_p50_ms:5.0f} ms  in-domain "
                      f"{row.in_domain:4.0%}  failed {row.failed}  "
                      f"({time.monotonic() - t0:.0f}s)", file=sys.stderr, flush=True)
    rows = medians(runs, ("protocol", "router"))
    md = table(rows)
    write(Path(args.out), "pd_bench", md, {
        "sim": SIM, "domains": DOMAINS, "per_domain": PER_DOMAIN, "repeats": args.repeats,
        "rows": [asdict(r) for r in rows], "runs": [asdict(r) for r in runs]},
        lambda path: plot(rows, path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
