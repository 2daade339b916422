"""The router benchmark on real engines, without them: sessions sized in
a model's own tokens fit its length, the KV-pressure workload overfills
both servers' caches, the same seed makes the same sessions, a missing
peer is named with its remedy, bad choices are one line, and the summary
counts the seeds where ours was level with the best peer."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from bench import engine_bench
from bench.engine_bench import (
    FIT,
    KV_PRESSURE,
    KV_TOKENS,
    N_ENGINES,
    PRECISE,
    SYSTEM_CAP,
    EngineRow,
    Fit,
    against_peers,
    missing,
    precise_profile,
    sessions,
)
from bench.router_bench import main
from bench.workloads import text_tokens
from toposerve.router.config import ProfileConfig

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def fit(tmp_path_factory: pytest.TempPathFactory) -> Fit:
    """A byte-level BPE trained on the workloads' own filler, as the tiny
    model's is on other text: a few hundred merges."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator([text_tokens(2000, i) for i in range(5)], trainers.BpeTrainer(
        vocab_size=400, show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    out = tmp_path_factory.mktemp("tok")
    tok.save(str(out / "tokenizer.json"))
    return Fit(out)


def test_every_prompt_and_its_answer_fit_the_model(fit: Fit) -> None:
    for wl in ("agentic", "kv-pressure"):
        for s in sessions(fit, wl, 8, 4, seed=3):
            assert fit.tokens(s.system) <= SYSTEM_CAP
            # no empty message (the Rust routers refuse one; vLLM would not)
            assert all(size >= 1 for t in s.turns for sizes in t.subagents for size in sizes)
            used = fit.tokens(s.system)
            for k, t in enumerate(s.turns):
                used += fit.tokens(text_tokens(t.user_tokens, f"user-{s.sid}-{k}"))
                assert used + t.max_tokens <= FIT
                used += t.max_tokens


def test_kv_pressure_overfills_both_caches_and_a_seed_repeats(fit: Fit) -> None:
    pressure = sessions(fit, "kv-pressure", 8, 4, seed=0)
    total = sum(fit.working_set(s) for s in pressure)
    assert KV_PRESSURE * N_ENGINES * KV_TOKENS <= total < 1.5 * KV_PRESSURE * N_ENGINES * KV_TOKENS
    assert sessions(fit, "kv-pressure", 8, 4, seed=0) == pressure
    assert sessions(fit, "kv-pressure", 8, 4, seed=1) != pressure
    agentic = sessions(fit, "agentic", 5, 4, seed=0)
    assert len(agentic) == 5 and all(s.turns for s in agentic)
    # answers of the simulator's size, not the prompts' hundredfold shrink
    assert max(t.max_tokens for s in agentic for t in s.turns) > 8


def test_a_missing_peer_is_named_with_make_peers(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(engine_bench, "PEERS", tmp_path / ".venv-peers" / "bin")
    (tmp_path / ".venv-peers" / "bin").mkdir(parents=True)
    (tmp_path / ".venv-peers" / "bin" / "smg").touch()
    assert missing(PRECISE) is None and missing("smg cache_aware") is None
    why = missing("round-robin")
    assert why is not None and "vllm-router" in why and "make peers" in why


def test_a_router_or_workload_the_mode_lacks_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--engine", "vllm", "--routers", "toposerve[prefix only]",
                 "--out", str(tmp_path)]) == 2
    assert main(["--engine", "vllm", "--workloads", "mooncake", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2
    assert err[0].startswith("error: --routers: toposerve[prefix only] not run on real engines")
    assert err[1].startswith("error: --workloads: mooncake not run on real engines")
    assert not list(tmp_path.iterdir())


def _row(router: str, seed: int, hit: float, p50: float, p99: float) -> EngineRow:
    return EngineRow(workload="agentic", router=router, seed=seed, sessions=8, requests=10,
                     failed=0, hit_rate=hit, cached_share=hit, ttft_p50_ms=p50,
                     ttft_p99_ms=p99, engine_ttft_ms=1.0, outside_engine_ms=1.0,
                     throughput_rps=1.0, tokens_per_s=1.0,
                     max_over_mean_load=1.0, router_cpu_ms_per_request=1.0)


def test_seeds_where_ours_is_level_with_the_best_peer() -> None:
    runs = [_row(PRECISE, 0, 0.7, 50, 200), _row("smg cache_aware", 0, 0.6, 60, 150),
            _row("round-robin", 0, 0.4, 40, 300),
            _row(PRECISE, 1, 0.7, 50, 200), _row("smg cache_aware", 1, 0.7, 50, 250),
            _row("toposerve[approx]", 1, 0.9, 10, 10)]  # ours too: not a peer
    (line,) = against_peers(runs).splitlines()[2:]
    assert line == "| agentic | 2 | 2/2 | 1/2 | 1/2 |"


def test_ours_on_engines_is_the_default_profile_reading_the_events() -> None:
    shipped = [(s.type, s.weight) for s in ProfileConfig().scorers]
    ours = [(s["type"], s["weight"]) for s in precise_profile()["scorers"]]
    assert ("prefix-approx", 4.0) in shipped
    assert ours == [("prefix-precise", w) if t == "prefix-approx" else (t, w)
                    for t, w in shipped]
