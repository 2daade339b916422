"""The fake ``libnvidia-ml.so.1`` (``tests/dra/fake_nvml/fake_nvml.c``):
built once per source hash with ``cc -shared -fPIC``, and the scenario files
it answers from, written from the hardware model so NVML and sysfs agree on
bus ids. The library reads ``$TOPOSERVE_FAKE_NVML`` (the scenario) at each
``nvmlInit``; ``inject_xid``, ``set_lost`` and ``set_fabric`` change a
running scenario."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from toposerve.topology.model import DeviceKind, NodeHardware

SOURCE = Path(__file__).resolve().parent.parent / "tests/dra/fake_nvml/fake_nvml.c"
ENV = "TOPOSERVE_FAKE_NVML"
SONAME = "libnvidia-ml.so.1"
HOPPER, BLACKWELL, ADA, AMPERE = 9, 10, 8, 7  # NVML_DEVICE_ARCH_*
_NS = uuid.UUID("0b8a3c6e-6a57-4a8e-9d1c-4f3c1e2a7d90")


def build(cache: Path | None = None) -> Path:
    """The library's path, compiled on first use (cached by source hash)."""
    source = SOURCE.read_bytes()
    base = cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "toposerve"
    out = base / "fake-nvml" / hashlib.sha256(source).hexdigest()[:16] / SONAME
    if out.exists():
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc) to build the fake NVML library")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Wno-format-truncation",
                    f"-Wl,-soname,{SONAME}", "-o", str(tmp), str(SOURCE)], check=True)
    tmp.replace(out)
    return out


@dataclass(frozen=True)
class FakeProfile:
    """One GPU instance profile: ``profile`` line of the scenario."""

    id: int
    name: str
    slices: int
    instances: int
    multiprocessors: int
    memory_mb: int
    remaining: int
    placements: tuple[int, ...]


# H100 80GB's MIG profiles as NVML lists them (the ones with a plain name).
H100_PROFILES = (
    FakeProfile(0, "1g.10gb", 1, 7, 16, 9856, 7, (0, 1, 2, 3, 4, 5, 6)),
    FakeProfile(1, "2g.20gb", 2, 3, 32, 19968, 3, (0, 2, 4)),
    FakeProfile(2, "3g.40gb", 4, 2, 60, 40192, 2, (0, 4)),
    FakeProfile(3, "4g.40gb", 4, 1, 64, 40192, 1, (0,)),
    FakeProfile(4, "7g.80gb", 8, 1, 132, 80768, 1, (0,)),
)


@dataclass(frozen=True)
class FakeGpu:
    bus_id: str  # sysfs form, 0000:18:00.0
    name: str = "NVIDIA H100 80GB HBM3"
    memory: int = 85520809984
    arch: int = HOPPER
    cc: str = "9.0"
    minor: int = 0
    brand: int = 14  # NVML_BRAND_NVIDIA
    pci_device_id: str = "2330"
    uuid: str = ""
    mig_mode: int | None = None  # None: not MIG-capable
    profiles: tuple[FakeProfile, ...] = ()
    fabric: tuple[str, int] | None = None  # (cluster UUID, clique id)

    def lines(self) -> list[str]:
        out = ["gpu", f"uuid {self.uuid or f'GPU-{uuid.uuid5(_NS, self.bus_id)}'}",
               f"name {self.name}", f"bus_id {self.bus_id.upper().rjust(16, '0')}",
               f"memory {self.memory}", f"arch {self.arch}", f"cc {self.cc}",
               f"minor {self.minor}",
               f"brand {self.brand}", f"pci_device_id {self.pci_device_id}"]
        if self.mig_mode is not None:
            out.append(f"mig_mode {self.mig_mode}")
        out += [f"profile {p.id} {p.name} {p.slices} {p.instances} {p.multiprocessors} "
                f"{p.memory_mb} {p.remaining} {','.join(map(str, p.placements))}"
                for p in self.profiles]
        if self.fabric is not None:
            out += [f"fabric_cluster {self.fabric[0]}", f"fabric_clique {self.fabric[1]}",
                    "fabric_state 3"]
        return out


@dataclass(frozen=True)
class Scenario:
    gpus: Sequence[FakeGpu]
    driver_version: str = "580.65.06"
    cuda_version: int = 13000  # 1000 * major + 10 * minor

    def write(self, path: Path) -> Path:
        lines = [f"driver_version {self.driver_version}", f"cuda_version {self.cuda_version}"]
        for g in self.gpus:
            lines += g.lines()
        path.write_text("\n".join(lines) + "\n")
        for suffix in (".xid", ".lost", ".fabric"):
            Path(f"{path}{suffix}").unlink(missing_ok=True)
        return path


def gpus_of(hw: NodeHardware, **kw: object) -> list[FakeGpu]:
    """One FakeGpu per NVIDIA GPU of ``hw``, in bus order, with ``kw`` set."""
    places = [p for p in hw.places()
              if p.device.kind == DeviceKind.GPU and p.device.vendor_id == "0x10de"]
    places.sort(key=lambda p: p.device.pci_bus_id)
    return [FakeGpu(bus_id=p.device.pci_bus_id, minor=i, **kw)  # type: ignore[arg-type]
            for i, p in enumerate(places)]


def inject_xid(scenario: Path, index: int, xid: int) -> None:
    """A critical XID on GPU ``index``, delivered once by nvmlEventSetWait."""
    with open(f"{scenario}.xid", "a") as f:
        f.write(f"{index} {xid}\n")


def set_lost(scenario: Path, indices: Iterable[int]) -> None:
    """These GPUs answer NVML_ERROR_GPU_IS_LOST from now on (none: all back)."""
    Path(f"{scenario}.lost").write_text("".join(f"{i}\n" for i in indices))


# NVML_GPU_FABRIC_STATE_*
FABRIC_NOT_STARTED, FABRIC_IN_PROGRESS, FABRIC_COMPLETED = 1, 2, 3


def set_fabric(scenario: Path, index: int, state: int, status: int = 0) -> None:
    """GPU ``index``'s NVLink fabric registration from now on: a state
    (``FABRIC_*``) and, once completed, its status (0: registered; an NVML
    error code: failed)."""
    with open(f"{scenario}.fabric", "a") as f:
        f.write(f"{index} {state} {status}\n")
