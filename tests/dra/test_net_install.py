"""Installing ``toposerve-nic`` on a node: the conflist edit (pure) and the
files it writes, idempotent and atomic; bad input is one clear line."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from toposerve.dra_driver.net.handoff.install import (
    DEFAULT_PLUGIN,
    RECORD,
    InstallError,
    chained,
    data_dir,
    install,
    plugin_entry,
    unchained,
    uninstall,
)
from toposerve.driver_cmd import main
from toposerve.localcluster.realnode import forwarder

ROOT = Path(__file__).resolve().parents[2]
ENTRY = plugin_entry(Path("/var/lib/kubelet"))


def _kubelet(tmp_path: Path) -> list[str]:
    """The CLI's record of what it changed goes under the kubelet's root: a
    temporary one here, never this machine's."""
    return ["--kubelet-dir", str(tmp_path / "kubelet")]
POD_NET: dict[str, Any] = {"cniVersion": "1.0.0", "name": "k8s-pod-network", "plugins": [
    {"type": "bridge", "bridge": "cni0", "ipam": {"type": "host-local"}},
    {"type": "portmap", "capabilities": {"portMappings": True}}]}


def test_the_entry_is_chained_last_and_nothing_else_changes() -> None:
    out = chained(POD_NET, ENTRY)
    assert out is not None
    assert out["plugins"] == [*POD_NET["plugins"], ENTRY]
    assert {k: v for k, v in out.items() if k != "plugins"} == \
        {k: v for k, v in POD_NET.items() if k != "plugins"}
    assert len(POD_NET["plugins"]) == 2  # the input is not modified
    assert ENTRY == {"type": "toposerve-nic",
                     "stateDir": "/var/lib/kubelet/plugins/net.toposerve.io/handoff",
                     "journalDir": "/var/lib/kubelet/plugins/net.toposerve.io/journal",
                     "serverSocket": "/var/lib/kubelet/plugins/net.toposerve.io/handoff.sock"}


def test_an_entry_already_there_is_left_as_it_is() -> None:
    once = chained(POD_NET, ENTRY)
    assert once is not None and chained(once, ENTRY) is None
    own = {**POD_NET, "plugins": [{"type": "toposerve-nic"}, *POD_NET["plugins"]]}
    assert chained(own, ENTRY) is None  # an operator's own placement is kept


@pytest.mark.parametrize("doc", [{"cniVersion": "1.0.0", "type": "bridge"},
                                 {"plugins": []}, {"plugins": "bridge"}])
def test_not_a_conflist(doc: dict[str, Any]) -> None:
    with pytest.raises(InstallError, match=re.escape('no "plugins" list: give a .conflist file')):
        chained(doc, ENTRY)


def test_install_writes_once_and_keeps_the_files_mode(tmp_path: Path) -> None:
    bin_dir, conf = tmp_path / "bin", tmp_path / "net.d"
    conf.mkdir()
    target = conf / "10-pod.conflist"
    target.write_text(json.dumps(POD_NET))
    target.chmod(0o644)
    plugin = tmp_path / "built"
    plugin.write_bytes(b"\x7fELF stand-in")
    changed = install(bin_dir, plugin, conf, target.name, ENTRY)
    exe = bin_dir / "toposerve-nic"
    assert changed == [str(exe), str(target)]
    assert exe.read_bytes() == plugin.read_bytes()
    assert os.stat(exe).st_mode & 0o777 == 0o755
    assert os.stat(target).st_mode & 0o777 == 0o644
    assert json.loads(target.read_text())["plugins"][-1] == ENTRY
    before = target.read_bytes(), target.stat().st_mtime_ns, exe.stat().st_mtime_ns
    assert install(bin_dir, plugin, conf, target.name, ENTRY) == []
    assert (target.read_bytes(), target.stat().st_mtime_ns, exe.stat().st_mtime_ns) == before
    assert sorted(p.name for p in conf.iterdir()) == [target.name]  # no temp file left


def test_the_cli_installs_the_static_go_forwarder(tmp_path: Path) -> None:
    """The build of this checkout's source (``forwarder``): one static
    executable that needs nothing on the node."""
    built = forwarder.build()
    assert main(["--log-level", "error", "driver", "net-install-cni", "--bin-dir",
                 str(tmp_path), "--plugin", str(built), *_kubelet(tmp_path)]) == 0
    exe = tmp_path / "toposerve-nic"
    assert exe.read_bytes() == built.read_bytes()
    assert exe.read_bytes()[:4] == b"\x7fELF" and b"ld-linux" not in exe.read_bytes()  # static
    out = subprocess.run([str(exe)], env={"CNI_COMMAND": "VERSION"},
                         capture_output=True, text=True, check=True)
    assert json.loads(out.stdout)["supportedVersions"] == ["0.4.0", "1.0.0"]


