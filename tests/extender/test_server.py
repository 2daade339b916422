"""The HTTP face over a hand-fed state: Go field names, both payload
modes, 400 on bad JSON, health/ready/metrics, HTTPS, the config file and
the printed scheduler configuration."""

from __future__ import annotations

import asyncio
import gc
import shutil
import ssl
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from aiohttp import ClientSession, web
from aiohttp.test_utils import TestClient, TestServer

from harness import extender_objects as k
from toposerve.localcluster.scale import controllers as ctl
from toposerve.main import main
from toposerve.scheduler_ext.config import ExtenderConfig, load_extender_config
from toposerve.scheduler_ext.placement.model import Decision
from toposerve.scheduler_ext.scheduler_config import scheduler_config
from toposerve.scheduler_ext.server import Extender
from toposerve.topology.config_file import ConfigError
from toposerve.topology.model import Tier

NODES = k.planned(("gb200-nvl72", 36), ("hgx-h100", 4))
NAMES = [n.name for n in NODES]


def extender(now: float = 1000.0, **cfg: Any) -> tuple[Extender, list[tuple[str, Decision]]]:
    state = k.cluster_state(NODES, templates=[k.template("gpu4", 4)], cfg=ExtenderConfig(**cfg))
    written: list[tuple[str, Decision]] = []
    ext = Extender(ExtenderConfig(**cfg), state, clock=lambda: now,
                   persist=lambda ns, pod, d: written.append((f"{ns}/{pod}", d)),
                   missing=lambda: sorted({"nodes", "pods"} - state.synced))
    return ext, written


def bound(p: dict[str, Any], node: str) -> dict[str, Any]:
    p["metadata"]["uid"] = f"uid-{p['metadata']['name']}"
    p["spec"]["nodeName"] = node
    p["status"] = {"phase": "Running"}
    return p


def run(ext: Extender, fn: Callable[[TestClient[Any, Any]], Awaitable[None]]) -> None:
    async def go() -> None:
        async with TestClient(TestServer(ext.app())) as client:
            await fn(client)
            await asyncio.gather(*ext._writes)
    asyncio.run(go())


