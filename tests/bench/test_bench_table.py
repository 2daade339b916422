"""The benchmark's aggregation: medians over repeats, failures summed."""

from __future__ import annotations

import pytest

from bench.report import medians
from bench.router_bench import Row, floors, table

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


def _row(router: str, p50: float, failed: int) -> Row:
    return Row(workload="agentic", router=router, requests=10, failed=failed, hit_rate=0.5,
               captured=0.9, ttft_p50_ms=p50, ttft_p99_ms=p50 * 10, outside_engine_ms=2.0,
               floor_p50_ms=p50 / 4, floor_p99_ms=p50, throughput_rps=1.0,
               max_over_mean_load=1.1, max_over_mean_work=1.2, cpu_ms_per_request=3.0)


def test_medians_per_router() -> None:
    runs = [_row("a", 10, 0), _row("b", 50, 1), _row("a", 30, 1), _row("a", 20, 0)]
    rows = {r.router: r for r in medians(runs, ("workload", "router"))}
    assert rows["a"].ttft_p50_ms == 20 and rows["a"].ttft_p99_ms == 200
    assert rows["a"].failed == 1 and rows["a"].requests == 30
    assert rows["b"].ttft_p50_ms == 50 and rows["b"].failed == 1
    md = table(list(rows.values()), {"a": {"added_p50_ms": 1.5, "added_ttft_p50_ms": 0.7,
                                           "big_prompt_cpu_ms": 4.2, "idle_cpu_ms_per_s": 6.5}})
    assert "| agentic | a | 50.0% | 90.0% | 20 | 200 | 2.0 |" in md
    assert "| 1.50 | 0.70 | 4.2 | 6.5 | 1 |" in md
    assert "| nan | nan | nan | nan | 1 |" in md  # b: no overhead run


def test_floor_table_against_round_robin() -> None:
    rows = [_row("round-robin", 100, 0), _row("ours", 20, 0)]
    # floors 25 and 5 ms (p50 / 4): their median 15 is 85% below round-robin's 100
    assert "| agentic | 15 | 60 | 100 | 85% | | | |" in floors(rows, {})
    models = {"agentic": {"round-robin": {"p50_ms": 80.0, "p99_ms": 900.0},
                          "least-ttft": {"p50_ms": 40.0, "p99_ms": 400.0}}}
    assert "| agentic | 15 | 60 | 100 | 85% | 80 | 40 / 400 | 50% |" in floors(rows, models)
    # without round-robin in the run (--routers): those two cells blank, not nan
    assert "| agentic | 5 | 20 | | | | | |" in floors([_row("ours", 20, 0)], {})


def test_pd_table_compares_within_a_hand_over() -> None:
    from bench.pd_bench import Row as PDRow
    from bench.pd_bench import table as pd_table

    def row(protocol: str, name: str, pull_ms: float, p50: float) -> PDRow:
        return PDRow(protocol=protocol, router=name, requests=10, failed=0, ttft_p50_ms=p50,
                     ttft_p99_ms=4 * p50, tpot_p50_ms=20.0, e2e_p50_ms=2 * p50,
                     in_domain=0.5,
                     pulled_mb_per_request=900, pull_ms_per_request=pull_ms,
                     pull_share_of_ttft=0.01, prefill_hit_rate=0.2)

    md = pd_table([row("nixl", "ours", 0.5, 100), row("nixl", "blind", 2.0, 110),
                   row("sglang", "ours-s", 1.0, 100), row("sglang", "peer", 3.0, 150)])
    assert "| nixl | ours | 100 | 400 | 20.0 | 200 | 50% | 900 | 0.50 | 1.0% | 20.0% | 0 |" in md
    assert "nixl, against ours: blind pulls 4.0x as long, TTFT p50 x1.10" in md
    assert "sglang, against ours-s: peer pulls 3.0x as long, TTFT p50 x1.50" in md


def test_dra_sched_table_compares_each_variant_with_its_plain_pods_and_the_first() -> None:
    from bench import dra_sched

    def row(variant: str, mode: str, rate: float) -> dict[str, object]:
        return {"variant": variant, "what": variant, "mode": mode, "measured_pods": 100,
                "init_pods": 100, "seconds": 100 / rate, "pods_per_s": rate,
                "client_qps": 1000}

    md = dra_sched.table([row("whole-gpus", "plain", 200), row("whole-gpus", "claims", 10),
                          row("gpu-driver", "plain", 100), row("gpu-driver", "claims", 25)])
    lines = md.splitlines()
    assert "claims / whole-gpus claims" in lines[0]
    assert "| 0.05x | 1.00x |" in lines[3] and "| 0.25x | 2.50x |" in lines[5]
    assert lines[2].count("x |") == 0  # a plain row has no ratios
