"""The Mooncake replay's arrival times: a coarse clock's ticks spread out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.workloads import mooncake, spread_ticks

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


def test_a_ticks_requests_are_spaced_evenly_until_the_next_tick() -> None:
    # three at 0 over a 3,000 ms tick, one alone at 3,000 (to the next tick
    # at 6,000), two at 6,000 over a last tick as wide as the one before
    got = spread_ticks([0, 0, 0, 3000, 6000, 6000])
    assert got == pytest.approx([0, 1000, 2000, 3000, 6000, 7500])


def test_spreading_keeps_the_order_and_never_moves_a_request_earlier() -> None:
    stamps = [0.0, 0, 3000, 3000, 3000, 3000, 5999, 9000, 9000, 9000]
    got = spread_ticks(stamps)
    assert got == sorted(got)
    assert all(g >= s for g, s in zip(got, stamps, strict=True))
    ticks = [*sorted(set(stamps)), 12_000]  # the last tick is as wide as the one before
    assert all(g < ticks[ticks.index(s) + 1] for g, s in zip(got, stamps, strict=True))
    assert spread_ticks([]) == [] and spread_ticks([5.0]) == [5.0]


def test_mooncake_replay_spreads_only_when_asked(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": t, "input_length": 600,
                                         "output_length": 10, "hash_ids": [i, i + 1]}) + "\n"
                             for i, t in enumerate([0, 0, 3000, 3000])))
    ticked = mooncake(trace, limit=4, time_compression=10.0)
    spread = mooncake(trace, limit=4, time_compression=10.0, spread=True)
    assert [r.at_s for r in ticked] == [0, 0, 0.3, 0.3]
    assert [r.at_s for r in spread] == pytest.approx([0, 0.15, 0.3, 0.45])
    assert [r.prompt for r in spread] == [r.prompt for r in ticked]