async def post(client: TestClient[Any, Any], verb: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    r = await client.post(f"/{verb}", data=data)
    return r.status, orjson.loads(await r.read())


def test_bad_json_is_400_with_a_json_error() -> None:
    ext, _ = extender()

    async def check(c: TestClient[Any, Any]) -> None:
        status, body = await post(c, "filter", b"{not json")
        assert status == 400 and "bad filter request" in body["Error"]
        status, body = await post(c, "prioritize", {"NodeNames": ["a"]})
        assert status == 400 and "Pod" in body["Error"]
        status, body = await post(c, "filter", {"Pod": ctl.pod("p")})
        assert status == 400 and "NodeNames" in body["Error"]
    run(ext, check)


def test_warm_builds_the_view_before_any_call_and_freezes_the_heap() -> None:
    ext, _ = extender()
    assert ext.state.view.nodes == {}  # built lazily, by the first call or warm()
    try:
        ext.warm()
        assert set(ext.state.view.nodes) == set(NAMES)
        assert Tier.RACK in ext.state.view.index
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()


def test_pods_outside_groups_pass_through_with_neutral_scores() -> None:
    ext, written = extender()
    plain = ctl.pod("web", labels={"app": "web", "llm-d.ai/role": "decode"}, uid="u-web")

    async def check(c: TestClient[Any, Any]) -> None:
        status, body = await post(c, "filter", {"Pod": plain, "NodeNames": NAMES})
        assert status == 200
        assert body == {"NodeNames": NAMES, "FailedNodes": {}, "Error": ""}
        status, scores = await post(c, "prioritize", {"Pod": plain, "NodeNames": NAMES})
        assert status == 200 and scores == []  # every node 0: no opinion
        # full payload mode: Nodes in, the same Node objects out
        items = [k.node(n) for n in NODES[:3]]
        status, body = await post(c, "filter", {"Pod": plain, "Nodes": {"items": items}})
        assert status == 200 and body["Nodes"]["items"] == items and "NodeNames" not in body
    run(ext, check)
    assert written == []


def test_a_pod_of_no_group_asking_gpus_is_packed_and_counted_where_scored() -> None:
    tray = [n.name for n in NODES if n.profile == "gb200-nvl72"][5]
    ext, _ = extender()
    ext.state.relist("templates", [k.template("gpu4", 4), k.template("gpu1", 1)])
    ext.state.pod("ADDED", bound(ctl.pod("busy", claim_template="gpu1"), tray))
    one = ctl.pod("one", claim_template="gpu1", uid="u-one")
    ext.state.pod("ADDED", one)  # watched: a pod known from the call alone is not kept

    async def check(c: TestClient[Any, Any]) -> None:
        _, scores = await post(c, "prioritize", {"Pod": one, "NodeNames": NAMES})
        # the tray it leaves fullest; the HGX nodes (with partitions) last
        assert scores == [{"Host": tray, "Score": 10}]
        with ext.state.lock:
            assert ext.state.snapshot().nodes[tray].free == 2  # counted until it binds
        await post(c, "filter", {"Pod": one, "NodeNames": NAMES})  # asked again: not there
        with ext.state.lock:
            assert ext.state.snapshot().nodes[tray].free == 3
    run(ext, check)
    off, _ = extender(placement={"packUngrouped": False})

    async def neutral(c: TestClient[Any, Any]) -> None:
        assert (await post(c, "prioritize", {"Pod": one, "NodeNames": NAMES}))[1] == []
    run(off, neutral)


def test_a_group_is_held_to_one_rack_and_its_decision_is_written_once() -> None:
    ext, written = extender()
    pods = k.toposerve_pods("ep", 6, claim_template="gpu4", level="rack", uid_prefix="ep")

    async def check(c: TestClient[Any, Any]) -> None:
        status, body = await post(c, "filter", {"Pod": pods[0], "NodeNames": NAMES})
        assert status == 200
        racks = {n.path.rack for n in NODES if n.name in body["NodeNames"]}
        assert len(racks) == 1
        hgx = [n.name for n in NODES if n.profile == "hgx-h100"]
        assert set(hgx) <= set(body["FailedNodes"])
        assert "is held to rack" in body["FailedNodes"][hgx[0]]
        status, scores = await post(c, "prioritize", {"Pod": pods[1], "NodeNames": NAMES})
        assert {s["Host"] for s in scores if s["Score"] > 0} == set(body["NodeNames"])
        await post(c, "filter", {"Pod": pods[1], "NodeNames": NAMES})
        status, pre = await post(c, "preempt", {
            "Pod": pods[2], "NodeNameToMetaVictims": {
                n: {"Pods": [{"UID": "v"}], "NumPDBViolations": 0} for n in NAMES}})
        assert status == 200 and set(pre["NodeNameToMetaVictims"]) == set(body["NodeNames"])
    run(ext, check)
    assert [w for w, _ in written] == ["default/ep-0"]  # renewals are not rewritten


def test_an_unplaceable_group_fails_every_node_with_one_reason() -> None:
    ext, written = extender()
    pods = k.toposerve_pods("big", 19, claim_template="gpu4", level="rack", uid_prefix="b")

    async def check(c: TestClient[Any, Any]) -> None:
        _, body = await post(c, "filter", {"Pod": pods[0], "NodeNames": NAMES})
        assert body["NodeNames"] == []
        # no rack holds 76 GPUs even empty: preemption would not help
        failed = body["FailedAndUnresolvableNodes"]
        assert body["FailedNodes"] == {} and len(set(failed.values())) == 1
        assert "needs 76 accelerators for 19 pods in one rack" in failed[NAMES[0]]
        # one that fits an empty rack but not what is free: preemption may help
        ext.state.pod("ADDED", bound(ctl.pod("hog", claim_template="gpu4"), NODES[0].name))
        small = k.toposerve_pods("mid", 18, claim_template="gpu4", level="rack",
                                 uid_prefix="mid", profile="gb200-nvl72")
        for i in range(1, 36):  # every GB200 tray but the first holds a 4-GPU pod
            ext.state.pod("ADDED", bound(ctl.pod(f"h{i}", claim_template="gpu4"),
                                         NODES[i].name))
        _, body = await post(c, "filter", {"Pod": small[0], "NodeNames": NAMES[:36]})
        assert "FailedAndUnresolvableNodes" not in body and body["FailedNodes"]
    run(ext, check)
    assert written == []


def test_health_ready_and_metrics() -> None:
    ext, _ = extender()

    async def check(c: TestClient[Any, Any]) -> None:
        assert (await c.get("/health")).status == 200
        r = await c.get("/ready")
        assert r.status == 503 and (await r.json())["waitingFor"] == ["pods"]
        ext.state.relist("pods", [])
        r = await c.get("/ready")  # listed, but the view is not built yet
        assert r.status == 503 and (await r.json())["status"] == "warming"
        try:
            ext.warm()
        finally:
            gc.unfreeze()
        assert (await c.get("/ready")).status == 200
        pod = k.toposerve_pods("m", 2, claim_template="gpu4", level="rack", uid_prefix="m")[0]
        await post(c, "filter", {"Pod": pod, "NodeNames": NAMES})
        await post(c, "filter", {"Pod": pod, "NodeNames": "x"})
        text = await (await c.get("/metrics")).text()
        assert 'toposerve_extender_calls_total{code="200",verb="filter"} 1.0' in text
        assert 'toposerve_extender_calls_total{code="400",verb="filter"} 1.0' in text
        assert 'toposerve_extender_decisions_total{reason="decided"} 1.0' in text
        assert "toposerve_extender_groups_held 1.0" in text
        assert 'toposerve_extender_call_seconds_count{verb="filter"} 2.0' in text
    run(ext, check)


def test_a_calls_phases_are_timed_the_wait_for_the_lock_apart() -> None:
    """A filter call that waits 0.2 s for the state's lock (a watch
    applying an event holds it) counts that wait as its lock phase, not as
    placement; each phase once a call."""
    ext, _ = extender()
    ext.state.relist("pods", [])
    pod = k.toposerve_pods("m", 2, claim_template="gpu4", level="rack", uid_prefix="m")[0]
    body = orjson.dumps({"Pod": pod, "NodeNames": NAMES})
    held = threading.Event()

    def watch() -> None:
        with ext.state.lock:
            held.set()
            time.sleep(0.2)

    t = threading.Thread(target=watch)
    t.start()
    held.wait(5)
    assert ext.answer("filter", body)[0] == 200
    t.join()
    got = ext.metrics.registry.get_sample_value

    def phase(name: str, what: str) -> float:
        v = got(f"toposerve_extender_call_phase_seconds_{what}",
                {"verb": "filter", "phase": name})
        assert v is not None
        return v
    assert [phase(p, "count") for p in ("lock", "view", "placement")] == [1.0] * 3
    assert phase("lock", "sum") >= 0.15
    assert phase("placement", "sum") < 0.15 and phase("view", "sum") > 0  # built on first use


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_https_given_a_certificate(tmp_path: Path) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    from toposerve.scheduler_ext.server import ssl_context

    cfg = ExtenderConfig(server={"certFile": str(cert), "keyFile": str(key)})
    ext, _ = extender()
    server_ctx = ssl_context(cfg)
    assert server_ctx is not None

    async def go() -> None:
        runner = web.AppRunner(ext.app())
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
        await site.start()
        port = runner.addresses[0][1]
        client_ctx = ssl.create_default_context(cafile=str(cert))
        try:
            async with ClientSession() as s:
                r = await s.get(f"https://127.0.0.1:{port}/health", ssl=client_ctx)
                assert r.status == 200
        finally:
            await runner.cleanup()
    asyncio.run(go())


def test_config_file_errors_name_the_field(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump({
        "apiVersion": "toposerve.io/v1", "kind": "ExtenderConfig",
        "placement": {"kvSizePerRequest": "2Gi", "promiseTTLSeconds": 30,
                      "defaultPreferredLevel": "rack"}}))
    cfg = load_extender_config(good)
    assert cfg.policy().kv_bytes == 2 * 2**30 and cfg.policy().promise_ttl_s == 30
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({
        "apiVersion": "toposerve.io/v1", "kind": "ExtenderConfig",
        "placement": {"defaultPreferredLevel": "shelf", "promiseTTL": 3}}))
    with pytest.raises(ConfigError) as err:
        load_extender_config(bad)
    text = str(err.value)
    assert "placement.defaultPreferredLevel" in text and "unknown level 'shelf'" in text
    assert "placement.promiseTTL" in text and "unknown field" in text


