"""Issue 45's figures: the routers core for core (bench.router_overhead
--cores) against the best Rust router, and ours active-active behind a
front (bench.router_bench --replicas) against one replica."""

from __future__ import annotations

import dataclasses

import pytest

from bench import router_bench
from bench.router_bench import OURS, replica_name, replica_table
from bench.router_overhead import DIRECT, Row, cores_table
from bench.router_overhead import main as overhead_main
from tests.bench.test_bench_table import _row as bench_row
from tests.bench.test_router_overhead import _row

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


def _at(router: str, cores: int, p50: float, p99: float, rps: float) -> Row:
    return dataclasses.replace(_row(router, 4, 512, 1.0, 0.2), cores=cores, added_p50_ms=p50,
                               added_p99_ms=p99, rps=rps)


def test_each_ratio_is_to_the_best_rust_router_at_the_same_cores_and_clients() -> None:
    rows = [_at(DIRECT, 2, 0, 0, 9000), _at(OURS, 2, 1.0, 8.0, 3000),
            _at("smg cache_aware", 2, 0.5, 10.0, 2000),
            _at("vllm-router cache_aware", 2, 2.0, 4.0, 1000),
            _at(OURS, 1, 3.0, 30.0, 500), _at("smg cache_aware", 1, 1.0, 10.0, 1000)]
    md = cores_table(rows)
    # best p50 is smg's, best p99 vllm-router's, best rate smg's: each its own
    assert "| toposerve | 2 | 512 | 1.000 | 8.00 | 3000 | 2.00 | 2.00 | 1.50 |" in md
    assert "| vllm-router cache_aware | 2 | 512 | 2.000 | 4.00 | 1000 | 4.00 | 1.00 | 0.50 |" in md
    # one core against one core only
    assert "| toposerve | 1 | 512 | 3.000 | 30.00 | 500 | 3.00 | 3.00 | 0.50 |" in md
    assert "| direct |" not in md


def test_replicas_are_held_to_one_replica_in_points_and_ratios() -> None:
    def rep(n: int, hit: float, p50: float) -> router_bench.Row:
        return dataclasses.replace(bench_row(replica_name(n), p50, 0), hit_rate=hit)

    md = replica_table([rep(1, 0.80, 100), rep(2, 0.79, 110), rep(4, 0.75, 90)], [1, 2, 4])
    assert "| agentic | 2 | 79.0% | -1.0 | 110 | 1100 | 1.10 | 1.10 |" in md
    assert "| agentic | 4 | 75.0% | -5.0 | 90 | 900 | 0.90 | 0.90 |" in md


def test_more_cores_than_router_cpus_is_one_error_naming_the_flag(
        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        overhead_main(["--cores", "1", "3", "--router-cpu", "0"])
    assert exc.value.code == 2
    assert "--cores 3 needs as many --router-cpu, not 1" in capsys.readouterr().err

