"""The router benchmark's per-seed report: every run, and on how many seeds
ours was ahead of every peer in the same run."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.router_bench import Row, order, per_seed, plot_seeds

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


def _row(router: str, seed: int, p50: float, p99: float, workload: str = "agentic") -> Row:
    return Row(workload=workload, router=router, requests=10, failed=0, hit_rate=0.9,
               captured=1.0, ttft_p50_ms=p50, ttft_p99_ms=p99, outside_engine_ms=2.0,
               floor_p50_ms=1.0, floor_p99_ms=2.0, throughput_rps=1.0,
               max_over_mean_load=1.1, max_over_mean_work=1.2, cpu_ms_per_request=3.0,
               seed=seed)


def test_per_seed_counts_seeds_ahead_of_the_best_peer() -> None:
    runs = [_row("toposerve", 0, 10, 100), _row("peer-a", 0, 12, 90), _row("peer-b", 0, 11, 200),
            _row("toposerve", 1, 10, 100), _row("peer-a", 1, 9, 120), _row("peer-b", 1, 20, 300),
            # an ablation of ours is no peer, however it does
            _row("toposerve[x]", 1, 1, 1)]
    md = per_seed(runs)
    assert "| agentic | 0 | peer-b | 11.0 | 200 | 90.0% | 100.0% | 3.00 |" in md
    # seed 0: p50 ahead (10 < 11), p99 not (100 > 90); seed 1: p50 not, p99 ahead
    assert "| agentic | 2 | 1/2 | 1/2 | 0.91 1.11 | 1.11 0.83 |" in md


def test_per_seed_skips_a_workload_without_ours() -> None:
    md = per_seed([_row("peer-a", 0, 12, 90, "mooncake")])
    assert "| mooncake | 0 | peer-a |" in md
    assert "| mooncake | 1 |" not in md.split("ours ahead")[1]


def test_router_order_rotates_each_repeat() -> None:
    names = ["a", "b", "c"]
    assert [order(names, r) for r in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


def test_seed_plot_is_drawn(tmp_path: Path) -> None:
    path = tmp_path / "router_bench_seeds.png"
    plot_seeds([_row("toposerve", 0, 10, 100), _row("peer-a", 0, 12, 90),
                _row("toposerve", 1, 10, 100)], path)
    assert path.stat().st_size > 1000