def test_scheduler_config_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["extender", "scheduler-config", "--url", "http://127.0.0.1:9999"]) == 0
    cfg = yaml.safe_load(capsys.readouterr().out)
    assert cfg == scheduler_config("http://127.0.0.1:9999")
    assert cfg["percentageOfNodesToScore"] == 100
    (ext,) = cfg["extenders"]
    assert ext["nodeCacheCapable"] is True and ext["managedResources"] == []
    assert ext["ignorable"] is True and ext["httpTimeout"] == "5s"
    assert main(["extender", "scheduler-config", "--url", "http://127.0.0.1:9999",
                 "--sampled"]) == 0
    sampled = yaml.safe_load(capsys.readouterr().out)
    assert "percentageOfNodesToScore" not in sampled and sampled["extenders"] == [ext]
    assert "profiles" not in sampled
    assert main(["extender", "scheduler-config", "--url", "http://127.0.0.1:9999",
                 "--scheduler-name", "groups", "--ungrouped-scheduler-name", "any"]) == 0
    two = yaml.safe_load(capsys.readouterr().out)
    assert two["percentageOfNodesToScore"] == 100  # the groups' profile: every node
    assert two["profiles"] == [{"schedulerName": "groups"},
                               {"schedulerName": "any", "percentageOfNodesToScore": 0}]
    assert main(["extender", "scheduler-config", "--url", "127.0.0.1:9999"]) == 2


