"""What NVML says about the node's NVIDIA GPUs, through NVIDIA's Python
binding ``nvidia-ml-py`` (module ``pynvml``): identity (UUID, product,
memory, architecture, compute capability, PCI bus id, minor),
the driver and CUDA versions, MIG profiles, the NVLink fabric (cluster UUID
and clique of GB200-class GPUs), and health (critical XID events, lost GPUs).

``Nvml.open`` returns None when ``libnvidia-ml.so.1`` cannot be loaded or
initialized: the driver then discovers from sysfs alone, says so once in
its log, and ``toposerve_dra_nvml_available`` is 0. In a pod the library
is the host's, found under its driver root (``find_library``).
"""

from __future__ import annotations

import ctypes
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from prometheus_client import Gauge

log = structlog.get_logger("dra.gpu.nvml")

NVML_AVAILABLE = Gauge("toposerve_dra_nvml_available",
                       "1 when the GPU driver reads its GPUs from NVML, 0 when sysfs only",
                       ["driver"])

# NVML_DEVICE_ARCH_* -> the names NVIDIA's DRA driver publishes
_ARCHITECTURES = {2: "Kepler", 3: "Maxwell", 4: "Pascal", 5: "Volta", 6: "Turing",
                  7: "Ampere", 8: "Ada Lovelace", 9: "Hopper", 10: "Blackwell", 13: "Rubin"}
_BRANDS = {1: "Quadro", 2: "Tesla", 3: "NVS", 5: "GeForce", 6: "Titan", 12: "Quadro RTX",
           13: "NVIDIA RTX", 14: "Nvidia"}
# Profiles published as partitions: the plain ones (not "+me", "+gfx", ...),
# the names the partition vocabulary takes.
_PLAIN_PROFILE = re.compile(r"^[0-9]+g\.[0-9]+gb$")
# Application XIDs that leave the GPU healthy; NVIDIA's drivers ignore them too.
IGNORED_XIDS = frozenset({13, 31, 43, 45, 68, 109})
SONAME = "libnvidia-ml.so.1"
# Where a driver root keeps it (RHEL-like, Debian-like x86 and Arm, others),
# searched in this order as NVIDIA's DRA driver does.
LIBRARY_DIRS = ("usr/lib64", "usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu",
                "lib64", "usr/lib")


@dataclass(frozen=True)
class MigProfile:
    id: int                  # NVML_GPU_INSTANCE_PROFILE_*
    name: str                # e.g. 1g.10gb
    memory_mb: int
    multiprocessors: int
    slices: int              # memory slices one instance takes
    placements: tuple[int, ...]


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    uuid: str
    name: str
    brand: str | None
    memory_bytes: int
    architecture: str | None
    compute_capability: str
    pci_bus_id: str          # lower case, 4-digit domain: as sysfs names it
    minor: int
    mig_enabled: bool
    mig_profiles: tuple[MigProfile, ...] | None  # None: not MIG-capable
    nvlink_domain: str | None  # "<cluster UUID>.<clique id>" once the fabric is up


@dataclass(frozen=True)
class NvmlNode:
    driver_version: str
    cuda_driver_version: str
    gpus: Mapping[str, NvmlGpu]  # by PCI bus id


@dataclass(frozen=True)
class Fabric:
    """A GPU's NVLink fabric registration (``nvmlGpuFabricInfo``)."""

    state: int    # NVML_GPU_FABRIC_STATE_*: 1 not started, 2 in progress, 3 completed
    status: int   # once completed: NVML_SUCCESS (0), or why it failed
    error: str = ""  # NVML's words for a failed status


@dataclass(frozen=True)
class XidEvent:
    pci_bus_id: str
    xid: int


def bus_id(nvml_bus_id: str) -> str:
    """NVML's ``00000000:18:00.0`` as sysfs writes it: ``0000:18:00.0``."""
    domain, rest = nvml_bus_id.lower().split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"


