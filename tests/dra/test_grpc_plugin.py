"""The framework's sockets through real gRPC, as the kubelet uses them:
registration, empty prepare, health stream, liveness, stale sockets,
rolling-update overlap and shutdown; claims whose names no apiserver gives,
and checkpoint entries that can never be undone, over a fake of the three
claim calls. (Real claims need a cluster: test_prepare_cluster.py.)"""

from __future__ import annotations

import fcntl
import socket
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest

from harness.dra_kubelet import Claim, Kubelet
from toposerve.dra_driver.kubeletplugin import plugin as plugin_module
from toposerve.dra_driver.kubeletplugin.cdi import CdiSpecs, ContainerEdits
from toposerve.dra_driver.kubeletplugin.checkpoint import (
    Checkpoint,
    CheckpointData,
    ClaimEntry,
    ClaimState,
    CorruptCheckpoint,
    PreparedDevice,
)
from toposerve.dra_driver.kubeletplugin.claim_status import UnwritableClaim
from toposerve.dra_driver.kubeletplugin.device_kind import AllocatedDevice, ClaimRef, PreparedEdits
from toposerve.dra_driver.kubeletplugin.liveness import (
    HttpEndpoints,
    healthz_route,
    metrics_route,
    probe,
)
from toposerve.dra_driver.kubeletplugin.plugin import KubeletPlugin, PluginConfig
from toposerve.dra_driver.kubeletplugin.sockets import GRPC_PATH_MAX, PathError, PluginPaths
from toposerve.dra_driver.resourceslice import Pool
from toposerve.kubeapi.typed import ApiException

DRIVER = "fake.toposerve.io"


class FakeKind:
    driver = DRIVER

    def enumerate(self) -> Sequence[Pool]:
        return [Pool(name="node-a", node_name="node-a",
                     devices=tuple({"name": f"dev-{i}"} for i in range(3)))]

    def validate_config(self, parameters: Mapping[str, Any]) -> Any:
        return dict(parameters)

    def prepare(self, claim: ClaimRef, devices: Sequence[AllocatedDevice]) -> PreparedEdits:
        return PreparedEdits(devices={d.device: ContainerEdits(env={"X": "1"}) for d in devices})

    def unprepare(self, claim: ClaimRef, devices: Sequence[str]) -> None:
        pass


class Sink:
    def __init__(self) -> None:
        self.pools: list[Sequence[Pool]] = []

    def set_pools(self, pools: Sequence[Pool]) -> None:
        self.pools.append(pools)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def _plugin(tmp: Path, pod_uid: str | None = None, sink: Sink | None = None) -> KubeletPlugin:
    paths = PluginPaths(driver=DRIVER, registry_dir=tmp / "registry", plugin_dir=tmp / "plugin",
                        pod_uid=pod_uid)
    cfg = PluginConfig(driver=DRIVER, node_name="node-a", paths=paths,
                       cdi=CdiSpecs(tmp / "cdi", "k8s.fake.toposerve.io", "dev"),
                       boot_id="boot-1", grace_s=1)
    return KubeletPlugin(cfg, FakeKind(), api=None, publisher=sink)


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[KubeletPlugin]:
    p = _plugin(tmp_path, sink=Sink())
    p.start()
    try:
        yield p
    finally:
        p.stop()


def test_registration(plugin: KubeletPlugin) -> None:
    kubelet = Kubelet(plugin.cfg.paths.registration_socket)
    info = kubelet.get_info()
    assert (info.type, info.name, info.endpoint) == (
        "DRAPlugin", DRIVER, str(plugin.cfg.paths.dra_socket))
    assert list(info.supported_versions) == [
        "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"]
    kubelet.notify(True)
    assert plugin.wait_registered(1)
    with pytest.raises(grpc.RpcError) as err:
        kubelet.notify(False, "version mismatch")
    assert "version mismatch" in str(err.value.details())
    assert not plugin.registration.registered and plugin.registration.error == "version mismatch"


@pytest.mark.parametrize("version", ["v1", "v1beta1"])
def test_empty_prepare_and_unprepare(plugin: KubeletPlugin, version: str) -> None:
    kubelet = Kubelet(plugin.cfg.paths.registration_socket)
    assert kubelet.prepare([], version) == {}
    assert kubelet.unprepare([], version) == {}