@pytest.mark.parametrize(("flags", "says"), [
    (["--scheduler-name", "a", "--ungrouped-scheduler-name", "a"], "is already the groups'"),
    (["--ungrouped-scheduler-name", "default-scheduler"], "is already the groups'"),
    (["--ungrouped-scheduler-name", "Pods Of No Group"], "no pod could select"),
    (["--scheduler-name", "x" * 254], "no pod could select"),
])
def test_scheduler_config_refuses_profiles_no_scheduler_could_run(
        flags: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    # two profiles of one name stop the kube-scheduler at start; a name that is
    # no DNS subdomain is one no pod's spec.schedulerName can hold
    assert main(["extender", "scheduler-config", "--url", "http://127.0.0.1:9999",
                 *flags]) == 2
    out = capsys.readouterr()
    assert not out.out and says in out.err and len(out.err.strip().splitlines()) == 1


def test_every_config_field_is_documented() -> None:
    from pydantic import BaseModel

    page = (Path(__file__).parents[2] / "docs" / "extender.md").read_text()

    def fields(model: type[BaseModel], prefix: str = "") -> list[str]:
        out = []
        for name, f in model.model_fields.items():
            key = prefix + (f.alias or name)
            if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel):
                out += fields(f.annotation, key + ".")
            elif key not in ("apiVersion", "kind"):
                out.append(key)
        return out
    missing = [f for f in fields(ExtenderConfig) if f"| `{f}` |" not in page]
    assert not missing, f"docs/extender.md does not describe {missing}"


