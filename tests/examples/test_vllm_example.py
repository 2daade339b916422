"""examples/08-vllm-deployment.yaml gives its vLLM pods the flags the
engine tier runs vLLM with (harness.vllm.serve_args), less the tier's
sizing for the CPU build on loopback, and its router config the same block
size: what the tier tests is what the example deploys."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.vllm import BLOCK_SIZE, serve_args

pytestmark = pytest.mark.unit
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "08-vllm-deployment.yaml"
# the tier's alone: its model name, loopback, and sizing for the CPU build
TIER_ONLY = {"--served-model-name", "--host", "--port", "--dtype", "--enforce-eager",
             "--max-model-len", "--kv-cache-memory-bytes", "--max-num-seqs"}
JSON_FLAGS = ("--kv-events-config", "--kv-transfer-config")


def flags(argv: list[str]) -> dict[str, str | None]:
    """``--flag value``, ``--flag=value`` and bare ``--flag``, by flag."""
    out: dict[str, str | None] = {}
    for i, a in enumerate(argv):
        if not a.startswith("--"):
            continue
        name, eq, value = a.partition("=")
        nxt = argv[i + 1] if i + 1 < len(argv) else "--"
        out[name] = value if eq else (None if nxt.startswith("--") else nxt)
    return out


def pods() -> list[dict[str, str | None]]:
    docs: list[Any] = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    return [flags(d["spec"]["template"]["spec"]["containers"][0]["args"])
            for d in docs if d["kind"] == "Deployment"]


def test_the_example_runs_vllm_as_the_tier_does() -> None:
    tier = flags(serve_args(Path("model"), 8000, 5557, 5558, nixl=True))
    shared = {k: v for k, v in tier.items() if k not in TIER_ONLY}
    assert {"--enable-prefix-caching", "--block-size", "--prefix-caching-hash-algo",
            "--enable-prompt-tokens-details", *JSON_FLAGS} <= shared.keys()
    (prefill, decode) = pods()
    for pod in (prefill, decode):
        assert pod.keys() - {"--port"} == shared.keys()
        for k, v in shared.items():
            if k in JSON_FLAGS:
                mine, theirs = json.loads(pod[k] or "{}"), json.loads(v or "{}")
                # where the sockets are, and (the CPU build's) KV buffer, are the tier's own
                common = theirs.keys() - {"endpoint", "replay_endpoint", "kv_buffer_device"}
                assert {c: mine.get(c) for c in common} == {c: theirs[c] for c in common}, k
            else:
                assert pod[k] == v, k


def test_the_routers_block_size_is_the_engines() -> None:
    comment = re.search(r"blockSize: (\d+)", EXAMPLE.read_text())
    assert comment is not None
    assert {int(comment[1])} == {int(p["--block-size"] or 0) for p in pods()} == {BLOCK_SIZE}
