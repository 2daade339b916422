"""bench.overload_bench's arithmetic and outputs, from made-up outcomes."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.overload_bench import Outcome, TurnRow, plot, row, table, turn_table

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


def _outs(name: str, ttfts_ms: list[float], status: int = 200) -> list[Outcome]:
    return [Outcome(name, status, t / 1000, t / 1000) for t in ttfts_ms]


def test_row_ratio_goodput_and_counts(tmp_path: Path) -> None:
    base = _outs("critical", [30, 35, 40])
    over = (_outs("critical", [30, 60, 200]) + _outs("critical", [0], 598)
            + _outs("batch", [500] * 3) + _outs("batch", [1] * 5, 429)
            + _outs("batch", [1], 503))
    r = row("ours", base, over, duration_s=2.0)
    assert (r.ttft_p99_unloaded_ms, r.ttft_p99_ms) == (40, 200) and r.p99_ratio == 5.0
    assert r.goodput_rps == 1.0  # 30 and 60 ms are within 100 ms, over 2 s
    assert (r.critical_failed, r.batch_ok, r.batch_429, r.batch_other) == (1, 3, 5, 1)
    assert "| ours | 35 / 40 | 60 / 200 | 5.00 | 1.0 | 1 | 3 | 5 | 1 |" in table([r])
    turns = [TurnRow("off", 900, 2000, 6.5, 1500, 2500, 0),
             TurnRow("on", 30, 900, 1.1, 1600, 2600, 0)]
    assert "| on | 30 / 900 | 1.10 | 1600 / 2600 | 0 |" in turn_table(turns)
    plot([r], turns, tmp_path / "o.png")
    assert (tmp_path / "o.png").stat().st_size > 0