def _malformed() -> list[tuple[str, Any, str]]:
    """(verb, body, the field the answer must name) for requests of the
    wrong shape (each raised inside the extender, or was echoed, before)."""
    def pod(**md: Any) -> dict[str, Any]:
        p = ctl.pod("m", uid="u-m")
        p["metadata"].update(md)
        return p
    grouped = k.toposerve_pods("m", 2, claim_template="gpu4", uid_prefix="m")[0]
    grouped["metadata"]["labels"]["toposerve.io/topology-level"] = 5
    return [
        ("filter", {"Pod": ctl.pod("m"), "NodeNames": [[1]]}, "NodeNames.0"),
        ("filter", {"Pod": ctl.pod("m"), "NodeNames": [1, None]}, "NodeNames.0"),
        ("filter", {"Pod": {"metadata": "x"}, "NodeNames": NAMES}, "Pod.metadata"),
        ("filter", {"Pod": pod(labels="x"), "NodeNames": NAMES}, "Pod.metadata.labels"),
        ("prioritize", {"Pod": pod(annotations={"a": 1}), "NodeNames": NAMES},
         "Pod.metadata.annotations.a"),
        ("filter", {"Pod": {**ctl.pod("m"), "spec": "x"}, "NodeNames": NAMES}, "Pod.spec"),
        ("filter", {"Pod": {**ctl.pod("m"), "spec": {"containers": ["x"]}},
                    "NodeNames": NAMES}, "Pod.spec.containers.0"),
        ("filter", {"Pod": {**ctl.pod("m"), "spec": {"resourceClaims": [{"name": 3}]}},
                    "NodeNames": NAMES}, "Pod.spec.resourceClaims.0.name"),
        ("filter", {"Pod": grouped, "NodeNames": NAMES},
         "Pod.metadata.labels.toposerve.io/topology-level"),
        ("filter", {"Pod": ctl.pod("m"), "Nodes": {"items": [{"metadata": {}}]}},
         "Nodes.items.0.metadata.name"),
        ("preempt", {"Pod": ctl.pod("m"), "NodeNameToVictims": {"n": {"Pods": "x"}}},
         "NodeNameToVictims.n.Pods"),
        ("preempt", {"Pod": ctl.pod("m"), "NodeNameToVictims": ["x"]}, "NodeNameToVictims"),
        ("preempt", {"Pod": ctl.pod("m"), "NodeNameToMetaVictims": {
            "n": {"Pods": [{"UID": 1}], "NumPDBViolations": 0}}},
         "NodeNameToMetaVictims.n.Pods.0.UID"),
        ("preempt", orjson.dumps({"Pod": ctl.pod("m")})[:-1] +
         b',"NodeNameToMetaVictims":{"n":{"Pods":[],"NumPDBViolations":%d}}}' % 2**64,
         "NodeNameToMetaVictims.n.NumPDBViolations"),
        ("filter", [1], "(top level)"),
        ("filter", b"\xff\xfe", "(top level)"),
        ("filter", b'{"Pod": ' + b"[" * 1500 + b"]" * 1500 + b"}", "(top level)"),
    ]


