"""The helper that turns a ``DeviceKind`` into a kubelet plugin (what Go
drivers get from ``kubeletplugin.Start``): the registration and DRA
sockets, claims fetched and checked, prepare/unprepare serialized across
processes, the checkpoint, CDI specs, claim status, slices and health.

A claim goes through the checkpoint as *PrepareStarted* (recorded before
any side effect) -> *PrepareCompleted* (after the last one) and, on
unprepare, *UnprepareStarted* -> gone. Anything not completed when the
lock is taken (a crash, an earlier failure, a checkpoint from another
boot) is undone first: the kind's unprepare, the CDI spec, our claim
status. So a crash at any point ends consistent after the next call or
restart, and the kubelet's retry prepares the claim afresh.

A claim is named by what the kubelet sends; one whose UID, namespace or
name (or a device or request of its allocation) is not of its Kubernetes
format fails its prepare and is never recorded (``validation``). An entry
that can never be undone (recorded by an older driver under such a name,
or an undo step failing in a way no retry changes) is dropped from the
checkpoint with an error in the log, never retried forever.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import grpc
import structlog

from toposerve.dra_driver.kubeletplugin import metrics, validation
from toposerve.dra_driver.kubeletplugin.cdi import CdiSpecs
from toposerve.dra_driver.kubeletplugin.checkpoint import (
    Checkpoint,
    CheckpointData,
    ClaimEntry,
    ClaimState,
    PreparedDevice,
)
from toposerve.dra_driver.kubeletplugin.claim_status import (
    DeviceStatus,
    UnwritableClaim,
    apply_device_status,
    clear_device_status,
)
from toposerve.dra_driver.kubeletplugin.claims import (
    ClaimError,
    allocated_devices,
    fetch_claim,
    reserved_pods,
)
from toposerve.dra_driver.kubeletplugin.device_kind import AllocatedDevice, ClaimRef, DeviceKind
from toposerve.dra_driver.kubeletplugin.health import DeviceHealth, HealthBoard, add_health_services
from toposerve.dra_driver.kubeletplugin.plugin_server import add_dra_services
from toposerve.dra_driver.kubeletplugin.registration import (
    RegistrationServicer,
    add_registration_service,
)
from toposerve.dra_driver.kubeletplugin.sockets import (
    PathError,
    PluginPaths,
    bind_error,
    grpc_target,
    make_folder,
    remove_stale_socket,
)
from toposerve.dra_driver.resourceslice import Pool
from toposerve.kubeapi.events import warn as warn_event
from toposerve.kubeapi.typed import ApiException

log = structlog.get_logger("dra.plugin")

# Test hook for the crash tests: the process SIGKILLs itself when it
# reaches the named point (see POINTS). Never set in production.
CRASH_ENV = "TOPOSERVE_DRA_CRASH_AT"
POINTS = ("prepare-started", "prepare-edits", "prepare-cdi", "prepare-status",
          "prepare-completed", "unprepare-started", "unprepare-devices", "unprepare-cdi",
          "unprepare-status", "unprepare-completed")


def crashpoint(name: str) -> None:
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


class PoolSink(Protocol):
    """What the plugin needs of ``publisher.SlicePublisher``."""

    def set_pools(self, pools: Sequence[Pool]) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


@dataclass(frozen=True)
class PluginConfig:
    driver: str
    node_name: str
    paths: PluginPaths
    cdi: CdiSpecs
    boot_id: str
    health_timeout_s: int = 60
    grace_s: float = 5.0
    workers: int = 8


@dataclass(frozen=True)
class PrepareResult:
    devices: tuple[PreparedDevice, ...] = ()
    error: str | None = None


@dataclass
class _Server:
    server: grpc.Server
    socket: Path
    inode: int = 0


@dataclass
class _Registration:
    registered: bool = False
    error: str = ""
    calls: int = 0
    changed: threading.Condition = field(default_factory=threading.Condition)


def taint_unhealthy(pools: Sequence[Pool], unhealthy: set[tuple[str, str]],
                    key: str) -> list[Pool]:
    """The pools with a NoSchedule taint ``key`` on each unhealthy device."""
    out = []
    for p in pools:
        devices = tuple(
            {**d, "taints": [*(d.get("taints") or []), {"key": key, "effect": "NoSchedule"}]}
            if (p.name, d["name"]) in unhealthy else d for d in p.devices)
        out.append(replace(p, devices=devices))
    return out


class Unrecoverable(Exception):
    """Undoing a claim failed in a way no retry changes; the message says how."""


def _permanent(err: Exception) -> bool:
    """An undo step that no retry can make succeed: a name refused as
    malformed, a path too long for the file system, a claim status the
    apiserver refuses for good (``UnwritableClaim``, or 400/422 to the
    request itself). Anything else (I/O, 403, 5xx, timeouts) is retried."""
    if isinstance(err, validation.InvalidName | UnwritableClaim):
        return True
    if isinstance(err, OSError):
        return err.errno == errno.ENAMETOOLONG
    return isinstance(err, ApiException) and err.status in (400, 422)


def _malformed(uid: str, entry: ClaimEntry) -> str | None:
    """Why a recorded claim cannot be named safely (an older driver recorded
    whatever the kubelet sent), if it cannot."""
    try:
        validation.claim(entry.namespace, entry.name, uid)
        for d in entry.devices:
            validation.label(d.device, "device")
    except validation.InvalidName as err:
        return str(err)
    return None


def _group(devices: Sequence[AllocatedDevice]) -> list[PreparedDevice]:
    """One entry per (pool, device, share), with every request it serves."""
    out: dict[tuple[str, str, str | None], PreparedDevice] = {}
    for d in devices:
        key = (d.pool, d.device, d.share_id)
        if key in out:
            out[key].requests.append(d.request)
        else:
            out[key] = PreparedDevice(requests=[d.request], pool=d.pool, device=d.device,
                                      share_id=d.share_id)
    return list(out.values())


class KubeletPlugin:
    def __init__(self, cfg: PluginConfig, kind: DeviceKind, api: Any,
                 publisher: PoolSink | None = None) -> None:
        self.cfg = cfg
        self.kind = kind
        self.api = api
        self.publisher = publisher
        self.health = HealthBoard(cfg.health_timeout_s, on_change=self._health_changed)
        self.checkpoint = Checkpoint(cfg.paths.checkpoint, cfg.boot_id)
        self.registration = _Registration()
        self._mutex = threading.Lock()
        self._servers: list[_Server] = []
        self._pools: list[Pool] = []
        self._pools_lock = threading.Lock()
        self._taint_key = f"{cfg.driver}/unhealthy"

    # -- lifecycle ----------------------------------------------------------

    def start(self) -> None:
        """Recover, serve the DRA socket, then the registration socket (so
        the kubelet never learns of an endpoint that is not up yet), then
        publish. Raises ``CorruptCheckpoint`` without serving anything, and
        ``PathError`` for a folder or socket that cannot be had."""
        paths = self.cfg.paths
        paths.check()
        make_folder(paths.data_dir)
        make_folder(paths.registry_dir)
        # before recovery and discovery, so that what is in the way is all said
        for socket in (paths.dra_socket, paths.registration_socket):
            if remove_stale_socket(socket):
                log.info("removed stale socket", socket=str(socket))
        with self._serialized():
            self._recover()
        self.refresh_pools()
        dra = grpc.server(futures.ThreadPoolExecutor(self.cfg.workers,
                                                     thread_name_prefix="dra-grpc"))
        versions = add_dra_services(dra, self) + add_health_services(dra, self.health)
        self._listen(dra, paths.dra_socket)
        reg = grpc.server(futures.ThreadPoolExecutor(2, thread_name_prefix="dra-registration"))
        add_registration_service(reg, RegistrationServicer(
            self.cfg.driver, str(paths.dra_socket), versions, self._registration_status))
        self._listen(reg, paths.registration_socket)
        if self.publisher is not None:
            self.publisher.start()
        log.info("plugin serving", driver=self.cfg.driver, node=self.cfg.node_name,
                 registration_socket=str(paths.registration_socket),
                 dra_socket=str(paths.dra_socket), versions=versions)

    def stop(self) -> None:
        """Registration socket first (the kubelet stops using us), then the
        DRA socket after in-flight calls finish; both files removed."""
        self.health.close()
        for s in reversed(self._servers):
            s.server.stop(self.cfg.grace_s).wait()
            with contextlib.suppress(FileNotFoundError):
                if s.socket.lstat().st_ino == s.inode:  # not a newer process's socket
                    s.socket.unlink()
        self._servers = []
        if self.publisher is not None:
            self.publisher.stop()
        log.info("plugin stopped", driver=self.cfg.driver)

    def _listen(self, server: grpc.Server, socket: Path) -> None:
        try:
            with grpc_target(socket) as target:
                server.add_insecure_port(target)
        except RuntimeError:  # gRPC's "Failed to bind", without a reason
            raise PathError(errno.EADDRNOTAVAIL, bind_error(socket), str(socket)) from None
        server.start()
        self._servers.append(_Server(server, socket, socket.lstat().st_ino))

    def _registration_status(self, registered: bool, error: str) -> None:
        with self.registration.changed:
            self.registration.registered = registered
            self.registration.error = error
            self.registration.calls += 1
            self.registration.changed.notify_all()
        metrics.REGISTERED.labels(self.cfg.driver).set(1 if registered else 0)
        if registered:
            log.info("registered with the kubelet", driver=self.cfg.driver)
            # A restarting kubelet deletes our slices: publish on every registration.
            self.refresh_pools()
        else:
            log.error("kubelet refused registration", driver=self.cfg.driver, error=error)

    def wait_registered(self, timeout: float) -> bool:
        with self.registration.changed:
            return self.registration.changed.wait_for(lambda: self.registration.registered,
                                                      timeout)

    # -- slices and health ---------------------------------------------------

    def refresh_pools(self) -> None:
        """Enumerate the devices again and hand the pools to the publisher,
        unhealthy devices tainted."""
        try:
            pools = list(self.kind.enumerate())
        except Exception as err:
            metrics.BACKGROUND_ERRORS.labels(self.cfg.driver, "enumerate").inc()
            log.error("enumerating devices failed", driver=self.cfg.driver, error=str(err))
            return
        with self._pools_lock:
            self._pools = pools
        self.health.set_devices((p.name, d["name"]) for p in pools for d in p.devices)
        self._publish()

    def _publish(self) -> None:
        with self._pools_lock:
            pools = taint_unhealthy(self._pools, self.health.unhealthy(), self._taint_key)
        if self.publisher is not None:
            self.publisher.set_pools(pools)

    def _health_changed(self, snapshot: list[DeviceHealth]) -> None:
        for d in snapshot:
            metrics.DEVICE_HEALTHY.labels(self.cfg.driver, d.pool, d.device).set(
                {0: -1, 1: 1, 2: 0}[int(d.health)])
        self._publish()

    def pool_names(self) -> set[str]:
        with self._pools_lock:
            return {p.name for p in self._pools}

    # -- prepare / unprepare ---------------------------------------------------

    @contextlib.contextmanager
    def _serialized(self) -> Iterator[None]:
        """One call at a time, in this process and across processes (two
        plugin pods overlap during a rolling update)."""
        with self._mutex:
            self.cfg.paths.data_dir.mkdir(parents=True, exist_ok=True)
            with open(self.cfg.paths.lock_file, "a+b") as f:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX)
                try:
                    yield
                finally:
                    fcntl.flock(f.fileno(), fcntl.LOCK_UN)

    def prepare(self, claims: Sequence[ClaimRef]) -> dict[str, PrepareResult]:
        started = {c.uid: time.monotonic() for c in claims}
        out: dict[str, PrepareResult] = {}
        ready: list[tuple[ClaimRef, list[AllocatedDevice]]] = []
        pools = self.pool_names()
        if claims and not pools:  # enumerating failed at start (API down?): try again
            self.refresh_pools()
            pools = self.pool_names()
        for ref in claims:  # API reads before taking the lock, as the Go helper does
            try:
                validation.claim(ref.namespace, ref.name, ref.uid)  # before it names anything
                claim = fetch_claim(self.api, ref)
                ref = replace(ref, pod_uids=reserved_pods(claim))
                ready.append((ref, allocated_devices(claim, ref, self.cfg.driver,
                                                     self.cfg.node_name, pools,
                                                     self.kind.validate_config)))
            except ClaimError as err:
                out[ref.uid] = PrepareResult(error=str(err))
            except validation.InvalidName as err:
                out[ref.uid] = PrepareResult(error=f"prepare claim: {err}")
            except Exception as err:  # a bug in a kind's validation fails its claim alone
                out[ref.uid] = PrepareResult(error=f"prepare claim {ref}: {err!r}")
        if ready or not claims:
            try:
                with self._serialized():
                    data = self._recover()
                    for ref, devices in ready:
                        out[ref.uid] = self._prepare_one(data, ref, devices)
            except Exception as err:
                if not claims:
                    raise  # the liveness probe's empty call: fail it, loudly
                for ref, _ in ready:  # e.g. the checkpoint turned corrupt: say so per claim
                    out.setdefault(ref.uid, PrepareResult(error=f"prepare claim {ref}: {err}"))
        for ref in claims:
            res = out[ref.uid]
            result = "error" if res.error else "ok"
            elapsed = time.monotonic() - started[ref.uid]
            metrics.PREPARE_SECONDS.labels(self.cfg.driver, result).observe(elapsed)
            log.info("prepare", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid, result=result,
                     error=res.error, devices=[d.device for d in res.devices],
                     seconds=round(elapsed, 4))
        return out

    def _prepare_one(self, data: CheckpointData, ref: ClaimRef,
                     devices: list[AllocatedDevice]) -> PrepareResult:
        entry = data.claims.get(ref.uid)
        if entry is not None and entry.state == ClaimState.PREPARE_COMPLETED:
            return PrepareResult(devices=tuple(entry.devices))  # idempotent
        entry = ClaimEntry(namespace=ref.namespace, name=ref.name,
                           state=ClaimState.PREPARE_STARTED, devices=_group(devices))
        try:
            self._save(data, ref.uid, entry)
        except OSError as err:  # nothing done yet, nothing to undo
            data.claims.pop(ref.uid, None)
            return PrepareResult(error=f"prepare claim {ref.namespace}/{ref.name}: "
                                       f"cannot write the checkpoint: {err}")
        crashpoint("prepare-started")
        try:
            edits = self.kind.prepare(ref, devices)
            crashpoint("prepare-edits")
            names = [d.device for d in entry.devices]
            missing = [n for n in names if n not in edits.devices]
            if missing:
                raise ClaimError(f"the driver prepared no edits for {', '.join(missing)}")
            ids = self.cfg.cdi.write(ref.uid, {n: edits.devices[n] for n in names}, edits.common)
            crashpoint("prepare-cdi")
            status = [DeviceStatus(pool=d.pool, device=d.device, share_id=d.share_id,
                                   data=edits.data.get(d.device, {}),
                                   network_data=edits.network_data.get(d.device, {}))
                      for d in entry.devices]
            if not apply_device_status(self.api, self.cfg.driver, ref, status):
                raise ClaimError("the claim was deleted or replaced while being prepared")
            crashpoint("prepare-status")
            done = ClaimEntry(namespace=ref.namespace, name=ref.name,
                              state=ClaimState.PREPARE_COMPLETED,
                              devices=[d.model_copy(update={"cdi_device_ids": [ids[d.device]]})
                                       for d in entry.devices])
            self._save(data, ref.uid, done)
            crashpoint("prepare-completed")
            return PrepareResult(devices=tuple(done.devices))
        except Exception as err:
            msg = f"prepare claim {ref.namespace}/{ref.name}: {err}"
            try:
                try:
                    self._undo(ref, entry)
                except Unrecoverable as lost:
                    self._dropping(ref.uid, entry, str(lost))
                    msg += f"; undoing it failed for good ({lost}), dropped from the checkpoint"
                self._save(data, ref.uid, None)
            except Exception as undo_err:
                # Left as PrepareStarted: the next call or restart undoes it.
                msg += f"; undoing it failed too ({undo_err}), will retry"
            return PrepareResult(error=msg)

    def unprepare(self, claims: Sequence[ClaimRef]) -> dict[str, str | None]:
        out: dict[str, str | None] = {}
        valid = []
        for ref in claims:
            try:
                validation.claim(ref.namespace, ref.name, ref.uid)
                valid.append(ref)
            except validation.InvalidName as err:
                # never prepared under such a name (prepare refuses it, recovery
                # drops an older driver's entry): nothing to undo, and an error
                # would have the kubelet retry forever
                out[ref.uid] = None
                log.warning("unprepare of a malformed claim: nothing to do", error=str(err))
        try:
            with self._serialized():
                data = self._recover()
                for ref in valid:
                    t0 = time.monotonic()
                    out[ref.uid] = self._unprepare_one(data, ref)
                    self._observe_unprepare(ref, out[ref.uid], time.monotonic() - t0)
        except Exception as err:
            if not claims:
                raise
            for ref in claims:
                if ref.uid not in out:
                    out[ref.uid] = f"unprepare claim {ref}: {err}"
                    self._observe_unprepare(ref, out[ref.uid], 0.0)
        return out

    def _observe_unprepare(self, ref: ClaimRef, error: str | None, elapsed: float) -> None:
        result = "error" if error else "ok"
        metrics.UNPREPARE_SECONDS.labels(self.cfg.driver, result).observe(elapsed)
        log.info("unprepare", claim=f"{ref.namespace}/{ref.name}", uid=ref.uid, result=result,
                 error=error, seconds=round(elapsed, 4))

    def _unprepare_one(self, data: CheckpointData, ref: ClaimRef) -> str | None:
        entry = data.claims.get(ref.uid)
        if entry is None:
            return None  # never prepared here, or already unprepared
        entry = entry.model_copy(update={"state": ClaimState.UNPREPARE_STARTED})
        self._save(data, ref.uid, entry)
        crashpoint("unprepare-started")
        try:
            self._undo(ref, entry, crash=True)
        except Unrecoverable as lost:
            self._dropping(ref.uid, entry, str(lost))  # the kubelet's retry would change nothing
        except Exception as err:
            # Stays UnprepareStarted: finished by the next call or restart.
            return f"unprepare claim {ref.namespace}/{ref.name}: {err}"
        self._save(data, ref.uid, None)
        crashpoint("unprepare-completed")
        return None

    def _undo(self, ref: ClaimRef, entry: ClaimEntry, crash: bool = False) -> None:
        """Every side effect of prepare, taken back; each step idempotent.
        A step failing for good (``_permanent``) does not stop the later
        ones, and then ``Unrecoverable`` says the entry can only be dropped."""
        steps: list[tuple[str, Callable[[], object]]] = [
            ("unprepare-devices", lambda: self.kind.unprepare(ref, [d.device
                                                                    for d in entry.devices])),
            ("unprepare-cdi", lambda: self.cfg.cdi.remove(ref.uid)),
            ("unprepare-status", lambda: clear_device_status(self.api, self.cfg.driver, ref)),
        ]
        lost = []
        for point, step in steps:
            try:
                step()
            except Exception as err:
                if not _permanent(err):
                    raise
                lost.append(f"{point.removeprefix('unprepare-')}: {err}")
            if crash:
                crashpoint(point)
        if lost:
            raise Unrecoverable("; ".join(lost))

    def _dropping(self, uid: str, entry: ClaimEntry, why: str) -> None:
        """Say that an entry that can never be undone leaves the checkpoint."""
        metrics.BACKGROUND_ERRORS.labels(self.cfg.driver, "dropped-claim").inc()
        devices = [d.device for d in entry.devices]
        log.error("dropping a claim from the checkpoint: it can never be undone; what it "
                  "prepared may be left behind", uid=uid, claim=f"{entry.namespace}/{entry.name}",
                  state=entry.state.value, devices=devices, error=why)
        if self.api is None:  # run without an apiserver: the log line is all
            return
        # where its owner looks (kubectl describe resourceclaim); a claim under
        # names no apiserver gives gets none, the log line above is all
        warn_event(self.api, {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                              "namespace": entry.namespace, "name": entry.name, "uid": uid},
                   "DroppedFromCheckpoint",
                   f"{self.cfg.driver} on node {self.cfg.node_name} gave up on this claim "
                   f"({entry.state.value}, devices {', '.join(devices) or 'none'}): {why}. What "
                   "it prepared may be left behind on the node", self.cfg.driver,
                   self.cfg.node_name)

    def _save(self, data: CheckpointData, uid: str, entry: ClaimEntry | None) -> None:
        if entry is None:
            data.claims.pop(uid, None)
        else:
            data.claims[uid] = entry
        self.checkpoint.save(data)
        metrics.PREPARED_CLAIMS.labels(self.cfg.driver).set(
            sum(1 for e in data.claims.values() if e.state == ClaimState.PREPARE_COMPLETED))

    def _recover(self) -> CheckpointData:
        """Load the checkpoint (``CorruptCheckpoint`` propagates) and undo
        whatever is not *PrepareCompleted*; a checkpoint from another boot
        is undone whole. An entry under a malformed name, or whose undo
        fails for good, is dropped. Then drop CDI specs no completed claim
        owns."""
        data, other_boot = self.checkpoint.load()
        self.checkpoint.remove_temp_files()
        if other_boot:
            log.warning("checkpoint is from an earlier boot: its claims are no longer prepared",
                        claims=len(data.claims))
            data.claims = {uid: e.model_copy(update={"state": ClaimState.UNPREPARE_STARTED})
                           for uid, e in data.claims.items()}
            self.checkpoint.save(data)
        for uid, entry in list(data.claims.items()):
            if (malformed := _malformed(uid, entry)) is not None:
                # not even its CDI spec can be named safely: nothing is touched
                self._dropping(uid, entry, malformed)
                self._save(data, uid, None)
                continue
            if entry.state == ClaimState.PREPARE_COMPLETED:
                continue
            ref = ClaimRef(namespace=entry.namespace, name=entry.name, uid=uid)
            try:
                self._undo(ref, entry)
            except Unrecoverable as lost:
                self._dropping(uid, entry, str(lost))
                self._save(data, uid, None)
                continue
            except Exception as err:
                metrics.BACKGROUND_ERRORS.labels(self.cfg.driver, "recovery").inc()
                log.error("undoing an unfinished claim failed; will retry", uid=uid,
                          state=entry.state.value, error=str(err))
                continue
            log.info("undid an unfinished claim", uid=uid, state=entry.state.value)
            self._save(data, uid, None)
        removed = self.cfg.cdi.remove_all_but(data.claims)
        if removed:
            log.info("removed CDI specs of claims not prepared", claims=removed)
        return data

