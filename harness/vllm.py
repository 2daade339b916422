"""Real vLLM servers (the CPU build `make engines` caches) on loopback, for
the engine tier and the benchmarks: started in a process group of their
own, ready when they answer, ended with the whole group.

The serve flags are DESIGN §11's, each one for something the router reads:
prefix caching with reproducible block hashes and ``cached_tokens`` in
usage, map-encoded KV events over ZMQ, a KV cache small enough to evict,
few sequences so that load shows, one core per server. With ``nixl``, a
server also runs vLLM's NixlConnector on CPU buffers, for prefill/decode."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

from harness.engines import VLLM_ENV, installed, nixl_installed
from toposerve.localcluster.ports import free_port

MODEL = "toposerve/tiny-llama"
BLOCK_SIZE = 32  # CPU attention: a multiple of 32; only full blocks are cached
MAX_MODEL_LEN = 2048
KV_CACHE_BYTES = 8 * 1024 * 1024  # 8,192 tokens of the tiny model: evictions are reachable
MAX_NUM_SEQS = 4
# prefill or decode per request (the router decides), KV in host memory: the
# CPU build has no other buffer
KV_TRANSFER = {"kv_connector": "NixlConnector", "kv_role": "kv_both", "kv_buffer_device": "cpu"}
READY_TIMEOUT_S = 240.0  # about 25 s alone; far longer when two start on a busy machine


@dataclass
class VllmServer:
    port: int
    kv_port: int  # its KV events' PUB socket, where the router's subscriber connects
    replay_port: int
    cpu: int
    max_num_seqs: int
    popen: subprocess.Popen[bytes]
    log: Path
    extra: dict[str, str] = field(default_factory=dict)
    # NIXL's side channel, where a decode server asks for this one's KV
    # layout; None: no KV connector
    nixl_port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def kv_events(self) -> str:
        return f"tcp://127.0.0.1:{self.kv_port}"

    @property
    def kv_replay(self) -> str:
        return f"tcp://127.0.0.1:{self.replay_port}"

    @property
    def hostport(self) -> str:
        return self.url.removeprefix("http://")

    def log_tail(self, lines: int = 25) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> None:
        """Until /health and /v1/models answer 200; RuntimeError with the
        log's tail if the server exits or the time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(f"vLLM on cpu {self.cpu} exited ({self.popen.returncode}):\n"
                                   f"{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if (httpx.get(self.url + "/health", timeout=2).status_code == 200
                        and httpx.get(self.url + "/v1/models", timeout=2).status_code == 200):
                    return
            time.sleep(0.25)
        raise RuntimeError(f"vLLM on cpu {self.cpu} not ready after {timeout:.0f}s:\n"
                           f"{self.log_tail()}")

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM to its process group (the API server and its engine core),
        SIGKILL to what is left after ``grace_s``."""
        pgid = self.popen.pid  # start_new_session: the group is the server's own
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(grace_s)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)  # the engine core may outlive the API server
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(5)
        shutil.rmtree(ipc_dir(self.port), ignore_errors=True)

    def reset_cache(self, timeout: float = 30) -> None:
        """Empties its prefix cache once no request holds blocks (vLLM
        refuses until then: RuntimeError after ``timeout`` seconds) and has
        it send AllBlocksCleared now: vLLM publishes KV events with its next
        step, so a one-token request without a full block follows."""
        deadline = time.monotonic() + timeout
        while True:
            r = httpx.post(self.url + "/reset_prefix_cache", timeout=timeout)
            r.raise_for_status()
            if r.json() == {"success": True}:
                httpx.post(self.url + "/v1/completions", timeout=timeout, json={
                    "model": MODEL, "prompt": "hi", "max_tokens": 1}).raise_for_status()
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM on cpu {self.cpu} kept refusing to reset its "
                                   f"cache: {r.text}")
            time.sleep(0.2)

    @contextlib.contextmanager
    def engine_frozen(self) -> Iterator[None]:
        """The engine core (and its workers) stopped, the API server not: it
        still answers /health and /metrics, whose scheduler gauges hold what
        the last step recorded, and takes requests that wait. A queue caught
        this way stays put: on two cores the API server, starved by the
        engine's busy threads, feeds it about as fast as it decodes, so a
        queue built by load comes and goes within a scrape."""
        reaper = psutil.Process(self.popen.pid)
        api = reaper.children()[0]  # the reaper's one child: ``vllm serve``
        engine = api.children(recursive=True)
        for p in engine:
            p.suspend()
        try:
            yield
        finally:
            for p in engine:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.resume()

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)

    def restart(self) -> None:
        """A new process on the same ports and core, not yet ready (what a
        restarted pod is to the router: the same address, an empty cache);
        whatever is left of the old one is ended first."""
        self.stop()
        self.popen, self.log = _launch(Path(self.extra["model"]), self.log.parent, self.cpu,
                                       self.port, self.kv_port, self.replay_port,
                                       self.max_num_seqs, self.nixl_port)


# Runs vLLM as its child and leads the process group: when the server exits
# it takes what the server left (vLLM's engine core outlives its API server),
# and when the process that started it dies (a test run killed outright) it
# ends the whole group, so no 2 GB server is left behind. The group's SIGTERM
# is for the server; the reaper only waits for it.
REAPER = """
import ctypes, os, signal, subprocess, sys
def end(*_):
    os.killpg(0, signal.SIGKILL)
