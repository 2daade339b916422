"""``make demo``, serving: simulated vLLM servers on the pod IPs of
kwok-run pods, the installed router (on the real node's network: the pod
IPs are loopback) finding them through the Kubernetes API; multi-turn
conversations streamed through it and, beside it, round-robin over the
same servers (TTFT and prefix-cache hits of each); then prefill/decode
pods in two GB200 NVL72 domains with a router splitting each request."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from demo_support import DemoError
from kubernetes import client

from harness.procs import MODEL, Procs
from toposerve.localcluster.clusters import api_client, kubeconfig_path
from toposerve.localcluster.nodes import node_labels
from toposerve.localcluster.pods import model_pod, wait_running
from toposerve.topology.labels import PRESETS, DialectName, from_labels

Say = Callable[[str], None]
APP, PORT = "vllm", 8000  # the model pods' label and the simulators' port
SESSIONS = 5  # not a multiple of the 3 servers: round-robin moves a session each turn
TURNS = 4
# a long shared system prompt per session: what a prefix-cache hit saves
SYSTEM = "Be brief and cite the clause you rely on. " * 700


@dataclass
class Traffic:
    """One way of sending the same conversations: what each request saw."""

    name: str
    ttft_ms: list[float] = field(default_factory=list)
    cached: int = 0
    prompt: int = 0
    moves: int = 0  # turns served by another server than the session's turn before

    def p(self, q: float) -> float:
        xs = sorted(self.ttft_ms)
        return xs[min(len(xs) - 1, int(q * len(xs)))]

    def hit_rate(self) -> float:
        return self.cached / self.prompt if self.prompt else 0.0

    def doc(self) -> dict[str, Any]:
        return {"name": self.name, "requests": len(self.ttft_ms),
                "ttftP50Ms": round(self.p(0.5), 1), "ttftP90Ms": round(self.p(0.9), 1),
                "ttftMeanMs": round(statistics.mean(self.ttft_ms), 1),
                "cachedTokens": self.cached, "promptTokens": self.prompt,
                "hitRate": round(self.hit_rate(), 3), "moves": self.moves,
                "ttftMs": [round(x, 1) for x in self.ttft_ms]}


def _stream(url: str, messages: list[dict[str, str]]) -> tuple[float, str, int, int, str]:
    """One streamed chat turn: TTFT (ms), the reply, cached and prompt
    tokens, and the server that answered (the router's header, else ``url``)."""
    started = time.monotonic()
    with httpx.stream("POST", url + "/v1/chat/completions", timeout=60, json={
            "model": MODEL, "messages": messages, "max_tokens": 8, "stream": True,
            "stream_options": {"include_usage": True}}) as r:
        if r.status_code != 200:
            raise DemoError(f"{url}: HTTP {r.status_code}: {r.read()[:200]!r}")
        ttft: float | None = None
        text: list[str] = []
        usage: dict[str, Any] = {}
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            for c in chunk.get("choices") or []:
                piece = (c.get("delta") or {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.monotonic() - started
                    text.append(piece)
            usage = chunk.get("usage") or usage
        served = r.headers.get("x-toposerve-endpoint", url.removeprefix("http://"))
    if ttft is None or not usage:
        raise DemoError(f"{url}: a streamed answer without content or usage")
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return 1000 * ttft, "".join(text), cached, usage["prompt_tokens"], served


def _converse(traffic: Traffic, url_for: Callable[[int], str]) -> Traffic:
    """SESSIONS conversations of TURNS turns, interleaved turn by turn, the
    ``k``-th request sent to ``url_for(k)``."""
    chats = [[{"role": "system", "content": f"You help {traffic.name} user {s}. " + SYSTEM}]
             for s in range(SESSIONS)]
    last: dict[int, str] = {}
    k = 0
    for turn in range(TURNS):
        for s, msgs in enumerate(chats):
            msgs.append({"role": "user", "content": f"question {turn} of user {s}"})
            ttft, reply, cached, prompt, served = _stream(url_for(k), msgs)
            k += 1
            msgs.append({"role": "assistant", "content": reply})
            traffic.ttft_ms.append(ttft)
            traffic.cached += cached
            traffic.prompt += prompt
            traffic.moves += int(s in last and last[s] != served)
            last[s] = served
    return traffic


def _metric_lines(url: str, prefix: str) -> list[str]:
    return [x for x in httpx.get(url + "/metrics").text.splitlines() if x.startswith(prefix)]


def _run_pods(core: Any, app: str, pods: dict[str, tuple[str, str | None]]
              ) -> dict[str, tuple[str, str]]:
    """Create ``pods`` (name -> (role, node or None for kube-scheduler));
    returns name -> (pod IP, node) once each runs."""
    for pod, (role, node) in pods.items():
        core.create_namespaced_pod("default", model_pod(pod, app, role, node))
    return wait_running(core, list(pods))


def model_pods(name: str, say: Say, procs: Procs) -> list[str]:
    """Step: three model-server pods placed by kube-scheduler, a simulator
    on each pod's IP; their URLs. Before the install: the installed router
    is ready once it finds one."""
    say("2a. Three model-server pods (kube-scheduler, kwok), simulated vLLM on their IPs")
    core = client.CoreV1Api(api_client(name))
    ips = _run_pods(core, APP, {f"{APP}-{i}": ("prefill-decode", None) for i in range(3)})
    urls = []
    for pod, (ip, node) in sorted(ips.items()):
        urls.append(procs.sim(host=ip, port=PORT, time_scale=1.0).url)
        print(f"   {pod} on {node}: simulated vLLM listening on {ip}:{PORT}")
    return urls


def routed_traffic(say: Say, urls: list[str], router: str) -> list[Traffic]:
    """Step: the same conversations through round-robin over ``urls`` and
    through the installed router at ``router``; both results."""
    say("6. Conversations through the installed router, beside round-robin")
    print(f"   the installed router's leader on {router} (a pod on the real node's network), "
          f"its servers from the Kubernetes API; /ready: {httpx.get(router + '/ready').text}")
    print(f"   {SESSIONS} conversations x {TURNS} turns, each with a long system prompt, "
          "streamed; first round-robin, then the router")
    rr = _converse(Traffic("round-robin"), lambda k: urls[k % len(urls)])
    routed = _converse(Traffic("toposerve router"), lambda _: router)
    for t in (rr, routed):
        print(f"   {t.name:16}: TTFT p50 {t.p(0.5):6.1f} ms, p90 {t.p(0.9):6.1f} ms; "
              f"{100 * t.hit_rate():4.1f}% of prompt tokens from cache; "
              f"{t.moves} of {SESSIONS * (TURNS - 1)} later turns on another server")
    print("   routing decisions by reason:\n     " + "\n     ".join(
        _metric_lines(router, "toposerve_router_decisions_total")))
    return [rr, routed]


def pd_split(name: str, say: Say, procs: Procs) -> None:
    """Step: prefill and decode pods in two NVL72 domains, a router on the
    host (the installed one serves the pods above) splitting each request,
    the decode half in the prefill half's domain."""
    say("7. Prefill/decode split across two GB200 NVL72 domains")
    core = client.CoreV1Api(api_client(name))
    gb200 = node_labels(core, "topology.toposerve.io/profile=gb200-nvl72")
    trays = sorted(gb200)
    # one prefill and one decode pod per NVL72 domain, each on its own tray
    pd = _run_pods(core, "vllm-pd", {
        "prefill-0": ("prefill", trays[0]), "decode-0": ("decode", trays[1]),
        "prefill-1": ("prefill", trays[18]), "decode-1": ("decode", trays[19])})
    place = {node: from_labels(node, labels, PRESETS[DialectName.TOPOSERVE])
             for node, labels in gb200.items()}
    domain = {node: str(p.nvlink) for node, p in place.items()}
    decode_sims = []
    for pod, (ip, node) in sorted(pd.items()):
        # each simulator knows its node's place, so a decode pays for its
        # KV pull what the topology model charges for the tier crossed
        p = place[node]
        sim = procs.sim(host=ip, port=8000, time_scale=0.2, node=node,
                        nvlink_domain=p.nvlink, rack=p.rack, block=p.block, zone=p.zone)
        if pod.startswith("decode"):
            decode_sims.append(sim)
        print(f"   {pod} on {node} ({domain[node]}): simulated vLLM on {ip}:8000")
    where = {f"{ip}:8000": f"{node}, {domain[node]}" for ip, node in pd.values()}
    split = procs.router({"discovery": {"kubernetes": {
        "namespace": "default", "labelSelector": "app=vllm-pd", "port": 8000,
        "kubeconfig": str(kubeconfig_path(name))}}, "disaggregation": {"enabled": True}})
    for doc in ("contract", "manual", "report"):
        r = httpx.post(split.url + "/v1/completions", timeout=30, json={
            "model": MODEL, "prompt": f"Summarise this {doc}. " + "Clause. " * 400,
            "max_tokens": 8})
        pre, dec = r.headers["x-toposerve-prefill-endpoint"], r.headers["x-toposerve-endpoint"]
        print(f"   {doc}: prefill on {pre} ({where[pre]})\n"
              f"   {' ' * len(doc)}  decode  on {dec} ({where[dec]})")
    pulled = [s.counters() for s in decode_sims]
    gb = sum(c.get("vllm:nixl_bytes_transferred_sum", 0.0) for c in pulled) / 1e9
    ms = 1000 * sum(c.get("vllm:nixl_xfer_time_seconds_sum", 0.0) for c in pulled)
    model_s = ms / 1000 / 0.2  # the simulators run 5x faster than model time
    print(f"   KV pulled by the decode pods: {gb:.1f} GB in {ms:.1f} ms of wall time, "
          f"{gb / model_s:.0f} GB/s in model time\n   pairs by tier:\n     "
          + "\n     ".join(_metric_lines(split.url, "toposerve_router_pd_pairs_total")))
