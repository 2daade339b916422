"""What abusive clients cost, each against the limit that should bound it:
the router's RSS with large bodies in flight (below and past
server.maxInflightBytes), with many long session ids (kept as 32-character
hashes), with the Responses store filled by 1 MB turns past
responses.maxBytes, and the extender's call latency for a normal pod
beside a group that claims a billion pods (the scheduler's 5 s
httpTimeout). Loopback only; each scenario stops after --seconds.

    python -m bench.abuse_bench [--quick] [--seconds 25] [--out bench/results]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import psutil
import structlog
from aiohttp import web

from bench.flags import positive
from harness import extender_objects as k
from harness.procs import MODEL, Proc, Procs
from toposerve.localcluster.results import table, write
from toposerve.router.admission.flow_control import MAX_CLIENT_ID_BYTES
from toposerve.router.config import ServerConfig
from toposerve.scheduler_ext.config import ExtenderConfig
from toposerve.scheduler_ext.server import Extender

REPO = Path(__file__).resolve().parents[1]
MiB = 2**20
SERVER = ServerConfig()
STORE_BYTES = 64 * MiB  # responses.maxBytes here (default 256 MiB): a full store in seconds
# what one 1 MiB turn costs while it is handled, beside the stored bytes: two
# orjson encodings (the upstream request and the stored record), each buffer
# sized for the worst case (16x the text) until it is freed, plus the body
# and its parse
TURN_WORK = 2 * 16 * MiB + 4 * MiB
SESSION_ID_BYTES = MAX_CLIENT_ID_BYTES  # the longest session id the router takes
EXTENDER_TIMEOUT_S = 5.0  # the scheduler's httpTimeout for the extender
# RSS over a byte budget the process may add on top: socket buffers, the
# allocator's slack, a request in flight beside the store
SLACK = 1.25


@contextmanager
def peak_rss(proc: Proc) -> Iterator[dict[str, int]]:
    """The process's RSS before and at its highest while the block runs
    (sampled every 10 ms)."""
    p = psutil.Process(proc.popen.pid)
    out = {"before": p.memory_info().rss, "peak": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            out["peak"] = max(out["peak"], p.memory_info().rss)
            stop.wait(0.01)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        yield out
    finally:
        stop.set()
        t.join()
        out["peak"] = max(out["peak"], p.memory_info().rss)


def _mib(n: float) -> str:
    return f"{n / MiB:.1f}"


def _held_body(url: str, size: int) -> tuple[socket.socket, int | None]:
    """A chat request declaring ``size`` bytes, all but the last 10 sent:
    held in flight. The status, when the router answered at once (429)."""
    host, port = url.removeprefix("http://").split(":")
    s = socket.create_connection((host, int(port)), timeout=30)
    s.sendall(f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
              f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n".encode())
    chunk = b" " * MiB
    left = size - 10
    try:
        while left > 0:
            s.sendall(chunk[:left])
            left -= len(chunk)
    except OSError:
        pass  # refused and closed mid-body: the answer below says so
    s.settimeout(0.5)
    try:
        head = s.recv(64)
    except TimeoutError:
        return s, None
    return s, int(head.split(b" ", 2)[1]) if head else None


def large_bodies(procs: Procs, sim: Proc, concurrent: int, deadline: float) -> dict[str, Any]:
    router = procs.router(endpoints=[sim.url])
    size = SERVER.max_body_bytes - 1024
    socks: list[socket.socket] = []
    statuses: list[int | None] = []
    with peak_rss(router) as rss:
        for _ in range(concurrent):
            if time.monotonic() > deadline:
                break
            s, status = _held_body(router.url, size)
            socks.append(s)
            statuses.append(status)
        time.sleep(0.3)  # the last chunks read
    for s in socks:
        s.close()
    router.stop()
    held = sum(1 for st in statuses if st is None)
    return {"scenario": f"{concurrent} bodies of {_mib(size)} MiB at once",
            "sent": len(statuses), "refused_429": statuses.count(429),
            "growth_bytes": rss["peak"] - rss["before"], "held_bytes": held * size,
            "budget_bytes": SERVER.max_inflight_bytes,
            "budget": f"server.maxInflightBytes {_mib(SERVER.max_inflight_bytes)} MiB"}


async def _blast(url: str, bodies: Callable[[int], tuple[str, dict[str, Any], dict[str, str]]],
                 n: int, deadline: float, concurrency: int = 32) -> tuple[int, dict[int, int]]:
    """``n`` requests (or as many as fit before ``deadline``) from
    ``concurrency`` workers; how many were sent, and their statuses."""
    counts: dict[int, int] = {}
    nxt = iter(range(n))
    sent = 0

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal sent
        for i in nxt:
            if time.monotonic() > deadline:
                return
            path, body, headers = bodies(i)
            async with session.post(url + path, data=orjson.dumps(body), headers={
                    "Content-Type": "application/json", **headers}) as r:
                await r.read()
                counts[r.status] = counts.get(r.status, 0) + 1
                sent += 1

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as s:
        await asyncio.gather(*(worker(s) for _ in range(concurrency)))
    return sent, counts


def long_sessions(procs: Procs, sim: Proc, n: int, deadline: float) -> dict[str, Any]:
    router = procs.router(endpoints=[sim.url])
    chat = {"model": MODEL, "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}]}

    def body(i: int) -> tuple[str, dict[str, Any], dict[str, str]]:
        sid = f"{i:08d}".ljust(SESSION_ID_BYTES, "s")
        return "/v1/chat/completions", chat, {"x-session-id": sid}

    with peak_rss(router) as rss:
        sent, counts = asyncio.run(_blast(router.url, body, n, deadline))
    router.stop()
    growth = rss["peak"] - rss["before"]
    return {"scenario": f"{sent} distinct session ids of {SESSION_ID_BYTES} bytes",
            "sent": sent, "statuses": counts, "growth_bytes": growth,
            "per_session_bytes": growth / max(sent, 1), "ids_bytes": sent * SESSION_ID_BYTES,
            "budget_bytes": sent * 1024,
            "budget": "a 32-character hash a session (under 1 KiB each, whatever the id)"}


def full_store(procs: Procs, sim: Proc, turns: int, deadline: float) -> dict[str, Any]:
    router = procs.router({"responses": {"maxBytes": STORE_BYTES}}, endpoints=[sim.url])
    text = "y" * MiB
    ids: list[str] = []

    async def go() -> dict[int, int]:
        counts: dict[int, int] = {}
        async with aiohttp.ClientSession() as s:
            for i in range(turns):
                if time.monotonic() > deadline:
                    break
                async with s.post(router.url + "/v1/responses", json={
                        "model": MODEL, "input": f"{i} {text}", "max_output_tokens": 1}) as r:
                    doc = await r.json()
                    counts[r.status] = counts.get(r.status, 0) + 1
                    if r.status == 200:
                        ids.append(doc["id"])
        return counts

    with peak_rss(router) as rss:
        counts = asyncio.run(go())
    first, last = (aiohttp_status(router.url + f"/v1/responses/{i}") for i in (ids[0], ids[-1]))
    router.stop()
    return {"scenario": f"{len(ids)} Responses turns of 1 MiB", "sent": sum(counts.values()),
            "statuses": counts, "growth_bytes": rss["peak"] - rss["before"],
            "oldest_turn_status": first, "newest_turn_status": last,
            "budget_bytes": STORE_BYTES + TURN_WORK,
            "budget": f"responses.maxBytes {_mib(STORE_BYTES)} MiB + one turn's working "
                      f"memory {_mib(TURN_WORK)} MiB"}


def aiohttp_status(url: str) -> int:
    async def go() -> int:
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            return r.status
    return asyncio.run(go())


def extender_latency(calls: int, deadline: float) -> dict[str, Any]:
    nodes = k.planned(("gb200-nvl72", 36), ("hgx-h100", 4))
    names = [n.name for n in nodes]
    state = k.cluster_state(nodes, templates=[k.template("gpu4", 4)])
    state.relist("pods", [])
    ext = Extender(ExtenderConfig(), state)
    normal = k.toposerve_pods("ok", 4, claim_template="gpu4", level="rack", uid_prefix="ok")[0]
    huge = k.toposerve_pods("huge", 1, claim_template="gpu4", level="rack", uid_prefix="h")[0]
    huge["metadata"]["labels"]["toposerve.io/group-size"] = str(10**9)

    async def go() -> dict[str, list[float]]:
        runner = web.AppRunner(ext.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/filter"
        out: dict[str, list[float]] = {"normal": [], "huge": []}
        try:
            async with aiohttp.ClientSession() as s:
                for i in range(calls):
                    if time.monotonic() > deadline:
                        break
                    for name, pod in (("normal", normal), ("huge", huge)):
                        if name == "huge" and i % 2:
                            continue  # the normal pod alone every other call
                        t0 = time.perf_counter()
                        async with s.post(url, data=orjson.dumps(
                                {"Pod": pod, "NodeNames": names})) as r:
                            await r.read()
                            assert r.status == 200, r.status
                        out[name].append(time.perf_counter() - t0)
        finally:
            await runner.cleanup()
        return out

    # the extender logs each group's placement: not a line a call here
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    lat = asyncio.run(go())
    row: dict[str, Any] = {"scenario": "extender filter: a normal pod beside a 10^9-pod group",
                           "sent": len(lat["normal"]) + len(lat["huge"]),
                           "budget_s": EXTENDER_TIMEOUT_S,
                           "budget": f"the scheduler's httpTimeout {EXTENDER_TIMEOUT_S:.0f} s"}
    for name, xs in lat.items():
        xs.sort()
        row[f"{name}_p50_ms"] = 1000 * statistics.median(xs)
        row[f"{name}_p99_ms"] = 1000 * xs[min(len(xs) - 1, int(0.99 * len(xs)))]
    row["within_budget"] = max(row["normal_p99_ms"], row["huge_p99_ms"]) / 1000 < \
        EXTENDER_TIMEOUT_S
    return row


def measured(r: dict[str, Any]) -> str:
    if "normal_p99_ms" in r:
        return (f"normal p50 {r['normal_p50_ms']:.1f} / p99 {r['normal_p99_ms']:.1f} ms; "
                f"huge group p50 {r['huge_p50_ms']:.1f} / p99 {r['huge_p99_ms']:.1f} ms")
    text = f"RSS +{_mib(r['growth_bytes'])} MiB"
    if "refused_429" in r:
        text += f"; {r['refused_429']} refused with 429, {_mib(r['held_bytes'])} MiB held"
    if "per_session_bytes" in r:
        text += f" ({r['per_session_bytes']:.0f} B a session; ids {_mib(r['ids_bytes'])} MiB)"
    if "oldest_turn_status" in r:
        text += (f"; oldest turn {r['oldest_turn_status']}, "
                 f"newest {r['newest_turn_status']}")
    return text


def within(r: dict[str, Any]) -> bool:
    if "within_budget" in r:
        return bool(r["within_budget"])
    return bool(r["growth_bytes"] <= SLACK * r["budget_bytes"]
                and r.get("held_bytes", 0) <= r["budget_bytes"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.abuse_bench", description=__doc__)
    ap.add_argument("--out", default=str(REPO / "bench" / "results"))
    ap.add_argument("--seconds", type=positive, default=25.0, help="the most a scenario runs")
    ap.add_argument("--quick", action="store_true", help="smaller counts, for a smoke test")
    args = ap.parse_args(argv)
    q = args.quick
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        procs = Procs(Path(tmp))
        try:
            sim = procs.sim(time_scale=0.0001, max_model_len=4 * MiB)
            for n in (4, 16, 24):  # 24 x 8 MiB is past the 128 MiB budget
                rows.append(large_bodies(procs, sim, n, time.monotonic() + args.seconds))
            rows.append(long_sessions(procs, sim, 2000 if q else 50_000,
                                      time.monotonic() + args.seconds))
            # three times what the store holds: the growth must not follow the turns
            rows.append(full_store(procs, sim, 8 if q else 3 * STORE_BYTES // MiB,
                                   time.monotonic() + args.seconds))
        finally:
            procs.close()
    rows.append(extender_latency(20 if q else 300, time.monotonic() + args.seconds))
    for r in rows:
        r["within_budget"] = within(r)
    md = f"budget: the limit, x{SLACK} for RSS (buffers, allocator)\n\n" + table(
        ["scenario", "measured", "budget", "within"],
        [[r["scenario"], measured(r), r["budget"], "yes" if r["within_budget"] else "NO"]
         for r in rows])
    write(Path(args.out), "abuse", md, {"rows": rows})
    return 0  # a measurement, not a gate: a row over its budget says NO in the table


if __name__ == "__main__":
    raise SystemExit(main())
