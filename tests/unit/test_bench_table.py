"""The benchmark's aggregation: medians over repeats, failures summed."""

from __future__ import annotations

from bench.router_bench import Row, floors, medians, table


def _row(router: str, p50: float, failed: int) -> Row:
    return Row(workload="agentic", router=router, requests=10, failed=failed, hit_rate=0.5,
               captured=0.9, ttft_p50_ms=p50, ttft_p99_ms=p50 * 10, outside_engine_ms=2.0,
               floor_p50_ms=p50 / 4, floor_p99_ms=p50, throughput_rps=1.0,
               max_over_mean_load=1.1, max_over_mean_work=1.2, cpu_ms_per_request=3.0)


def test_medians_per_router() -> None:
    runs = [_row("a", 10, 0), _row("b", 50, 1), _row("a", 30, 1), _row("a", 20, 0)]
    rows = {r.router: r for r in medians(runs)}
    assert rows["a"].ttft_p50_ms == 20 and rows["a"].ttft_p99_ms == 200
    assert rows["a"].failed == 1 and rows["a"].requests == 30
    assert rows["b"].ttft_p50_ms == 50 and rows["b"].failed == 1
    md = table(list(rows.values()), {"a": {"added_p50_ms": 1.5, "big_prompt_cpu_ms": 4.2}})
    assert "| agentic | a | 50.0% | 90.0% | 20 | 200 | 2.0 |" in md and "| 4.2 |" in md


def test_floor_table_against_round_robin() -> None:
    rows = [_row("round-robin", 100, 0), _row("ours", 20, 0)]
    # floors 25 and 5 ms (p50 / 4): their median 15 is 85% below round-robin's 100
    assert "| agentic | 15 | 60 | 100 | 85% |" in floors(rows)
