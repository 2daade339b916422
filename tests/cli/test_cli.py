"""The command line: bad input gets one clear line and a non-zero exit,
without touching any cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toposerve.main import main

pytestmark = pytest.mark.unit  # no cluster, no subprocess: `make unit`


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.mark.parametrize("argv, message", [
    (["cluster", "up", "--profile", "h100=2"], "unknown profile 'h100'"),
    (["cluster", "up", "--profile", "hgx-h100=0"], "must be > 0, got 0"),
    (["cluster", "up", "--profile", "hgx-h100", "--nodes", "-3"], "must be > 0, got -3"),
    (["cluster", "up", "--profile", "hgx-h100"], "give --nodes N or write hgx-h100=N"),
    (["cluster", "up", "--profile", "hgx-h100=x"], "COUNT must be a whole number"),
    (["cluster", "up", "--name", "Bad_Name", "--profile", "hgx-h100=1"], "--name 'Bad_Name'"),
    (["cluster", "up", "--profile", "hgx-h100=1", "--scheduler-config", "/nonexistent.yaml"],
     "no such file"),
])
def test_cluster_up_bad_input(argv: list[str], message: str,
                              capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(argv, capsys)
    assert rc == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1


def test_missing_tools_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("TOPOSERVE_CACHE", str(tmp_path))
    monkeypatch.setenv("TOPOSERVE_HOME", str(tmp_path / "home"))
    rc, _, err = run(["cluster", "up", "--profile", "hgx-h100=1"], capsys)
    assert rc == 2 and "cluster tools missing" in err and "make setup" in err
    assert not (tmp_path / "home").exists()


def test_fake_sysfs_then_discover(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["topology", "fake-sysfs", "--profile", "gb200-nvl72",
                      "--out", str(tmp_path / "sys")], capsys)
    assert rc == 0 and out.strip() == str(tmp_path / "sys")
    rc, out, _ = run(["topology", "discover", "--sysfs", str(tmp_path / "sys")], capsys)
    assert rc == 0
    hw = json.loads(out)
    gpus = [d for n in hw["numa_nodes"] for r in n["roots"] for s in r["switches"]
            for d in s["devices"] if d["kind"] == "gpu"]
    assert len(gpus) == 4


def test_show_profile_json(capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, _ = run(["topology", "show", "--profile", "hgx-h100", "--json"], capsys)
    doc = json.loads(out)
    assert rc == 0 and len(doc["resourceSliceDevices"]) == 16


def test_show_unknown_profile(capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = run(["topology", "show", "--profile", "nope"], capsys)
    assert rc == 2 and "unknown profile 'nope'" in err
