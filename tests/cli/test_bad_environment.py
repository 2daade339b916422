"""One line for every bad environment: a malformed kubeconfig for every
command that reads one, a port or host that cannot be, a taken port of any
socket a command serves on, and an address in a RouterConfig that cannot
be dialled. Each case runs the real command in a subprocess and wants exit
2, exactly one line on stderr naming the flag, field or file, and no
traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.cli.test_errors import one_line, toposerve

ROUTER = "apiVersion: toposerve.io/v1\nkind: RouterConfig\nserver: {port: 0}\n"
STATIC = "discovery: {static: [{url: 'http://127.0.0.1:9'}]}\n"


def kubeconfig_doc(cluster: Any = None, user: Any = None, clusters: Any = None) -> Any:
    """A kubeconfig for an API server that is not there, with what a case changes."""
    return {"apiVersion": "v1", "kind": "Config", "current-context": "x",
            "clusters": clusters if clusters is not None else
            [{"name": "x", "cluster": cluster or {"server": "http://127.0.0.1:9"}}],
            "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
            "users": [{"name": "x", "user": user or {}}]}


# name -> (the kubeconfig, None for no file at all; what the line says)
KUBECONFIGS: dict[str, tuple[Any, str]] = {
    "ca-not-base64": (kubeconfig_doc(cluster={"server": "https://127.0.0.1:9",
                                              "certificate-authority-data": "!!!notbase64"}),
                      "clusters[0].cluster.certificate-authority-data: not base64"),
    "clusters-not-a-list": (kubeconfig_doc(clusters=5), "clusters: "),
    "missing": (None, "no such file"),
}

# one command reads its credentials as every other does (kubeapi.connect):
# the rest of the ways a kubeconfig can be malformed, through it alone
MORE_KUBECONFIGS: dict[str, tuple[Any, str]] = {
    "server-not-a-string": (kubeconfig_doc(cluster={"server": 5}), "clusters[0].cluster.server"),
    "username-not-a-string": (kubeconfig_doc(user={"username": 1, "password": "p"}),
                              "users[0].user.username"),
    "context-not-a-mapping": ({**kubeconfig_doc(), "contexts": [{"name": "x", "context": 5}]},
                              "contexts[0].context"),
    "ca-not-pem": (kubeconfig_doc(cluster={"server": "https://127.0.0.1:9",
                                           "certificate-authority-data": "bm90IGEgY2VydA=="}),
                   "certificate-authority: not a PEM certificate"),
    "client-cert-not-pem": (kubeconfig_doc(cluster={"server": "https://127.0.0.1:9"},
                                           user={"client-certificate-data": "bm90IGEgY2VydA==",
                                                 "client-key-data": "bm90IGEga2V5"}),
                            "client-certificate: not a PEM certificate and key"),
}


def _sysfs(tmp_path: Path) -> str:
    (tmp_path / "sys/bus/pci/devices").mkdir(parents=True, exist_ok=True)
    return str(tmp_path / "sys")


def _router(tmp_path: Path, text: str) -> list[str]:
    f = tmp_path / "router.yaml"
    f.write_text(ROUTER + text)
    # --log-level error: the Responses store warns that no Redis answers
    return ["--log-level", "error", "router", "--config", str(f)]


def _local_cluster(tmp_path: Path) -> Path:
    """Where `toposerve cluster up` leaves the kubeconfig of cluster x."""
    return tmp_path / "home/kwok/clusters/x/kubeconfig.yaml"


Command = Callable[[Path, Path], tuple[list[str], dict[str, str], str]]
# name -> (tmp_path, the kubeconfig's path) -> (argv, environment, what the line names)
COMMANDS: dict[str, Command] = {
    "driver simulate --kubeconfig": lambda t, k: (
        ["driver", "simulate", "--kubeconfig", str(k)], {}, str(k)),
    "driver gpu --kubeconfig": lambda t, k: (
        ["driver", "gpu", "--node-name", "n", "--sysfs-root", _sysfs(t), "--kubeconfig", str(k)],
        {}, str(k)),
    "driver net --kubeconfig": lambda t, k: (
        ["driver", "net", "--node-name", "n", "--sysfs-root", _sysfs(t), "--kubeconfig", str(k)],
        {}, str(k)),
    "extender --kubeconfig": lambda t, k: (
        ["extender", "--kubeconfig", str(k), "--port", "0"], {}, str(k)),
    "$KUBECONFIG driver simulate": lambda t, k: (
        ["driver", "simulate"], {"KUBECONFIG": str(k)}, f"$KUBECONFIG {k}"),
    "$KUBECONFIG extender": lambda t, k: (
        ["extender", "--port", "0"], {"KUBECONFIG": str(k)}, f"$KUBECONFIG {k}"),
    "$KUBECONFIG router discovery.kubernetes": lambda t, k: (
        _router(t, "discovery: {kubernetes: {labelSelector: app=vllm}}\n"),
        {"KUBECONFIG": str(k)}, f"$KUBECONFIG {k}"),
    "router discovery.kubernetes.kubeconfig": lambda t, k: (
        _router(t, f"discovery: {{kubernetes: {{labelSelector: app=vllm, kubeconfig: '{k}'}}}}\n"),
        {}, f"discovery.kubernetes.kubeconfig {k}"),
    "router discovery.inferencePool.kubeconfig": lambda t, k: (
        _router(t, f"discovery: {{inferencePool: {{name: llama, kubeconfig: '{k}'}}}}\n"),
        {}, f"discovery.inferencePool.kubeconfig {k}"),
    "router keys.secret.kubeconfig": lambda t, k: (
        _router(t, STATIC + "flowControl: {tenants: {keys: {secret: "
                f"{{name: keys, kubeconfig: '{k}'}}}}}}}}\n"),
        {}, f"flowControl.tenants.keys.secret.kubeconfig {k}"),
    "router ha.lease.kubeconfig": lambda t, k: (
        _router(t, STATIC + "responses: {backend: redis, redisUrl: 'redis://127.0.0.1:9/0'}\n"
                f"ha: {{enabled: true, lease: {{kubeconfig: '{k}'}}}}\n"),
        {}, f"ha.lease.kubeconfig {k}"),
    "topology show --name": lambda t, k: (
        ["topology", "show", "--name", "x"], {"TOPOSERVE_HOME": str(t / "home")}, str(k)),
    "driver simulate --cluster": lambda t, k: (
        ["driver", "simulate", "--cluster", "x"], {"TOPOSERVE_HOME": str(t / "home")}, str(k)),
}
LOCAL_CLUSTER = {"topology show --name", "driver simulate --cluster"}


def _write(path: Path, doc: Any) -> None:
    if doc is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(doc))


@pytest.mark.parametrize("content, command", [
    (content, command) for content in KUBECONFIGS for command in COMMANDS
    # a flag's or $KUBECONFIG's missing file was one line before (test_errors);
    # a router's field was named as --kubeconfig, or never read before serving
    if content != "missing" or command.startswith("router ")])
def test_a_bad_kubeconfig_for_every_command(tmp_path: Path, command: str, content: str) -> None:
    doc, problem = KUBECONFIGS[content]
    path = _local_cluster(tmp_path) if command in LOCAL_CLUSTER else tmp_path / "kubeconfig"
    _write(path, doc)
    argv, env, names = COMMANDS[command](tmp_path, path)
    one_line(toposerve(tmp_path, *argv, env=env), 2, names, problem)


@pytest.mark.parametrize("content", MORE_KUBECONFIGS)
def test_more_malformed_kubeconfigs(tmp_path: Path, content: str) -> None:
    doc, problem = MORE_KUBECONFIGS[content]
    path = tmp_path / "kubeconfig"
    _write(path, doc)
    one_line(toposerve(tmp_path, "driver", "simulate", "--kubeconfig", str(path)), 2,
             str(path), problem)


@pytest.fixture
def good_kubeconfig(tmp_path: Path) -> str:
    path = tmp_path / "good-kubeconfig"
    _write(path, kubeconfig_doc())
    return str(path)


@pytest.mark.parametrize("argv, names", [
    (["extender", "--kubeconfig", "{kube}", "--port", "70000"], "--port: Input should be less"),
    (["extender", "--kubeconfig", "{kube}", "--port", "-1"], "--port: Input should be greater"),
    (["extender", "--kubeconfig", "{kube}", "--port", "0", "--host", ""], "change --host"),
    (["sim", "--port", "0", "--host", ""], "change --host"),
    (["router", "--endpoint", "http://h:1", "--port", "0", "--host", ""], "change --host"),
    (["router", "--endpoint", "http://h:1", "--port", "abc"], "argument --port: invalid int"),
    (["sim", "--port", "0", "--host", "nohost.invalid"], "cannot listen on nohost.invalid:0"),
    (["driver", "simulate", "--kubeconfig", "{kube}", "--http-address", "127.0.0.1:70000"],
     "--http-address: '127.0.0.1:70000': the port must be 0 to 65535"),
    (["driver", "gpu", "--node-name", "n", "--sysfs-root", "{sysfs}", "--kubeconfig", "{kube}",
      "--http-address", "127.0.0.1:70000"], "--http-address: '127.0.0.1:70000'"),
    (["driver", "net", "--node-name", "n", "--sysfs-root", "{sysfs}", "--kubeconfig", "{kube}",
      "--http-address", ":9466"], "--http-address: ':9466': give host:port"),
])
def test_a_port_or_host_that_cannot_be(tmp_path: Path, good_kubeconfig: str, argv: list[str],
                                       names: str) -> None:
    sysfs = _sysfs(tmp_path)
    got = toposerve(tmp_path, *(a.format(kube=good_kubeconfig, sysfs=sysfs) for a in argv))
    one_line(got, 2, names)


@pytest.mark.parametrize("argv, flag", [
    (["sim", "--port", "0", "--kv-events-port", "{taken}"], "--kv-events-port"),
    (["sim", "--port", "0", "--kv-events-port", "0", "--kv-events-replay-port", "{taken}"],
     "--kv-events-replay-port"),
    (["sim", "--port", "0", "--dialect", "sglang", "--disaggregation-mode", "prefill",
      "--disaggregation-bootstrap-port", "{taken}"], "--disaggregation-bootstrap-port"),
])
def test_a_taken_port_besides_http(tmp_path: Path, taken: int, argv: list[str],
                                   flag: str) -> None:
    """Bound before anything serves, like the HTTP port."""
    got = toposerve(tmp_path, *(a.format(taken=taken) for a in argv))
    line = one_line(got, 2, f"127.0.0.1:{taken}: Address already in use", f"or {flag}")
    assert "serving" not in got.stdout + line


BAD_URLS = ["http://[::1", "http://127.0.0.1:99999", "http://h:abc", "http://:80", "http://h:0"]


@pytest.mark.parametrize("url", BAD_URLS)
def test_an_endpoint_url_that_cannot_be_dialled(tmp_path: Path, url: str) -> None:
    one_line(toposerve(tmp_path, "router", "--endpoint", url, "--port", "0"), 2,
             "toposerve router: --endpoint:", repr(url))
    argv = _router(tmp_path, f"discovery: {{static: [{{url: '{url}'}}]}}\n")
    one_line(toposerve(tmp_path, *argv), 2, "discovery.static.0.url:", repr(url))


@pytest.mark.parametrize("field, address", [
    ("kvEvents", "tcp://127.0.0.1"), ("kvEvents", "tcp://127.0.0.1:99999"),
    ("kvEvents", "http://127.0.0.1:5557"), ("kvEvents", "tcp://*:5557"),
    ("kvEvents", "tcp://[::1:5557"), ("kvEvents", "ipc://"), ("kvEvents", "127.0.0.1:5557"),
    ("kvEventsReplay", "tcp://h"),
])
def test_a_kv_events_address_that_cannot_be_dialled(tmp_path: Path, field: str,
                                                    address: str) -> None:
    argv = _router(tmp_path, "discovery: {static: [{url: 'http://127.0.0.1:9', "
                             f"{field}: '{address}'}}]}}\n")
    one_line(toposerve(tmp_path, *argv), 2, f"discovery.static.0.{field}:", repr(address),
             "tcp://HOST:PORT")


@pytest.mark.parametrize("url", ["notaurl", "redis://127.0.0.1:99999/0", "redis://:6379/0",
                                 "redis://127.0.0.1:6379/abc", "unix://", "http://h:6379"])
def test_a_redis_url_that_cannot_be(tmp_path: Path, url: str) -> None:
    argv = _router(tmp_path, STATIC + f"responses: {{backend: redis, redisUrl: '{url}'}}\n")
    one_line(toposerve(tmp_path, *argv), 2, "responses.redisUrl:", repr(url),
             "redis://HOST:PORT/DB")