def test_liveness_and_metrics(plugin: KubeletPlugin) -> None:
    assert probe(plugin.cfg.paths.registration_socket, DRIVER) is None
    assert "not 'other'" in (probe(plugin.cfg.paths.registration_socket, "other") or "")
    http = HttpEndpoints("127.0.0.1", 0, {
        "/healthz": healthz_route(plugin.cfg.paths.registration_socket, DRIVER),
        "/metrics": metrics_route})
    http.start()
    try:
        base = f"http://127.0.0.1:{http.port}"
        with urllib.request.urlopen(f"{base}/healthz", timeout=10) as r:
            assert r.status == 200
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as r:
            body = r.read().decode()
        assert "toposerve_dra_prepare_seconds" in body
        assert "toposerve_dra_background_errors_total" in body
    finally:
        http.stop()
    plugin.stop()
    assert probe(plugin.cfg.paths.registration_socket, DRIVER, timeout_s=1) is not None


@pytest.mark.parametrize("version", ["v1", "v1alpha1"])
def test_health_stream_and_taints(plugin: KubeletPlugin, version: str) -> None:
    sink = plugin.publisher
    assert isinstance(sink, Sink)
    stream = Kubelet(plugin.cfg.paths.registration_socket, timeout=10).watch_health(version)
    first = next(stream)
    assert [(p, d, h) for p, d, h, _ in first] == [("node-a", f"dev-{i}", 0) for i in range(3)]
    plugin.health.report("node-a", "dev-1", False, "fell off the bus")
    second = next(stream)
    assert len(second) == 3  # every message lists every device
    assert ("node-a", "dev-1", 2, "fell off the bus") in second
    taints = {d["name"]: d.get("taints") for d in sink.pools[-1][0].devices}
    assert taints == {"dev-0": None, "dev-2": None, "dev-1": [
        {"key": f"{DRIVER}/unhealthy", "effect": "NoSchedule"}]}
    plugin.health.report("node-a", "dev-1", True)
    assert ("node-a", "dev-1", 1, "") in next(stream)
    assert all(not d.get("taints") for d in sink.pools[-1][0].devices)