signal.signal(signal.SIGUSR1, end)
ctypes.CDLL(None).prctl(1, signal.SIGUSR1)  # PR_SET_PDEATHSIG
if os.getppid() != int(sys.argv[1]):
    end()
signal.signal(signal.SIGTERM, lambda *_: None)
subprocess.call(sys.argv[2:])
end()
"""


def serve_args(model: Path, port: int, kv_port: int, replay_port: int,
               max_num_seqs: int = MAX_NUM_SEQS, nixl: bool = False) -> list[str]:
    # vLLM binds its PUB socket only for an endpoint holding "*" or "::" (any
    # other it connects to); the IPv4-mapped loopback address has "::" and
    # binds 127.0.0.1 alone, where the router's subscriber connects.
    events = {"enable_kv_cache_events": True, "publisher": "zmq", "topic": "kv-events",
              "endpoint": f"tcp://[::ffff:127.0.0.1]:{kv_port}",
              "replay_endpoint": f"tcp://127.0.0.1:{replay_port}"}
    return ["serve", str(model), "--served-model-name", MODEL,
            "--host", "127.0.0.1", "--port", str(port),
            "--dtype", "bfloat16", "--enforce-eager",
            "--block-size", str(BLOCK_SIZE), "--max-model-len", str(MAX_MODEL_LEN),
            "--enable-prefix-caching", "--prefix-caching-hash-algo", "sha256_cbor",
            "--kv-cache-memory-bytes", str(KV_CACHE_BYTES),
            "--max-num-seqs", str(max_num_seqs),
            "--enable-prompt-tokens-details",
            "--kv-events-config", json.dumps(events),
            *(["--kv-transfer-config", json.dumps(KV_TRANSFER)] if nixl else [])]


def start(log_dir: Path, cpu: int, max_num_seqs: int = MAX_NUM_SEQS,
          nixl: bool = False) -> VllmServer:
    """One server pinned to ``cpu``, not yet ready (start several, then
    wait_ready each: they load side by side). EngineMissing when `make
    engines` has not run."""
    _, model = installed()
    port, kv_port, replay_port = free_port(), free_port(), free_port()
    nixl_port = free_port() if nixl else None
    popen, log = _launch(model, log_dir, cpu, port, kv_port, replay_port, max_num_seqs,
                         nixl_port)
    return VllmServer(port=port, kv_port=kv_port, replay_port=replay_port, cpu=cpu,
                      max_num_seqs=max_num_seqs, popen=popen, log=log,
                      extra={"model": str(model)}, nixl_port=nixl_port)


def ipc_dir(port: int) -> Path:
    """Where the server on ``port`` makes its ZMQ sockets: vLLM puts them in
    the temp directory under random names and leaves them when killed; a
    directory of the server's own is removed when it stops, or when a
    server starts on that port again after a crash. Short: a socket's path
    must fit 107 bytes."""
    return Path(tempfile.gettempdir()) / f"ts-vllm-{port}"


def _launch(model: Path, log_dir: Path, cpu: int, port: int, kv_port: int, replay_port: int,
            max_num_seqs: int, nixl_port: int | None = None
            ) -> tuple[subprocess.Popen[bytes], Path]:
    """The reaper and the server under it, logging to a new file in ``log_dir``."""
    python, _ = installed()
    log = log_dir / f"vllm-cpu{cpu}-{port}-{time.monotonic_ns()}.log"
    # VLLM_CPU_KVCACHE_SPACE would override --kv-cache-memory-bytes
    env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"}
    # dev mode: POST /reset_prefix_cache (vLLM then sends AllBlocksCleared), on loopback only
    ipc = ipc_dir(port)
    shutil.rmtree(ipc, ignore_errors=True)
    ipc.mkdir()
    env.update(VLLM_ENV, VLLM_CPU_OMP_THREADS_BIND=str(cpu), VLLM_SERVER_DEV_MODE="1",
               PYTHONUNBUFFERED="1", VLLM_RPC_BASE_PATH=str(ipc))
    if nixl_port is not None:
        env.update(PYTHONPATH=str(nixl_installed()), VLLM_NIXL_SIDE_CHANNEL_HOST="127.0.0.1",
                   VLLM_NIXL_SIDE_CHANNEL_PORT=str(nixl_port))
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-c", REAPER, str(os.getpid()),
             str(python), "-m", "vllm.entrypoints.cli.main",
             *serve_args(model, port, kv_port, replay_port, max_num_seqs,
                         nixl_port is not None)],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
            cwd=log_dir, start_new_session=True)
    return popen, log


def start_many(log_dir: Path, count: int, nixl: bool = False) -> list[VllmServer]:
    """``count`` servers, one per core (wrapping on a smaller machine), all
    ready; on any failure every one started is ended before the error."""
    cpus = sorted(os.sched_getaffinity(0))
    servers: list[VllmServer] = []
    try:
        for i in range(count):
            servers.append(start(log_dir, cpus[i % len(cpus)], nixl=nixl))
        for s in servers:
            s.wait_ready()
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


def router_config(servers: list[VllmServer], model: Path) -> dict[str, Any]:
    """Our router's config for ``servers``: their KV events, keyed with the
    model's own tokenizer and chat template (beside it in
    tokenizer_config.json) in blocks of the servers' size."""
    return {"kvEvents": {"tokenizer": str(model / "tokenizer.json"), "blockSize": BLOCK_SIZE},
            "discovery": {"static": [{"url": s.url, "kvEvents": s.kv_events,
                                      "kvEventsReplay": s.kv_replay} for s in servers]}}
