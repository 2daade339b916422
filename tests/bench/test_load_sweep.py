"""The load sweep's table: each router against round-robin at the same
load, the model's oracle against the model's round-robin."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench.load_sweep import Point, below, table

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


def _points(c: float, rr: float, ours: float, model_rr: float, oracle: float,
            failed: int = 0) -> list[Point]:
    return [Point(c, 10 * c, "round-robin", rr, 4 * rr, 0.4),
            Point(c, 10 * c, "toposerve", ours, 4 * ours, 0.99, failed),
            Point(c, 10 * c, "model: round-robin", model_rr, 4 * model_rr),
            Point(c, 10 * c, "model: least-ttft", oracle, 4 * oracle)]


def test_below_round_robin_at_the_same_load() -> None:
    pts = _points(8, 100, 25, 90, 45) + _points(16, 400, 40, 300, 60)
    assert below(pts, 8, "toposerve") == 0.75
    assert math.isclose(below(pts, 16, "toposerve"), 0.9)
    assert below(pts, 16, "model: least-ttft", "model: round-robin") == 0.8
    assert math.isnan(below(pts, 8, "sglang-router cache_aware"))  # not run


def test_table_rows_per_load() -> None:
    md = table(_points(8, 100, 25, 90, 45) + _points(16, 400, 40, 300, 60, failed=2))
    lines = md.splitlines()
    assert lines[0] == ("| compression | offered req/s | round-robin p50 / p99 ms | "
                        "toposerve p50 / p99 ms | toposerve p50 below round-robin | "
                        "model: round-robin p50 ms | model: oracle p50 ms | "
                        "model: oracle p50 below round-robin | failed |")
    assert lines[2] == "| x8 | 80.0 | 100 / 400 | 25 / 100 | 75% | 90 | 45 | 50% | 0 |"
    assert lines[3] == "| x16 | 160.0 | 400 / 1600 | 40 / 160 | 90% | 300 | 60 | 80% | 2 |"


def _trace(path: Path) -> Path:
    """A small trace in the Mooncake format: 120 requests, three a second,
    conversations of up to four turns whose prompts extend each other."""
    with path.open("w") as f:
        for i in range(120):
            conv, turn = divmod(i, 4)
            ids = [1000 * conv + k for k in range(2 + 2 * turn)]
            f.write(json.dumps({"timestamp": 333 * i, "input_length": 512 * len(ids),
                                "output_length": 40, "hash_ids": ids}) + "\n")
    return path


def test_model_only_sweep_writes_its_outputs(tmp_path: Path) -> None:
    """The model alone over a small trace. Round-robin places the requests
    alike at any load, so compressing their arrivals can only lengthen its
    queues (Lindley's recursion): at x1 they never meet (prefills of 5-22
    ms, 333 ms apart), at x200 (1.7 ms apart) they queue."""
    from bench.load_sweep import main

    trace = _trace(tmp_path / "trace.jsonl")
    assert main(["--model-only", "--compressions", "1", "200", "--trace", str(trace),
                 "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "load_sweep.json").read_text())
    p50 = {(p["compression"], p["router"]): p["ttft_p50_ms"] for p in doc["points"]}
    assert set(p50) == {(c, f"model: {m}") for c in (1, 200) for m in ("round-robin",
                                                                       "least-ttft")}
    assert p50[200, "model: round-robin"] > 2 * p50[1, "model: round-robin"]
    assert (tmp_path / "load_sweep.png").stat().st_size > 0