def _stale_socket(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()  # the file stays, as after a crash


def test_stale_sockets_replaced_and_removed_on_stop(tmp_path: Path) -> None:
    p = _plugin(tmp_path)
    for sock in (p.cfg.paths.registration_socket, p.cfg.paths.dra_socket):
        _stale_socket(sock)
    p.start()
    assert Kubelet(p.cfg.paths.registration_socket).prepare([]) == {}
    p.stop()
    assert not p.cfg.paths.registration_socket.exists()
    assert not p.cfg.paths.dra_socket.exists()


def test_a_socket_grpc_cannot_bind_is_a_path_error(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """gRPC's own error is a bare RuntimeError "Failed to bind": the
    plugin's names the socket (a relative path: gRPC reads unix://plugin/...
    as host "plugin"; the command line makes its paths absolute)."""
    monkeypatch.chdir(tmp_path)
    p = _plugin(Path("."))
    with pytest.raises(PathError) as err:
        p.start()
    p.stop()
    assert err.value.filename == str(p.cfg.paths.dra_socket) == "plugin/dra.sock"
    assert err.value.strerror == "gRPC cannot listen there"
    assert not p.cfg.paths.registration_socket.exists()


def test_rolling_update_overlap_is_serialized(tmp_path: Path) -> None:
    old, new = _plugin(tmp_path, pod_uid="uid-old"), _plugin(tmp_path, pod_uid="uid-new")
    old.start()
    new.start()
    try:
        assert old.cfg.paths.registration_socket != new.cfg.paths.registration_socket
        kubelets = [Kubelet(p.cfg.paths.registration_socket, timeout=1) for p in (old, new)]
        assert [k.get_info().endpoint for k in kubelets] == [
            str(old.cfg.paths.dra_socket), str(new.cfg.paths.dra_socket)]
        # Another process holding the shared lock stops both from working.
        with open(old.cfg.paths.lock_file, "a+b") as f:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX)
            for k in kubelets:
                with pytest.raises(grpc.RpcError) as err:
                    k.prepare([])
                assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        for k in kubelets:
            assert k.prepare([]) == {}
    finally:
        old.stop()
        new.stop()
    assert not any((tmp_path / "registry").iterdir())


def test_corrupt_checkpoint_refuses_to_start(tmp_path: Path) -> None:
    p = _plugin(tmp_path)
    p.cfg.paths.data_dir.mkdir(parents=True)
    p.cfg.paths.checkpoint.write_text("{garbage")
    with pytest.raises(CorruptCheckpoint, match="left in place"):
        p.start()
    assert not p.cfg.paths.registration_socket.exists()
    assert p.cfg.paths.checkpoint.read_text() == "{garbage"


def test_checkpoint_corrupted_while_running_fails_liveness(plugin: KubeletPlugin) -> None:
    plugin.cfg.paths.checkpoint.write_text("{garbage")
    problem = probe(plugin.cfg.paths.registration_socket, DRIVER, timeout_s=5)
    assert problem is not None and "is corrupt" in problem
    assert plugin.cfg.paths.checkpoint.read_text() == "{garbage"


def test_socket_paths_longer_than_grpc_binds(tmp_path_factory: pytest.TempPathFactory) -> None:
    """AF_UNIX takes 108 bytes, gRPC's C core 105: the plugin still listens
    exactly where the kubelet looks."""
    # a short base: tmp_path itself (/tmp/pytest-of-root/pytest-10/<test name>_0)
    # can leave no room for the padding directory, and the path came out 106
    base = tmp_path_factory.mktemp("s")
    deep = base / ("d" * (107 - len(str(base)) - len("/registry/") - len(
        f"{DRIVER}-uid-long-reg.sock") - 1))
    p = _plugin(deep, pod_uid="uid-long")
    assert len(str(p.cfg.paths.registration_socket)) == 107 > GRPC_PATH_MAX
    p.start()
    try:
        assert p.cfg.paths.registration_socket.is_socket()
        assert Kubelet(p.cfg.paths.registration_socket).get_info().name == DRIVER
        assert probe(p.cfg.paths.registration_socket, DRIVER) is None
    finally:
        p.stop()
    assert not p.cfg.paths.registration_socket.exists()


# -- claims with names no apiserver gives, through the kubelet's gRPC -----------

UID_A, UID_B, UID_C = (f"0b7c5a56-0d0e-4f43-9a57-4f1d0a6f2a0{i}" for i in (1, 2, 3))


class FakeApi:
    """The three apiserver calls the plugin makes for a claim, over its module's
    names: every claim is allocated ``device`` for ``request`` on node-a."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.device, self.request = "dev-0", "r"
        self.clear_errors: dict[str, Exception] = {}  # by claim UID
        monkeypatch.setattr(plugin_module, "fetch_claim", self.fetch_claim)
        monkeypatch.setattr(plugin_module, "apply_device_status", lambda *a, **k: True)
        monkeypatch.setattr(plugin_module, "clear_device_status", self.clear_device_status)

    def fetch_claim(self, api: object, ref: ClaimRef) -> dict[str, Any]:
        return {"metadata": {"uid": ref.uid}, "status": {"allocation": {"devices": {"results": [
            {"request": self.request, "driver": DRIVER, "pool": "node-a",
             "device": self.device}]}}}}

    def clear_device_status(self, api: object, driver: str, ref: ClaimRef) -> bool:
        if ref.uid in self.clear_errors:
            raise self.clear_errors[ref.uid]
        return False


def _files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if not p.is_dir()}


@pytest.mark.parametrize("bad, field", [
    (Claim("default", "c", "x/../../escaped"), "claim UID"),
    (Claim("default", "c", "../../../escaped"), "claim UID"),
    (Claim("default", "c", "a" * 300), "claim UID"),
    (Claim("default", "c", UID_B[:-1] + "\x00"), "claim UID"),
    (Claim("../..", "c", UID_B), "claim namespace"),
    (Claim("default", "c/../../x", UID_B), "claim name"),
])
def test_a_malformed_claim_fails_alone_and_names_no_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: Claim, field: str) -> None:
    FakeApi(monkeypatch)
    p = _plugin(tmp_path)
    p.start()
    try:
        before = _files(tmp_path)
        kubelet = Kubelet(p.cfg.paths.registration_socket)
        good = Claim("default", "good", UID_A)
        out = kubelet.prepare([good, bad])
        assert out[bad.uid].error.startswith(f"prepare claim: {field} ")
        assert "\n" not in out[bad.uid].error and not out[bad.uid].devices
        assert not out[good.uid].error
        assert list(out[good.uid].devices[0].cdi_device_ids) == [
            f"k8s.fake.toposerve.io/dev={UID_A}-dev-0"]
        assert set(p.checkpoint.load()[0].claims) == {UID_A}
        # one spec, under the CDI root; nothing else anywhere
        assert _files(tmp_path) - before == {
            f"cdi/k8s.fake.toposerve.io_dev-{UID_A}.json", "plugin/checkpoint.json"}
        assert kubelet.unprepare([good, bad]) == {UID_A: "", bad.uid: ""}
        assert p.checkpoint.load()[0].claims == {} and p.cfg.cdi.claims() == set()
    finally:
        p.stop()


@pytest.mark.parametrize("device, request_name, field", [
    ("../../../escaped", "r", "device"), ("Dev-0", "r", "device"),
    ("dev-0", "r/../x", "request"), ("dev-0", "R", "request"),
])
def test_a_malformed_device_or_request_fails_its_claim(
        plugin: KubeletPlugin, monkeypatch: pytest.MonkeyPatch, device: str,
        request_name: str, field: str) -> None:
    api = FakeApi(monkeypatch)
    api.device, api.request = device, request_name
    out = Kubelet(plugin.cfg.paths.registration_socket).prepare([Claim("default", "c", UID_A)])
    assert out[UID_A].error.startswith(f"claim default/c: allocation result: {field} ")
    assert plugin.checkpoint.load()[0].claims == {} and plugin.cfg.cdi.claims() == set()


def _entry(state: ClaimState, namespace: str = "default", name: str = "c",
           device: str = "dev-0") -> ClaimEntry:
    return ClaimEntry(namespace=namespace, name=name, state=state, devices=[
        PreparedDevice(requests=["r"], pool="node-a", device=device)])


def test_entries_that_can_never_be_undone_are_dropped_not_retried_forever(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """As an older driver left them: recorded under names no apiserver gives,
    or failing an undo step for good; one failing for now stays."""
    api = FakeApi(monkeypatch)
    api.clear_errors = {UID_A: UnwritableClaim("the apiserver refuses every status update"),
                        UID_B: ApiException(status=422, reason="Unprocessable Entity"),
                        UID_C: ApiException(status=503, reason="Service Unavailable")}
    warned: list[tuple[dict[str, Any], str, str]] = []

    def warn(api: object, involved: dict[str, Any], reason: str, message: str,
             *_: str) -> bool:
        warned.append((involved, reason, message))
        return True

    monkeypatch.setattr(plugin_module, "warn_event", warn)
    p = _plugin(tmp_path)
    p.api = object()  # an apiserver's client, for the Events: warn_event is the test's
    escaped = tmp_path / "escaped.json"  # where an older driver wrote a `../` claim's spec
    escaped.write_text("{}")
    p.cfg.cdi.write(UID_A, {"dev-0": ContainerEdits(env={"X": "1"})}, ContainerEdits())
    Checkpoint(p.cfg.paths.checkpoint, "boot-1").save(CheckpointData(boot_id="boot-1", claims={
        "a" * 300: _entry(ClaimState.PREPARE_STARTED),
        UID_A[:-1] + "\x00": _entry(ClaimState.UNPREPARE_STARTED),
        "x/../../escaped": _entry(ClaimState.PREPARE_COMPLETED),
        UID_B[:-1] + "f": _entry(ClaimState.PREPARE_STARTED, device="../../x"),
        UID_A: _entry(ClaimState.PREPARE_STARTED),
        UID_B: _entry(ClaimState.UNPREPARE_STARTED),
        UID_C: _entry(ClaimState.PREPARE_STARTED),
    }))
    p.start()
    try:
        # the transient failure stays to be retried; everything else is gone
        assert set(p.checkpoint.load()[0].claims) == {UID_C}
        # each drop a Warning on its claim, saying what was given up and why
        assert sorted(i["uid"] for i, _, _ in warned) == sorted(
            ["a" * 300, UID_A[:-1] + "\x00", "x/../../escaped", UID_B[:-1] + "f", UID_A, UID_B])
        for involved, reason, message in warned:
            assert (involved["kind"], involved["namespace"], involved["name"], reason) == (
                "ResourceClaim", "default", "c", "DroppedFromCheckpoint")
            assert "gave up on this claim" in message and "may be left behind" in message
        assert p.cfg.cdi.claims() == set()  # the spec of the claim whose status is stuck too
        assert escaped.read_text() == "{}"  # outside the root: never touched
        del api.clear_errors[UID_C]
        assert Kubelet(p.cfg.paths.registration_socket).prepare([]) == {}
        assert p.checkpoint.load()[0].claims == {}
    finally:
        p.stop()


def test_an_unprepare_failing_for_good_ends(plugin: KubeletPlugin,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    api = FakeApi(monkeypatch)
    kubelet = Kubelet(plugin.cfg.paths.registration_socket)
    claim = Claim("default", "c", UID_A)
    assert not kubelet.prepare([claim])[UID_A].error
    api.clear_errors[UID_A] = UnwritableClaim("the apiserver refuses every status update")
    assert kubelet.unprepare([claim]) == {UID_A: ""}
    assert plugin.checkpoint.load()[0].claims == {} and plugin.cfg.cdi.claims() == set()
    api.clear_errors[UID_A] = ApiException(status=503, reason="Service Unavailable")
    assert not kubelet.prepare([claim])[UID_A].error
    assert "503" in kubelet.unprepare([claim])[UID_A]  # for now: the kubelet retries
    assert set(plugin.checkpoint.load()[0].claims) == {UID_A}