def test_a_malformed_request_is_a_400_naming_the_field_never_a_crash_or_an_echo(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("toposerve.scheduler_ext.server.MAX_BODY", 4096)
    ext, written = extender()

    async def check(c: TestClient[Any, Any]) -> None:
        for verb, body, field in _malformed():
            r = await c.post(f"/{verb}", data=body if isinstance(body, bytes) else
                             orjson.dumps(body))
            assert r.status == 400 and r.content_type == "application/json", (body, r.status)
            error = orjson.loads(await r.read())["Error"]
            assert error.startswith(f"bad {verb} request: ") and f"{field}:" in error, error
        # a body past the bound: refused before it is read whole, in JSON too
        r = await c.post("/filter", data=orjson.dumps({"Pod": ctl.pod("m"),
                                                       "NodeNames": ["n" * 100] * 100}))
        assert r.status == 413 and "over 4096 bytes" in orjson.loads(await r.read())["Error"]
        # and the well-formed still pass
        status, body = await post(c, "filter", {"Pod": ctl.pod("m"), "NodeNames": NAMES[:3]})
        assert status == 200 and body["NodeNames"] == NAMES[:3]
    run(ext, check)
    assert written == []
    assert ext.state.names("pods") == set()


def test_a_group_bigger_than_any_cluster_is_refused_at_once_with_a_reason() -> None:
    ext, written = extender()
    sizes = {"10000000": "no group may have more than 100000",
             "1000000000000": "no group may have more than 100000",
             "9" * 30: "no group may have more than 100000",
             # under the cap but past every accelerator there is: summed, not laid out
             "90000": "needs 360000 accelerators for 90000 pods in one rack"}

    async def check(c: TestClient[Any, Any]) -> None:
        for size, reason in sizes.items():
            p = k.toposerve_pods(f"g{len(size)}", 1, claim_template="gpu4", level="rack",
                                 uid_prefix=f"g{len(size)}")[0]
            p["metadata"]["labels"]["toposerve.io/group-size"] = size
            started = time.perf_counter()
            status, body = await post(c, "filter", {"Pod": p, "NodeNames": NAMES})
            assert time.perf_counter() - started < 1.0, size
            assert status == 200 and body["NodeNames"] == [] and body["FailedNodes"] == {}
            assert reason in body["FailedAndUnresolvableNodes"][NAMES[0]], body
            status, scores = await post(c, "prioritize", {"Pod": p, "NodeNames": NAMES})
            assert status == 200 and scores == []
    run(ext, check)
    assert written == []


def test_pods_known_only_from_a_call_inform_it_and_are_not_kept() -> None:
    ext, _ = extender()
    tray = NAMES[0]
    with ext.state.lock:
        before = ext.state.snapshot().nodes[tray].free
    phantoms = []
    for i in range(50):  # fake uids, "bound" to the tray, asking its GPUs
        p = ctl.pod(f"ghost-{i}", uid=f"fake-{i}", labels={"toposerve.io/group": f"g{i}"},
                    spec={"nodeName": tray, "containers": [
                        {"name": "c", "resources": {"requests": {"nvidia.com/gpu": "4"}}}]})
        phantoms.append(p)
    real = k.toposerve_pods("real", 2, claim_template="gpu4", level="nvlink", uid_prefix="r")

    async def check(c: TestClient[Any, Any]) -> None:
        for p in phantoms:
            assert (await post(c, "filter", {"Pod": p, "NodeNames": NAMES}))[0] == 200
            assert (await post(c, "prioritize", {"Pod": p, "NodeNames": NAMES}))[0] == 200
        # the call itself was answered from the pod it named: here a pod the
        # watch has not shown yet, the first of its group, gets its domain
        status, body = await post(c, "filter", {"Pod": real[0], "NodeNames": NAMES})
        assert status == 200 and body["NodeNames"]
    run(ext, check)
    with ext.state.lock:
        view = ext.state.snapshot()
        assert view.nodes[tray].free == before  # no rack looks full of pods that are not
        assert view.groups == {}
    assert ext.state.names("pods") == set()
    assert not ext.state._members and not ext.state._pods_on and not ext.state._assumed


def _extender_cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    import os
    import sys
    env = {**os.environ, "HOME": str(tmp_path), "KUBECONFIG": ""}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    return subprocess.run([sys.executable, "-m", "toposerve.main", "extender", *args],
                          capture_output=True, text=True, timeout=60, env=env,
                          cwd=Path(__file__).parents[2])


def test_the_command_fails_in_one_line_before_it_says_serving(tmp_path: Path) -> None:
    import socket
    # no kubeconfig anywhere, no cluster around it
    got = _extender_cli(tmp_path, "--port", "0")
    assert got.returncode != 0 and "serving" not in got.stdout + got.stderr
    assert len(got.stderr.strip().splitlines()) == 1 and "kubeconfig" in got.stderr
    # a config file that is not UTF-8
    odd = tmp_path / "odd.yaml"
    odd.write_bytes(b"apiVersion: toposerve.io/v1\nkind: ExtenderConfig\n# \xff\xfe\n")
    got = _extender_cli(tmp_path, "--config", str(odd))
    assert got.returncode == 2 and got.stderr.strip().splitlines() == [
        f"error: {odd}: not UTF-8 text (byte 51): give a YAML file"]
    # a port that is taken (a kubeconfig whose API is nowhere: the watches retry)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "x", "cluster": {"server": "http://127.0.0.1:9"}}],
        "contexts": [{"name": "x", "context": {"cluster": "x", "user": "x"}}],
        "users": [{"name": "x", "user": {}}]}))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        got = _extender_cli(tmp_path, "--kubeconfig", str(kubeconfig), "--port", str(port))
    assert got.returncode == 2 and "serving" not in got.stdout + got.stderr
    assert got.stderr.strip().splitlines() == [  # bound before the watches start
        f"error: cannot listen on 127.0.0.1:{port}: Address already in use; change --host or "
        "--port"]


def test_the_timeout_is_a_duration_go_reads() -> None:
    """Decimals, never an exponent (Python's 1e-05s stops kube-scheduler);
    the chart writes the same for the same seconds."""
    from toposerve.scheduler_ext.scheduler_config import go_seconds

    assert [go_seconds(s) for s in (5, 2.5, 0.001, 10, 3600, 0.25)] == [
        "5s", "2.5s", "0.001s", "10s", "3600s", "0.25s"]