def test_a_missing_binary_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    rc = main(["--log-level", "error", "driver", "net-install-cni", "--bin-dir",
               str(tmp_path), "--plugin", str(tmp_path / "nope"), *_kubelet(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "\n" not in err
    assert err.startswith(f"error: {tmp_path / 'nope'}: cannot read the toposerve-nic binary")
    assert "make nic-cni" in err


def test_by_default_the_cli_installs_the_images_binary(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The driver takes the binary's path; without ``--plugin`` it is where
    the image has it (no build: that is tooling, ``make nic-cni``)."""
    assert not DEFAULT_PLUGIN.exists()  # not on this machine: the error names it
    rc = main(["--log-level", "error", "driver", "net-install-cni", "--bin-dir",
               str(tmp_path), *_kubelet(tmp_path)])
    assert rc == 2
    assert capsys.readouterr().err.startswith(f"error: {DEFAULT_PLUGIN}: cannot read")


@pytest.mark.parametrize("body, error", [
    (None, "no such conflist yet (the pod network writes it when it starts; this is "
           "retried), or fix netDriver.cni.chainInto"),
    ("{not json", "is not JSON"),
    ('{"type": "bridge"}', 'no "plugins" list'),
])
def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                 body: str | None, error: str) -> None:
    if body is not None:
        (tmp_path / "10-pod.conflist").write_text(body)
    rc = main(["--log-level", "error", "driver", "net-install-cni", "--bin-dir",
               str(tmp_path / "bin"), "--plugin", str(forwarder.build()), "--conf-dir",
               str(tmp_path), "--chain-into", "10-pod.conflist", *_kubelet(tmp_path)])
    err = capsys.readouterr().err.strip()
    assert rc == 2 and err.startswith(f"error: {tmp_path / '10-pod.conflist'}")
    assert error in err and "\n" not in err


def test_the_default_plugin_is_where_the_image_puts_it() -> None:
    """One path: the Containerfile's COPY, the CLI's and the values' default."""
    copies = re.findall(r"^COPY\b.*\btoposerve-nic (\S+)$", (ROOT / "Containerfile").read_text(),
                        re.M)
    assert copies == [str(DEFAULT_PLUGIN)]
    from toposerve.manifests.values import NetDriverCni

    assert NetDriverCni().plugin == str(DEFAULT_PLUGIN)


# the pod network's conflist as an operator wrote it: its own spacing and key order
HAND_WRITTEN = (b'{ "name": "k8s-pod-network",  "cniVersion": "1.0.0",\n'
                b'  "plugins": [ {"type": "bridge", "bridge": "cni0"} ] }\n')


def _node(tmp_path: Path) -> tuple[Path, Path, Path, Path]:
    """bin dir, conf dir (with the hand-written conflist), the built plugin, the record."""
    bin_dir, conf = tmp_path / "bin", tmp_path / "net.d"
    conf.mkdir()
    (conf / "10-pod.conflist").write_bytes(HAND_WRITTEN)
    (conf / "10-pod.conflist").chmod(0o640)
    plugin = tmp_path / "built"
    plugin.write_bytes(b"\x7fELF stand-in")
    return bin_dir, conf, plugin, data_dir(tmp_path / "kubelet") / RECORD


def test_uninstall_restores_the_conflist_byte_for_byte(tmp_path: Path) -> None:
    bin_dir, conf, plugin, record = _node(tmp_path)
    target = conf / "10-pod.conflist"
    assert install(bin_dir, plugin, conf, target.name, ENTRY, record) == [
        str(bin_dir / "toposerve-nic"), str(target)]
    assert target.read_bytes() != HAND_WRITTEN
    # again (the init container of every pod restart): nothing changes, the
    # record still says what the first one did
    assert install(bin_dir, plugin, conf, target.name, ENTRY, record) == []
    assert uninstall(record) == [str(target), str(bin_dir / "toposerve-nic")]
    assert target.read_bytes() == HAND_WRITTEN
    assert os.stat(target).st_mode & 0o777 == 0o640
    assert not (bin_dir / "toposerve-nic").exists() and not record.exists()
    assert sorted(p.name for p in conf.iterdir()) == [target.name]
    assert uninstall(record) == []  # nothing recorded: nothing to do


def test_uninstall_keeps_what_was_there_before(tmp_path: Path) -> None:
    """An executable the node had already (the same bytes or older ones) and
    a conflist that already chained it are left in place."""
    bin_dir, conf, plugin, record = _node(tmp_path)
    bin_dir.mkdir()
    (bin_dir / "toposerve-nic").write_bytes(b"an older build")
    target = conf / "10-pod.conflist"
    own = {"cniVersion": "1.0.0", "name": "n", "plugins": [{"type": "bridge"},
                                                           {"type": "toposerve-nic"}]}
    target.write_text(json.dumps(own))
    before = target.read_bytes()
    assert install(bin_dir, plugin, conf, target.name, ENTRY, record) == [
        str(bin_dir / "toposerve-nic")]
    assert uninstall(record) == []
    assert target.read_bytes() == before
    assert (bin_dir / "toposerve-nic").read_bytes() == plugin.read_bytes()


def test_uninstall_after_the_pod_network_rewrote_the_file(tmp_path: Path) -> None:
    """Changed since the install (another plugin added): only our entry goes."""
    bin_dir, conf, plugin, record = _node(tmp_path)
    target = conf / "10-pod.conflist"
    install(bin_dir, plugin, conf, target.name, ENTRY, record)
    doc = json.loads(target.read_text())
    doc["plugins"].insert(1, {"type": "portmap"})
    target.write_text(json.dumps(doc))
    uninstall(record)
    assert json.loads(target.read_text())["plugins"] == [
        {"type": "bridge", "bridge": "cni0"}, {"type": "portmap"}]
    assert unchained(json.loads(target.read_text()), ENTRY) is None


def test_the_cli_uninstalls(tmp_path: Path) -> None:
    bin_dir, conf, plugin, _ = _node(tmp_path)
    kubelet = tmp_path / "kubelet"
    args = ["--log-level", "error", "driver", "net-install-cni", "--bin-dir", str(bin_dir),
            "--kubelet-dir", str(kubelet)]
    assert main([*args, "--plugin", str(plugin), "--conf-dir", str(conf),
                 "--chain-into", "10-pod.conflist"]) == 0
    assert (data_dir(kubelet) / RECORD).exists()
    assert main([*args, "--uninstall"]) == 0
    assert (conf / "10-pod.conflist").read_bytes() == HAND_WRITTEN
    assert not bin_dir.joinpath("toposerve-nic").exists()
