"""The router benchmark's KV-pressure and uneven-endpoint workloads: their
shape (a working set 2-3x the fleet's caches; one slow simulator) and that
a seed makes the same workload every time; and --sim-cmd starting another
simulator from a template."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import httpx
import pytest

from bench.router_bench import (
    EXTERNAL,
    KV_PRESSURE_SESSIONS,
    KV_PRESSURE_TURNS,
    N_SIMS,
    SIM,
    Row,
    cache_blocks,
    external_sims,
    floors,
    main,
    runnable,
    sim_flags,
    table,
)
from bench.workloads import AgentSession, AgentTurn, agentic, working_set_tokens
from harness.procs import Procs
from toposerve.wire.tokens import BYTES_PER_TOKEN


def _pressure(seed: int) -> list[AgentSession]:
    return agentic(sessions=KV_PRESSURE_SESSIONS, turns=KV_PRESSURE_TURNS, seed=seed)


@pytest.mark.unit
def test_working_set_counts_system_turns_answers_and_subagents() -> None:
    s = AgentSession(sid=0, start_s=0.0, system="x" * (100 * BYTES_PER_TOKEN), turns=[
        AgentTurn(user_tokens=10, max_tokens=5, think_s=0.0),
        AgentTurn(user_tokens=20, max_tokens=7, think_s=1.0, subagents=[[30, 30], [40]])])
    # 100 system, 10 + 5 and 20 + 7 on the main thread, sub-agents' 30 + 8 twice and 40 + 8
    assert working_set_tokens([s]) == 100 + 15 + 27 + 76 + 48
    assert working_set_tokens([s, s]) == 2 * working_set_tokens([s])


@pytest.mark.unit
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kv_pressure_holds_a_working_set_two_to_three_times_the_fleets_cache(seed: int) -> None:
    sessions = _pressure(seed)
    fleet_tokens = N_SIMS * cache_blocks("kv-pressure", sessions) * SIM["block_size"]
    assert 2 <= working_set_tokens(sessions) / fleet_tokens <= 3
    # more live sessions than the agentic workload's, and less cache than its
    assert len(sessions) > 16 and cache_blocks("kv-pressure", sessions) < cache_blocks(
        "agentic", agentic(seed=seed))
    # the largest session's system prompt still fits one simulator's cache
    biggest = max(len(s.system) // BYTES_PER_TOKEN for s in sessions)
    assert biggest < cache_blocks("kv-pressure", sessions) * SIM["block_size"]


@pytest.mark.unit
def test_a_seed_makes_the_same_workload_and_another_seed_another() -> None:
    assert _pressure(1) == _pressure(1)
    assert cache_blocks("kv-pressure", _pressure(1)) == cache_blocks("kv-pressure", _pressure(1))
    assert _pressure(1) != _pressure(2)


@pytest.mark.unit
def test_uneven_slows_exactly_one_simulator() -> None:
    sessions = agentic(sessions=2, turns=2)
    flags = [sim_flags("uneven", sessions, i) for i in range(N_SIMS)]
    slow, *rest = flags
    assert all(f == sim_flags("agentic", sessions, 0) for f in rest)
    assert slow["prefill_s_per_token"] > rest[0]["prefill_s_per_token"]
    assert slow["decode_s_per_token"] > rest[0]["decode_s_per_token"]
    assert slow["max_num_seqs"] < rest[0]["max_num_seqs"]
    # the agentic workload has none
    assert all(sim_flags("agentic", sessions, i) == flags[1] for i in range(N_SIMS))


def test_sim_cmd_starts_one_simulator_a_port_from_its_template(tmp_path: Path) -> None:
    # our own simulator, started as a stranger's would be: a command line
    template = (f"{sys.executable} -m toposerve.main sim --host 127.0.0.1 "
                "--port {port} --model {model} --num-gpu-blocks {blocks} "
                "--block-size {block_size} --time-scale 0.01")
    procs = Procs(tmp_path)
    try:
        sims = external_sims(procs, template, "agentic", agentic(sessions=1, turns=1))
        assert len({s.url for s in sims}) == N_SIMS
        for s in sims:
            assert httpx.get(s.url + "/v1/models").json()["data"][0]["id"] == "toposerve/sim-model"
            assert s.metric("vllm:cache_config_info") == 1
            info = next(x for x in s.samples() if x.name == "vllm:cache_config_info")
            assert info.labels["num_gpu_blocks"] == "6250"
    finally:
        procs.close()


@pytest.mark.unit
def test_another_simulators_runs_show_no_floor_and_no_reuse_captured() -> None:
    row = Row(workload="agentic" + EXTERNAL, router="toposerve", requests=10, failed=0,
              hit_rate=0.8, captured=math.nan, ttft_p50_ms=50, ttft_p99_ms=500,
              outside_engine_ms=5, floor_p50_ms=math.nan, floor_p99_ms=math.nan,
              throughput_rps=1, max_over_mean_load=1, max_over_mean_work=1,
              cpu_ms_per_request=1)
    assert floors([row], {}) == ""
    assert "| agentic (external sim) | toposerve | 80.0% | n/a | 50 | 500 |" in table([row], {})
    ours = Row(**{**row.__dict__, "workload": "agentic", "captured": 1.0, "floor_p50_ms": 4.0,
                  "floor_p99_ms": 9.0})
    assert "| agentic | 4 | 9 |" in floors([row, ours], {})
    assert EXTERNAL not in floors([row, ours], {})


@pytest.mark.unit
def test_workloads_that_cannot_run_are_named_and_none_left_is_one_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
        ) -> None:
    missing = tmp_path / "no-trace.jsonl"
    assert runnable(["mooncake", "uneven", "mooncake", "agentic"], True, missing) == ["agentic"]
    err = capsys.readouterr().err
    assert f"{missing} not found" in err and "skipping the uneven workload" in err
    assert runnable(["uneven"], False, missing) == ["uneven"]
    # every workload skipped: one line and exit 2, not a traceback from the empty table
    monkeypatch.setattr("bench.router_bench.MOONCAKE", missing)
    monkeypatch.setattr("bench.router_bench.peers_missing", lambda: None)
    assert main(["--workloads", "mooncake", "--out", str(tmp_path)]) == 2
    assert "error: no workload left to run" in capsys.readouterr().err
    assert not list(tmp_path.glob("router_bench*"))
