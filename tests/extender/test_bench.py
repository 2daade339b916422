"""The extender benchmark's own arithmetic: the mix it submits and the
call quantiles it reads from the extender's histogram."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from bench.extender_bench import _latency_extender, call_quantiles, mix, plot
from toposerve.scheduler_ext.metrics import Metrics


def test_call_quantiles_are_the_buckets_that_hold_them() -> None:
    m = Metrics()
    for seconds in [0.0004] * 60 + [0.0025] * 39 + [0.006]:  # 100 filter calls
        m.latency.labels("filter").observe(seconds)
    m.latency.labels("prioritize").observe(0.5)
    p50, p99, top = call_quantiles(generate_latest(m.registry).decode(), "filter",
                                   (0.5, 0.99, 1.0))
    assert (p50, p99, top) == (0.0005, 0.003, 0.0075)
    assert call_quantiles("", "filter", (0.5,)) != call_quantiles("", "filter", (0.5,))  # nan


def test_the_mix_repeats_its_groups_within_seven_eighths_of_the_racks() -> None:
    four = mix(4, 4)
    assert [g.pods for g in four if not g.roles] == [18, 9, 9, 12, 6, 9]  # 63 of 72 trays
    assert sum(1 for g in four if g.roles) == 4
    many = mix(270, 0, ep_groups=40)
    assert len(many) == 40 and sum(g.pods for g in many) <= 270 * 18 * 7 // 8
    assert len({g.name for g in many}) == 40


def test_the_picture_draws_the_schedulers_that_ran(tmp_path: Path) -> None:
    landed = {"default": {}, "default/gpus": {"gb200-nvl72-b0-r0": {"ep-0": 36, "ep-1": 8}},
              "toposerve": {}, "toposerve/gpus": {"gb200-nvl72-b0-r1": {"ep-0": 72}}}
    plot(landed, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 0


def test_the_pd_rows_first_calls_each_decide_a_slice_and_the_rest_are_held_members() -> None:
    import orjson

    from bench.extender_bench import PD_SLICES, _requests

    ext = _latency_extender(200, "hgx-h100")  # 1,600 GPUs: the 100 slices' 16 each fit
    reqs = _requests(200, PD_SLICES + 8, "hgx-h100")["pd-slice"]
    decided = []
    for r in reqs:
        _, answer, _ = ext.answer("filter", orjson.dumps(r))
        assert orjson.loads(answer)["NodeNames"], r["Pod"]["metadata"]["name"]
        decided.append(len(ext.state.snapshot().decisions))
    assert decided[:PD_SLICES] == list(range(1, PD_SLICES + 1))  # one more each call
    assert decided[PD_SLICES:] == [PD_SLICES] * 8  # second members: held, none new
    assert {r["Pod"]["metadata"]["name"] for r in reqs[PD_SLICES:]} == \
        {f"pd-{i}-1" for i in range(8)}


def test_the_churn_events_join_leave_and_move_a_node() -> None:
    from bench.extender_churn import _event
    from harness import extender_objects as k
    from toposerve.topology.model import Tier

    ext = _latency_extender(40, "hgx-h100")
    view = ext.state.snapshot()
    names = sorted(view.nodes)
    last, moved = names[-1], names[-2]
    rack = view.nodes[moved].domain(Tier.RACK)
    planned = k.planned(("hgx-h100", 41))
    _event(ext, "join", 0, planned, 40)
    _event(ext, "leave", 0, planned, 40)
    _event(ext, "relabel", 1, planned, 40)
    view = ext.state.snapshot()
    assert len(view.nodes) == 40 and last not in view.nodes  # one came, one went
    assert view.nodes[moved].domain(Tier.RACK) not in (None, rack)
    assert moved in view.in_domain(Tier.RACK, view.nodes[moved].domain(Tier.RACK) or ())


def test_churn_refuses_too_few_nodes_for_its_slices_and_events(
        capsys: pytest.CaptureFixture[str]) -> None:
    from bench.extender_churn import main

    with pytest.raises(SystemExit) as exit_:
        main(["--nodes", "100", "--events", "40"])
    assert exit_.value.code == 2
    assert "--nodes 100: with --events 40, at least 328" in capsys.readouterr().err
