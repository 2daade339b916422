"""Flags a reviewer found taken as given: a value out of range, a path that
is a file, a relative path, a flag the config silently won over. Each is
one line naming the flag and the fix, exit 2, no traceback, and nothing
written before it is refused."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cli.test_errors import one_line, toposerve

ELF = b"\x7fELF stand-in"


def _driver(tmp_path: Path, kubeconfig: Path, driver: str, *argv: str) -> list[str]:
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
    # --log-level error: the GPU driver warns that this machine has no NVML
    return ["--log-level", "error", "driver", driver, "--node-name", "n",
            "--sysfs-root", str(tmp_path / "sys"), "--kubeconfig", str(kubeconfig),
            "--http-address", "127.0.0.1:0", *argv]


@pytest.mark.parametrize("out, why", [
    ("file", "Not a directory"), ("file/sub", "Not a directory"),
    ("full", "not empty"), ("/proc/x", "No such file or directory"),
])
def test_fake_sysfs_where_no_tree_can_go(tmp_path: Path, out: str, why: str) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "full").mkdir()
    (tmp_path / "full/x").write_text("x")
    where = out if out.startswith("/") else str(tmp_path / out)
    got = toposerve(tmp_path, "topology", "fake-sysfs", "--profile", "hgx-h100", "--out", where)
    one_line(got, 2, f"--out {where}: {why}", "give a new or empty directory")


@pytest.mark.parametrize("driver", ["gpu", "net"])
def test_a_driver_takes_relative_paths(tmp_path: Path, kubeconfig: Path, driver: str) -> None:
    """From the directory it is started in, as any command's paths; gRPC
    took unix://d/p/dra.sock for host d and failed to bind."""
    extra = ["--state-dir", "d/s", "--journal-dir", "d/j", "--handoff-socket", "d/h.sock"] \
        if driver == "net" else []
    env = {**os.environ, "HOME": str(tmp_path), "KUBECONFIG": ""}
    proc = subprocess.Popen(
        [sys.executable, "-m", "toposerve.main",
         *_driver(tmp_path, kubeconfig, driver, "--plugin-dir", "d/p", "--registry-dir", "d/r",
                  *extra)],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    registration = tmp_path / f"d/r/{driver}.toposerve.io-reg.sock"
    try:
        deadline = time.monotonic() + 20
        while not registration.is_socket() and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert registration.is_socket() and (tmp_path / "d/p/dra.sock").is_socket()
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert "Traceback" not in err, err
    assert proc.returncode == 0, err


@pytest.mark.parametrize("driver, flags, says", [
    ("gpu", ["--plugin-dir", "{t}/file/p"], "{t}/file/p: Not a directory; change --plugin-dir"),
    ("gpu", ["--registry-dir", "{t}/file"], "{t}/file: not a directory; change --registry-dir"),
    ("gpu", ["--plugin-dir", "{t}/p"],
     "{t}/p/dra.sock: exists and is not a socket; not removing it; change --plugin-dir"),
    ("gpu", ["--plugin-dir", "{t}/" + "x" * 110],
     "bytes a unix socket's path may have; change --plugin-dir"),
    ("net", ["--handoff-socket", "{t}/file/h.sock"],
     "{t}/file: not a directory; change --handoff-socket"),
])
def test_a_driver_socket_that_cannot_be(tmp_path: Path, kubeconfig: Path, driver: str,
                                        flags: list[str], says: str) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "p/dra.sock").mkdir(parents=True)  # not a socket: never removed
    t = str(tmp_path)
    paths = ["--plugin-dir", f"{t}/plugin", "--registry-dir", f"{t}/registry",
             "--state-dir", f"{t}/s", "--journal-dir", f"{t}/j"][:4 if driver == "gpu" else 8]
    got = toposerve(tmp_path, *_driver(tmp_path, kubeconfig, driver, *paths,
                                       *(f.format(t=t) for f in flags)))
    one_line(got, 2, says.format(t=t))