def _text(value: str | bytes) -> str:
    """A char array of an NVML struct (pynvml decodes some, not all)."""
    return value.decode() if isinstance(value, bytes) else value


def _cuda_version(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def find_library(driver_root: Path) -> Path | None:
    """The first ``libnvidia-ml.so.1`` in ``LIBRARY_DIRS`` of a driver root
    (``/`` of the host, or the GPU Operator's ``/run/nvidia/driver``, as
    mounted in the pod), or None."""
    for d in LIBRARY_DIRS:
        if (candidate := driver_root / d / SONAME).is_file():
            return candidate
    return None


def _unavailable(driver: str, reason: str, **fields: str) -> None:
    log.warning("NVML unavailable, discovering GPUs from sysfs only", driver=driver,
                reason=reason, **fields)
    NVML_AVAILABLE.labels(driver).set(0)


class Nvml:
    """An initialized NVML. Calls may come from any thread (NVML is
    thread-safe); the XID event set belongs to the one thread calling
    ``wait_xid``."""

    def __init__(self, pynvml: Any) -> None:
        self.nv = pynvml
        self._handles: dict[str, Any] = {}  # bus id -> handle, from the last discovery
        self._lock = threading.Lock()
        self._events: Any = None
        self._registered: set[str] = set()  # bus ids in the event set

    @classmethod
    def open(cls, driver: str, library: Path | None = None,
             driver_root: Path | None = None) -> Nvml | None:
        """NVML initialized, or None (logged once, metric 0) when the library
        is missing or will not initialize. ``library`` loads that file first,
        so ``libnvidia-ml.so.1`` resolves to it (a test's fake, or a path
        given by hand); otherwise ``driver_root`` is searched for it
        (``find_library``); with neither, the loader's search path."""
        try:
            import pynvml  # type: ignore[import-untyped]
        except ImportError:
            _unavailable(driver, "the nvidia-ml-py package is not installed "
                                 "(pip install 'toposerve[nvidia]')")
            return None
        if library is None and driver_root is not None:
            library = find_library(driver_root)
            if library is None:
                _unavailable(driver, f"no {SONAME} under the driver root {driver_root} "
                                     f"(searched {', '.join(LIBRARY_DIRS)})")
                return None
        try:
            if library is not None:
                # pynvml's loader takes no path, only the soname; a library
                # already loaded by path with that soname is the one it gets
                ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
            pynvml.nvmlInit()
        except (OSError, pynvml.NVMLError) as err:
            _unavailable(driver, str(err), library=str(library or SONAME))
            return None
        NVML_AVAILABLE.labels(driver).set(1)
        log.info("NVML initialized", driver=driver, library=str(library or SONAME),
                 driver_version=pynvml.nvmlSystemGetDriverVersion())
        return cls(pynvml)

    def close(self) -> None:
        with self._lock:
            if self._events is not None:
                self.nv.nvmlEventSetFree(self._events)
                self._events = None
        self.nv.nvmlShutdown()

    # -- discovery ------------------------------------------------------------

    def node(self) -> NvmlNode:
        """Every GPU NVML can reach now; one that is lost is left out (and
        logged): sysfs still publishes it, and health taints it."""
        nv = self.nv
        gpus: dict[str, NvmlGpu] = {}
        handles: dict[str, Any] = {}
        for i in range(nv.nvmlDeviceGetCount()):
            try:
                h = nv.nvmlDeviceGetHandleByIndex(i)
                g = self._gpu(i, h)
            except nv.NVMLError as err:
                log.warning("NVML cannot read a GPU", index=i, error=str(err))
                continue
            gpus[g.pci_bus_id] = g
            handles[g.pci_bus_id] = h
        with self._lock:
            self._handles.update(handles)
        return NvmlNode(driver_version=nv.nvmlSystemGetDriverVersion(),
                        cuda_driver_version=_cuda_version(nv.nvmlSystemGetCudaDriverVersion()),
                        gpus=gpus)

    def _gpu(self, index: int, h: Any) -> NvmlGpu:
        nv = self.nv
        major, minor = nv.nvmlDeviceGetCudaComputeCapability(h)
        mig, profiles = self._mig(h)
        return NvmlGpu(
            index=index, uuid=nv.nvmlDeviceGetUUID(h), name=nv.nvmlDeviceGetName(h),
            brand=_BRANDS.get(self._optional(nv.nvmlDeviceGetBrand, h, -1)),
            memory_bytes=int(nv.nvmlDeviceGetMemoryInfo(h).total),
            architecture=_ARCHITECTURES.get(self._optional(nv.nvmlDeviceGetArchitecture, h, -1)),
            compute_capability=f"{major}.{minor}",
            pci_bus_id=bus_id(_text(nv.nvmlDeviceGetPciInfo(h).busId)),
            minor=nv.nvmlDeviceGetMinorNumber(h), mig_enabled=mig, mig_profiles=profiles,
            nvlink_domain=self._fabric(h))

    def _optional(self, fn: Any, h: Any, default: Any) -> Any:
        """A query some GPUs or drivers do not support; a lost GPU still raises."""
        try:
            return fn(h)
        except (self.nv.NVMLError_NotSupported, self.nv.NVMLError_FunctionNotFound):
            return default

    def _mig(self, h: Any) -> tuple[bool, tuple[MigProfile, ...] | None]:
        nv = self.nv
        try:
            current, _ = nv.nvmlDeviceGetMigMode(h)
        except nv.NVMLError_NotSupported:
            return False, None
        out = []
        for pid in range(nv.NVML_GPU_INSTANCE_PROFILE_COUNT):
            try:
                info = nv.nvmlDeviceGetGpuInstanceProfileInfo(h, pid)
            except (nv.NVMLError_NotSupported, nv.NVMLError_InvalidArgument):
                continue
            name = _text(info.name).removeprefix("MIG ")
            if not _PLAIN_PROFILE.match(name):
                continue
            out.append(MigProfile(id=pid, name=name, memory_mb=int(info.memorySizeMB),
                                  multiprocessors=int(info.multiprocessorCount),
                                  slices=int(info.sliceCount),
                                  placements=self._placements(h, pid)))
        return current == nv.NVML_DEVICE_MIG_ENABLE, tuple(out)

    def _placements(self, h: Any, pid: int) -> tuple[int, ...]:
        nv = self.nv
        count = ctypes.c_uint(0)
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, pid, None, ctypes.byref(count))
        placements = (nv.c_nvmlGpuInstancePlacement_t * max(count.value, 1))()
        nv.nvmlDeviceGetGpuInstancePossiblePlacements(h, pid, placements, ctypes.byref(count))
        return tuple(int(placements[i].start) for i in range(count.value))

    def _fabric_info(self, h: Any) -> Any:
        """The fabric info struct, or None for a GPU (or driver) without one."""
        nv = self.nv
        info = nv.c_nvmlGpuFabricInfo_t()
        try:
            nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(info))
        except (nv.NVMLError_NotSupported, nv.NVMLError_FunctionNotFound):
            return None
        return None if info.state == nv.NVML_GPU_FABRIC_STATE_NOT_SUPPORTED else info

    def fabric(self, pci_bus_id: str) -> Fabric | None:
        """The GPU's fabric registration now (None: it has no fabric);
        ``ValueError`` when NVML cannot read the GPU (unknown, lost)."""
        nv = self.nv
        try:
            info = self._fabric_info(self._handle(pci_bus_id))
        except nv.NVMLError as err:
            raise ValueError(f"GPU {pci_bus_id}: NVML: {err}") from err
        if info is None:
            return None
        status = int(info.status)
        return Fabric(state=int(info.state), status=status,
                      error="" if status == nv.NVML_SUCCESS else _text(nv.nvmlErrorString(status)))

    def _fabric(self, h: Any) -> str | None:
        nv = self.nv
        info = self._fabric_info(h)
        if info is None:
            return None
        if info.state != nv.NVML_GPU_FABRIC_STATE_COMPLETED or info.status != nv.NVML_SUCCESS:
            return None  # not (yet) registered with the fabric manager
        raw = bytes(info.clusterUuid)
        if not any(raw):
            return None
        hexed = raw.hex()
        cluster = "-".join((hexed[:8], hexed[8:12], hexed[12:16], hexed[16:20], hexed[20:]))
        return f"{cluster}.{info.cliqueId}"

    # -- prepare ----------------------------------------------------------------

    def check_partition(self, pci_bus_id: str, profile: str, start: int) -> None:
        """Raise ``ValueError`` saying why a GPU instance of ``profile`` at
        ``start`` cannot exist on this GPU now: MIG mode off, the profile
        unknown, the placement impossible, or no capacity left."""
        nv = self.nv
        h = self._handle(pci_bus_id)
        try:
            current, pending = nv.nvmlDeviceGetMigMode(h)
            if current != nv.NVML_DEVICE_MIG_ENABLE:
                raise ValueError(f"GPU {pci_bus_id}: MIG mode is off (pending: "
                                 f"{'on' if pending == nv.NVML_DEVICE_MIG_ENABLE else 'off'})")
            _, profiles = self._mig(h)
            p = next((p for p in profiles or () if p.name == profile), None)
            if p is None:
                raise ValueError(f"GPU {pci_bus_id}: no MIG profile {profile}")
            if start not in p.placements:
                raise ValueError(f"GPU {pci_bus_id}: MIG profile {profile} cannot start at "
                                 f"slice {start} (possible: {list(p.placements)})")
            if nv.nvmlDeviceGetGpuInstanceRemainingCapacity(h, p.id) < 1:
                raise ValueError(f"GPU {pci_bus_id}: no capacity left for a {profile} "
                                 f"GPU instance")
        except nv.NVMLError as err:
            raise ValueError(f"GPU {pci_bus_id}: NVML: {err}") from err

    def _handle(self, pci_bus_id: str) -> Any:
        with self._lock:
            h = self._handles.get(pci_bus_id)
        if h is None:
            raise ValueError(f"GPU {pci_bus_id}: NVML does not know it")
        return h

    # -- health -------------------------------------------------------------

    def lost(self) -> set[str]:
        """Bus ids of the GPUs NVML answers GPU_IS_LOST for."""
        nv = self.nv
        with self._lock:
            handles = dict(self._handles)
        out = set()
        for bdf, h in handles.items():
            try:
                nv.nvmlDeviceGetUUID(h)
            except nv.NVMLError_GpuIsLost:
                out.add(bdf)
        return out

    def wait_xid(self, timeout_ms: int) -> XidEvent | None:
        """The next critical XID of any GPU known, or None after the timeout.
        GPUs discovered after the first call are registered on the next."""
        nv = self.nv
        with self._lock:
            handles = dict(self._handles)
            if self._events is None:
                self._events = nv.nvmlEventSetCreate()
            events = self._events
        for bdf, h in handles.items():
            if bdf not in self._registered:
                try:
                    nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, events)
                    self._registered.add(bdf)
                except nv.NVMLError as err:
                    log.warning("cannot watch a GPU's XID events", gpu=bdf, error=str(err))
        try:
            data = nv.nvmlEventSetWait(events, timeout_ms)
        except nv.NVMLError_Timeout:
            return None
        if data.eventType != nv.nvmlEventTypeXidCriticalError:
            return None
        address = ctypes.cast(data.device, ctypes.c_void_p).value
        for bdf, h in handles.items():
            if ctypes.cast(h, ctypes.c_void_p).value == address:
                return XidEvent(pci_bus_id=bdf, xid=int(data.eventData))
        return None
