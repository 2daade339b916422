"""``toposerve driver net``: bad input ends in one clear line and exit code 2,
before anything is served."""

from __future__ import annotations

from pathlib import Path

import pytest

from toposerve.driver_cmd import main
from toposerve.topology.profiles import load_profile
from toposerve.topology.sysfs import write_profile_sysfs


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["--log-level", "error", "driver", "net", *argv])
    return rc, capsys.readouterr().err


def test_no_node_name(capsys: pytest.CaptureFixture[str],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    rc, err = _run([], capsys)
    assert rc == 2 and err.strip() == "error: --node-name is required (or set NODE_NAME)"


def test_not_a_sysfs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, err = _run(["--node-name", "n1", "--sysfs-root", str(tmp_path)], capsys)
    assert rc == 2 and err.strip() == f"error: --sysfs-root {tmp_path}: no bus/pci/devices there"


@pytest.mark.parametrize("flag", ["--interfaces", "--exclude-interfaces"])
def test_bad_filter(capsys: pytest.CaptureFixture[str], tmp_path: Path, flag: str) -> None:
    sysfs = write_profile_sysfs(load_profile("mi300x"), tmp_path / "sys")
    rc, err = _run(["--node-name", "n1", "--sysfs-root", str(sysfs), flag, "ens("], capsys)
    assert rc == 2
    assert err.strip().startswith(f"error: {flag} 'ens(': not a regular expression: "), err
    assert "\n" not in err.strip()


@pytest.mark.parametrize("seconds", ["-1", "7200"])
def test_binding_failure_after_out_of_range(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            seconds: str) -> None:
    sysfs = write_profile_sysfs(load_profile("mi300x"), tmp_path / "sys")
    rc, err = _run(["--node-name", "n1", "--sysfs-root", str(sysfs), "--binding-conditions",
                    "--binding-failure-after", seconds], capsys)
    assert rc == 2 and err.strip() == (
        f"error: --binding-failure-after {float(seconds):g}: give 0 to 3600 seconds, under "
        "the scheduler's binding timeout (600 by default)")