@pytest.mark.parametrize("argv", [
    ["gpu", "--health-interval", "-1"], ["gpu", "--health-interval", "0"],
    ["net", "--rescan-interval", "0"],
])
def test_a_driver_interval_that_is_no_pause(tmp_path: Path, kubeconfig: Path,
                                            argv: list[str]) -> None:
    got = toposerve(tmp_path, *_driver(tmp_path, kubeconfig, argv[0], *argv[1:],
                                       "--plugin-dir", str(tmp_path / "p"),
                                       "--registry-dir", str(tmp_path / "r")))
    one_line(got, 2, f"{argv[1]} {argv[2]}: give seconds over 0")
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("flag, value, says", [
    ("--weight", "0", "give 1 or more"), ("--weight", "-3", "give 1 or more"),
    ("--timeout", "-1", "give 0.001 to 3600 seconds"),
    ("--timeout", "0.0001", "give 0.001 to 3600 seconds"),  # it would print as 0s
    ("--timeout", "7200", "give 0.001 to 3600 seconds"),
    ("--qps", "-5", "give 1 to 2147483647"), ("--qps", "0", "give 1 to 2147483647"),
    ("--url", "http://x:99999", "the port is not a number from 1 to 65535"),
    ("--url", "http://", "no host"),
])
def test_scheduler_config_out_of_range(tmp_path: Path, flag: str, value: str,
                                       says: str) -> None:
    """What kube-scheduler would refuse to start with (a weight that is not
    positive), as the chart's values refuse it too."""
    argv = {"--url": "http://127.0.0.1:8888", flag: value}
    got = toposerve(tmp_path, "extender", "scheduler-config",
                    *(x for kv in argv.items() for x in kv))
    one_line(got, 2, f"{flag} {value}: {says}")
    assert got.stdout == ""


def _router_config(tmp_path: Path, port: int) -> Path:
    f = tmp_path / "router.yaml"
    f.write_text("apiVersion: toposerve.io/v1\nkind: RouterConfig\n"
                 f"server: {{port: {port}}}\ndiscovery: {{static: [{{url: 'http://h:1'}}]}}\n")
    return f


def test_router_port_over_the_config(tmp_path: Path, taken: int) -> None:
    """--port wins over server.port, as --workers over server.workers: the
    taken port given is the one refused (the config's, 0, would serve)."""
    f = _router_config(tmp_path, 0)
    one_line(toposerve(tmp_path, "router", "--config", str(f), "--port", str(taken)), 2,
             f"cannot listen on 127.0.0.1:{taken}", "change --host or --port")
    one_line(toposerve(tmp_path, "router", "--config", str(f), "--port", "-1"), 2,
             "toposerve router: --port: Input should be greater than or equal to 0")


def test_router_host_over_the_config(tmp_path: Path) -> None:
    f = _router_config(tmp_path, 0)
    one_line(toposerve(tmp_path, "router", "--config", str(f), "--host", "nohost.invalid"), 2,
             "cannot listen on nohost.invalid:0", "change --host or --port")


@pytest.mark.parametrize("argv, says", [
    (["--rack", "r1"], "--nvlink-domain, --rack, --block and --zone say where a node sits: "
                       "set --node too"),
    (["--node", "n", "--nvlink-domain", "d", "--zone", "z"], "set --block and --rack too"),
])
def test_sim_place_errors_name_flags(tmp_path: Path, argv: list[str], says: str) -> None:
    line = one_line(toposerve(tmp_path, "sim", *argv), 2, "toposerve sim: ", says)
    assert "nvlink_domain" not in line


def _install(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return toposerve(tmp_path, "--log-level", "error", "driver", "net-install-cni",
                     "--kubelet-dir", str(tmp_path / "kubelet"), *argv)


def test_install_cni_bin_dir_that_is_a_file(tmp_path: Path) -> None:
    plugin = tmp_path / "built"
    plugin.write_bytes(ELF)
    (tmp_path / "bin").write_text("x")
    for bin_dir in ("bin", "bin/sub"):
        got = _install(tmp_path, "--bin-dir", str(tmp_path / bin_dir), "--plugin", str(plugin))
        one_line(got, 2, f"{tmp_path / bin_dir}: ", "not a directory", "change --bin-dir")
    assert not (tmp_path / "kubelet").exists()  # no record of a change never made


@pytest.mark.parametrize("body, chain, says", [
    (b"", False, "not an executable"),
    (ELF, True, "no such conflist yet"),
])
def test_install_cni_checks_every_input_before_writing(tmp_path: Path, body: bytes,
                                                       chain: bool, says: str) -> None:
    plugin = tmp_path / "built"
    plugin.write_bytes(body)
    (tmp_path / "net.d").mkdir()
    got = _install(tmp_path, "--bin-dir", str(tmp_path / "bin"), "--plugin", str(plugin),
                   "--conf-dir", str(tmp_path / "net.d"),
                   *(["--chain-into", "10-pod.conflist"] if chain else []))
    one_line(got, 2, says)
    assert not (tmp_path / "bin").exists() and not (tmp_path / "kubelet").exists()
