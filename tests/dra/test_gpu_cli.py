"""``toposerve driver gpu``: bad input and a corrupt checkpoint end in one
clear line and exit code 2, before anything is served."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from toposerve.driver_cmd import main
from toposerve.topology.profiles import load_profile
from toposerve.topology.sysfs import write_profile_sysfs


def _kubeconfig(tmp: Path) -> Path:
    # Never dialled: everything here fails before the first API call.
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "x",
           "clusters": [{"name": "x", "cluster": {"server": "https://127.0.0.1:1"}}],
           "users": [{"name": "x", "user": {"token": "t"}}],
           "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}]}
    path = tmp / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["--log-level", "error", "driver", "gpu", *argv])
    return rc, capsys.readouterr().err


def test_no_node_name(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
                      tmp_path: Path) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    rc, err = _run(["--node-name", ""], capsys)
    assert rc == 2 and err.strip() == "error: --node-name is required (or set NODE_NAME)"


def test_not_a_sysfs(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc, err = _run(["--node-name", "n1", "--sysfs-root", str(tmp_path)], capsys)
    assert rc == 2 and err.strip() == f"error: --sysfs-root {tmp_path}: no bus/pci/devices there"


def test_corrupt_checkpoint(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    sysfs = write_profile_sysfs(load_profile("hgx-h100"), tmp_path / "sysfs")
    plugin = tmp_path / "plugin"
    plugin.mkdir()
    (plugin / "checkpoint.json").write_text('{"version": 1, "checksum": "x", "data": {}}')
    rc, err = _run(["--node-name", "n1", "--sysfs-root", str(sysfs), "--kubeconfig",
                    str(_kubeconfig(tmp_path)), "--plugin-dir", str(plugin),
                    "--registry-dir", str(tmp_path / "registry"),
                    "--cdi-root", str(tmp_path / "cdi"), "--http-address", "127.0.0.1:0"], capsys)
    assert rc == 2
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"error: checkpoint {plugin / 'checkpoint.json'} is corrupt")
    assert "move it aside" in line
    assert not list((tmp_path / "registry").glob("*.sock"))
