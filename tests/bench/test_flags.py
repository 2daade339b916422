"""The benchmarks' command lines refuse values that make no sense (0
clients, a negative duration, a CPU this process may not use, a port out
of range) with argparse's one-line error naming the flag and exit 2,
before anything starts: before these types, ``--concurrency 0`` hung,
``--fleets 0`` raised IndexError and ``--router-cpu 7`` an OSError."""

from __future__ import annotations

import argparse
import importlib
import os

import pytest

from bench.flags import at_least, count, count_or_zero, cpu, positive, tcp_port

pytestmark = pytest.mark.unit


def test_counts_take_whole_numbers_at_their_least_and_above() -> None:
    assert count("1") == 1 and count("64") == 64 and count_or_zero("0") == 0
    assert at_least(3)("3") == 3
    for bad, why in (("0", "under 1"), ("-2", "under 1"), ("1.5", "not a whole number"),
                     ("ten", "not a whole number")):
        with pytest.raises(argparse.ArgumentTypeError, match=why):
            count(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="under 0"):
        count_or_zero("-1")


def test_positive_takes_finite_numbers_above_zero() -> None:
    assert positive("0.5") == 0.5 and positive("20") == 20.0
    for bad in ("0", "-1", "nan", "inf", "-inf", "soon"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive(bad)


def test_ports_and_cpus() -> None:
    assert tcp_port("1") == 1 and tcp_port("65535") == 65535
    for bad in ("0", "65536", "-80", "http"):
        with pytest.raises(argparse.ArgumentTypeError):
            tcp_port(bad)
    mine = sorted(os.sched_getaffinity(0))
    assert cpu(str(mine[0])) == mine[0]
    with pytest.raises(argparse.ArgumentTypeError, match="not one this process may use"):
        cpu(str(max(mine) + 1))


# (module, argv, the flag the error must name): one bad value per kind of
# flag in every benchmark that takes one
BAD = [
    ("router_overhead", ["--concurrency", "0"], "--concurrency"),
    ("router_overhead", ["--fleets", "0"], "--fleets"),
    ("router_overhead", ["--requests", "-5"], "--requests"),
    ("router_overhead", ["--router-cpu", "4096"], "--router-cpu"),
    ("router_bench", ["--repeats", "0"], "--repeats"),
    ("router_bench", ["--sessions", "many"], "--sessions"),
    ("load_sweep", ["--compressions", "20", "0"], "--compressions"),
    ("load_sweep", ["--requests", "0"], "--requests"),
    ("abuse_bench", ["--seconds", "-1"], "--seconds"),
    ("cluster_up", ["--nodes", "0"], "--nodes"),
    ("dra_prepare", ["--claims", "0"], "--claims"),
    ("dra_publish", ["--steady", "nan"], "--steady"),
    ("dra_sched", ["--measure-pods", "0"], "--measure-pods"),
    ("dra_sched", ["--qps", "-1"], "--qps"),
    ("extender_bench", ["--calls", "0"], "--calls"),
    ("extender_bench", ["--timeout", "0"], "--timeout"),
    ("extender_churn", ["--events", "0"], "--events"),
    ("share_cost", ["--requests", "0"], "--requests"),
    ("extender_churn", ["--nodes", "1000", "0"], "--nodes"),
    ("net_discovery", ["--nics", "8", "0"], "--nics"),
    ("net_handoff", ["--pods", "0"], "--pods"),
    ("net_handoff_realnode", ["--wait", "-3"], "--wait"),
    ("realnode_prepare", ["--pods", "-1"], "--pods"),
    ("pd_bench", ["--repeats", "0"], "--repeats"),
    ("router_cpu", ["--rounds", "0"], "--rounds"),
    ("null_backend", ["--ports", "0"], "--ports"),
    ("front_end", ["aiohttp", "70000"], "port"),
    ("http_stack", ["serve", "--stack", "aiohttp", "--port", "99999", "--upstream", "x"],
     "--port"),
]


@pytest.mark.parametrize(("module", "argv", "flag"), BAD, ids=[f"{m} {' '.join(a)}"
                                                                for m, a, _ in BAD])
def test_a_bad_value_is_one_usage_error_naming_the_flag(
        module: str, argv: list[str], flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    main = importlib.import_module(f"bench.{module}").main
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith(f"python -m bench.{module}")
             and "error: argument" in line]
    assert len(lines) == 1, err
    assert f"argument {flag}" in lines[0] and "Traceback" not in err
