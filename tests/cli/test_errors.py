"""Bad input and a bad environment, through the real command in a
subprocess: exactly one line on stderr naming the cause and the fix, a
non-zero exit, never a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
NOT_UTF8 = b"apiVersion: toposerve.io/v1\nkind: X\n# \xff\xfe\n"


def toposerve(tmp_path: Path, *argv: str, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess[str]:
    # no credentials anywhere unless a test gives some: no $KUBECONFIG, an
    # empty home, not in a pod
    base = {**os.environ, "HOME": str(tmp_path), "KUBECONFIG": ""}
    base.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run([sys.executable, "-m", "toposerve.main", *argv],
                          capture_output=True, text=True, timeout=30, cwd=ROOT,
                          env={**base, **(env or {})})


def one_line(got: subprocess.CompletedProcess[str], rc: int, *parts: str) -> str:
    assert "Traceback" not in got.stderr, got.stderr
    lines = got.stderr.splitlines()
    assert len(lines) == 1, got.stderr
    assert got.returncode == rc, got.stderr
    for part in parts:
        assert part in lines[0]
    return lines[0]


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True)
    return tmp_path / "sys"


@pytest.mark.parametrize("argv", [
    ["router", "--config"], ["extender", "--config"], ["scale", "run", "-f"],
    ["manifests", "render", "-f"], ["topology", "show", "--profile"],
])
def test_a_config_file_that_is_not_utf8(tmp_path: Path, argv: list[str]) -> None:
    f = tmp_path / "odd.yaml"
    f.write_bytes(NOT_UTF8)
    one_line(toposerve(tmp_path, *argv, str(f)), 2, str(f), "not UTF-8 text")


@pytest.mark.parametrize("argv", [
    ["driver", "gpu", "--node-name", "n"], ["driver", "net", "--node-name", "n"],
    ["driver", "simulate"], ["extender"],
])
def test_kubeconfig_nowhere_and_none_at_all(tmp_path: Path, sysfs: Path,
                                           argv: list[str]) -> None:
    extra = ["--sysfs-root", str(sysfs)] if argv[0] == "driver" and argv[1] != "simulate" else []
    got = toposerve(tmp_path, *argv, *extra, "--kubeconfig", str(tmp_path / "none"))
    one_line(got, 2, f"--kubeconfig {tmp_path / 'none'}: no such file")
    got = toposerve(tmp_path, *argv, *extra)
    one_line(got, 2, "in-cluster config", "give --kubeconfig, set $KUBECONFIG")


@pytest.mark.parametrize("content", [b"a: [\n", b"- 1\n", b"", NOT_UTF8, None])
def test_a_kubeconfig_that_is_none(tmp_path: Path, content: bytes | None) -> None:
    """Not YAML, a list, empty, not UTF-8, a directory (every command finds
    its credentials with toposerve.kubeapi.connect: one command tells for all)."""
    bad = tmp_path / "bad"
    if content is None:
        bad.mkdir()
    else:
        bad.write_bytes(content)
    got = toposerve(tmp_path, "driver", "simulate", "--kubeconfig", str(bad))
    one_line(got, 2, str(bad), "no such file" if content is None else "not a kubeconfig")


def test_router_kubernetes_discovery_without_credentials(tmp_path: Path) -> None:
    f = tmp_path / "router.yaml"
    f.write_text("apiVersion: toposerve.io/v1\nkind: RouterConfig\nserver: {port: 0}\n"
                 f"discovery: {{kubernetes: {{labelSelector: app=vllm, "
                 f"kubeconfig: {tmp_path / 'none'}}}}}\n")
    one_line(toposerve(tmp_path, "router", "--config", str(f)), 2, "no such file")


@pytest.mark.parametrize("argv, change", [
    (["sim", "--port", "{port}"], "change --host or --port"),
    (["router", "--endpoint", "http://127.0.0.1:9", "--port", "{port}"],
     "change --host or --port"),
])
def test_a_taken_port(tmp_path: Path, taken: int, argv: list[str], change: str) -> None:
    got = toposerve(tmp_path, *(a.format(port=taken) for a in argv))
    one_line(got, 2, f"cannot listen on 127.0.0.1:{taken}: Address already in use", change)


def test_a_taken_port_in_the_router_config(tmp_path: Path, taken: int) -> None:
    f = tmp_path / "router.yaml"
    f.write_text("apiVersion: toposerve.io/v1\nkind: RouterConfig\n"
                 f"server: {{port: {taken}}}\ndiscovery: {{static: [{{url: 'http://h:1'}}]}}\n")
    one_line(toposerve(tmp_path, "router", "--config", str(f)), 2,
             f"127.0.0.1:{taken}", f"change server.host or server.port in {f}")


def test_a_taken_port_of_the_extender(tmp_path: Path, taken: int, kubeconfig: Path) -> None:
    got = toposerve(tmp_path, "extender", "--kubeconfig", str(kubeconfig), "--port", str(taken))
    one_line(got, 2, f"cannot listen on 127.0.0.1:{taken}: Address already in use",
             "change --host or --port")


@pytest.mark.parametrize("driver", ["gpu", "net"])
def test_a_taken_http_address_of_a_driver(tmp_path: Path, taken: int, kubeconfig: Path,
                                          sysfs: Path, driver: str) -> None:
    # --log-level error: the GPU driver warns that this machine has no NVML
    got = toposerve(tmp_path, "--log-level", "error", "driver", driver, "--node-name", "n",
                    "--sysfs-root", str(sysfs),
                    "--kubeconfig", str(kubeconfig), "--plugin-dir", str(tmp_path / "plugin"),
                    "--registry-dir", str(tmp_path / "registry"),
                    "--http-address", f"127.0.0.1:{taken}")
    one_line(got, 2, f"--http-address 127.0.0.1:{taken}: cannot listen", "give a free address")


def test_a_taken_http_address_of_driver_simulate(tmp_path: Path, taken: int,
                                                 kubeconfig: Path) -> None:
    got = toposerve(tmp_path, "driver", "simulate", "--kubeconfig", str(kubeconfig),
                    "--http-address", f"127.0.0.1:{taken}")
    one_line(got, 2, f"--http-address 127.0.0.1:{taken}: cannot listen", "give a free address")


@pytest.mark.parametrize("url", ["localhost:8000", "http://localhost:8000/v1/"])
def test_an_endpoint_without_scheme_or_with_a_path(tmp_path: Path, url: str) -> None:
    line = one_line(toposerve(tmp_path, "router", "--endpoint", url), 2,
                    "--endpoint", "give a URL with http:// or https:// and without /v1")
    assert "pydantic" not in line and "validation error" not in line
    f = tmp_path / "router.yaml"
    f.write_text("apiVersion: toposerve.io/v1\nkind: RouterConfig\n"
                 f"discovery: {{static: [{{url: '{url}'}}]}}\n")
    one_line(toposerve(tmp_path, "router", "--config", str(f)), 2,
             f"{f}: discovery.static.0.url:", "give a URL with http:// or https://")


@pytest.mark.parametrize("content, message", [
    (b"{", "not valid JSON"),
    (b"\xff", "not valid JSON"),
    (b"[]", "expected a JSON object, got list"),
    (b"{}", "no 'setups' where the report needs it"),
    (json.dumps({"setups": [], "scenario": {"name": "x"}}).encode(), "no 'clientLimits'"),
])
def test_scale_report_of_a_bad_result(tmp_path: Path, content: bytes, message: str) -> None:
    (tmp_path / "result.json").write_bytes(content)
    # --log-level warning: matplotlib says when it builds its font cache
    one_line(toposerve(tmp_path, "--log-level", "warning", "scale", "report", str(tmp_path)), 2,
             f"{tmp_path / 'result.json'}: ", message)


@pytest.mark.parametrize("argv", [
    ["topology", "profiles"], ["topology", "show", "--profile", "gb200-nvl72", "--json"],
    ["manifests", "render", "--set", "apiServer.host=127.0.0.1"],
])
def test_a_reader_that_goes_away(tmp_path: Path, argv: list[str]) -> None:
    """`toposerve ... | head -1`: the reader closed the pipe before the end."""
    env = {**os.environ, "HOME": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "toposerve.main", *argv], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command writes anything
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=30) == 141 and err == ""


@pytest.mark.parametrize("argv, message", [
    (["sim", "--port", "70000"], "toposerve sim: --port: Input should be less than"),
    (["sim", "--hardware-profile", "nope"], "--hardware-profile: Value error, unknown profile"),
    (["router", "--endpoint", "http://h:1", "--port", "-1"], "toposerve router: --port:"),
    (["router", "--endpoint", "http://h:1", "--host", "nohost.invalid"],
     "cannot listen on nohost.invalid:"),
])
def test_bad_flags(tmp_path: Path, argv: list[str], message: str) -> None:
    got = toposerve(tmp_path, *argv)
    one_line(got, 2, message)


@pytest.mark.parametrize("text, message", [
    (None, "cannot read: Is a directory"),
    ("", "expected a YAML mapping with apiVersion and kind"),
    ("- a\n", "expected a YAML mapping with apiVersion and kind"),
    ("apiVersion: toposerve.io/v1\nkind: ExtenderConfig\n", "kind: expected 'RouterConfig'"),
    ("apiVersion: toposerve.io/v1\nkind: RouterConfig\ndiscovery: {static: [{url: 'http://h:1'}]}"
     "\nserver: {port: -1}\n", "server.port: Input should be greater than or equal to 0"),
    ("apiVersion: toposerve.io/v1\nkind: RouterConfig\ndiscovery: {statc: []}\n",
     "discovery.statc: Extra inputs are not permitted (unknown field: did you mean static?)"),
    ("this: is: not: yaml: [\n",
     "not valid YAML: mapping values are not allowed here (line 1, column 9)"),
    ("apiVersion: toposerve.io/v1\nkind: RouterConfig\ndiscovery: {static: [{url: 'http://h:1'}]}"
     "\nprofile: {scorers: [{type: no-such-scorer}]}\n",
     "profile.scorers[0].type: unknown scorer 'no-such-scorer'"),
])
def test_bad_router_config_files(tmp_path: Path, text: str | None, message: str) -> None:
    f = tmp_path / "router.yaml"
    if text is None:
        f.mkdir()
    else:
        f.write_text(text)
    one_line(toposerve(tmp_path, "router", "--config", str(f)), 2, str(f), message)


NOT_A_TOKENIZER = '{"x": 1}'  # valid JSON, no tokenizer in it
ROUTER_PRECISE = ("apiVersion: toposerve.io/v1\nkind: RouterConfig\n"
                  "discovery: {static: [{url: 'http://127.0.0.1:9'}]}\n"
                  "profile: {scorers: [{type: prefix-precise, weight: 1}]}\n")


@pytest.mark.parametrize("content, message", [
    (None, "cannot read the tokenizer: No such file or directory"),
    (NOT_A_TOKENIZER, "not a Hugging Face tokenizer.json"),
])
def test_a_bad_tokenizer_file(tmp_path: Path, content: str | None, message: str) -> None:
    """Refused before the server listens or says it serves, for the sim's
    flag and the router's kvEvents.tokenizer alike."""
    pytest.importorskip("tokenizers", reason="the precise extra reads tokenizer files")
    tok = tmp_path / "tokenizer.json"
    if content is not None:
        tok.write_text(content)
    one_line(toposerve(tmp_path, "sim", "--port", "9", "--tokenizer", str(tok)), 2,
             "--tokenizer:", str(tok), message)
    cfg = tmp_path / "router.yaml"
    cfg.write_text(ROUTER_PRECISE + f"kvEvents: {{tokenizer: '{tok}'}}\n"
                   "server: {port: 9}\n")
    one_line(toposerve(tmp_path, "router", "--config", str(cfg)), 2,
             f"kvEvents.tokenizer in {cfg}:", str(tok), message)


def test_a_missing_chat_template(tmp_path: Path) -> None:
    cfg = tmp_path / "router.yaml"
    cfg.write_text(ROUTER_PRECISE + "kvEvents: {tokenizer: bytes, chatTemplate: /nope.jinja}\n")
    one_line(toposerve(tmp_path, "router", "--config", str(cfg)), 2,
             f"kvEvents.chatTemplate in {cfg}:", "/nope.jinja", "No such file")
