"""Container images without a registry: OCI archives written here from
local static binaries, imported with ``ctr images import``. Nothing is
ever pulled (a pull would be traffic to a public registry)."""

from __future__ import annotations

import hashlib
import io
import json
import struct
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
PT_INTERP = 3


class ImageError(RuntimeError):
    pass


@dataclass(frozen=True)
class ImageSpec:
    name: str  # full reference, e.g. toposerve.local/busybox:1
    files: Mapping[str, Path]  # path in the image -> file on the host (mode kept)
    symlinks: Mapping[str, str]  # path in the image -> target
    entrypoint: Sequence[str]
    env: Sequence[str] = ("PATH=/bin",)


def is_static_elf(data: bytes) -> bool:
    """True for a 64-bit little-endian ELF without an interpreter (no
    dynamic loader needed inside an image that has no libc)."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return False
    phoff, = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    return all(struct.unpack_from("<I", data, phoff + i * phentsize)[0] != PT_INTERP
               for i in range(phnum))


def _add(tar: tarfile.TarFile, info: tarfile.TarInfo, data: bytes | None = None) -> None:
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    tar.addfile(info, io.BytesIO(data) if data is not None else None)


def layer_tar(spec: ImageSpec) -> bytes:
    """One uncompressed layer, byte-for-byte the same for the same inputs (so
    re-importing an unchanged image changes nothing)."""
    buf = io.BytesIO()
    dirs = {str(Path(p).parent).lstrip("/") for p in [*spec.files, *spec.symlinks]}
    dirs |= {"tmp", "etc", "proc", "sys", "dev"}
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(d for d in dirs if d):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            _add(tar, info)
        for path, src in sorted(spec.files.items()):
            data = src.read_bytes()
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), src.stat().st_mode & 0o7777
            _add(tar, info, data)
        for path, target in sorted(spec.symlinks.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            _add(tar, info)
    return buf.getvalue()


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def _json(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def oci_archive(spec: ImageSpec) -> bytes:
    """An OCI image layout as a tar, named by ``io.containerd.image.name``."""
    blobs: dict[str, bytes] = {}
    layer = layer_tar(spec)
    layer_desc = _blob(blobs, layer, LAYER_TYPE)
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Entrypoint": list(spec.entrypoint), "Env": list(spec.env)},
              "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]}}
    manifest = {"schemaVersion": 2, "mediaType": MANIFEST_TYPE,
                "config": _blob(blobs, _json(config), CONFIG_TYPE), "layers": [layer_desc]}
    manifest_desc = _blob(blobs, _json(manifest), MANIFEST_TYPE)
    manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
    manifest_desc["annotations"] = {"io.containerd.image.name": spec.name,
                                    "org.opencontainers.image.ref.name": spec.name.rsplit(":")[-1]}
    index = {"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": [manifest_desc]}
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        files = {"oci-layout": _json({"imageLayoutVersion": "1.0.0"}), "index.json": _json(index),
                 **{f"blobs/sha256/{d}": b for d, b in sorted(blobs.items())}}
        for d in ("blobs", "blobs/sha256"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            _add(tar, info)
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            _add(tar, info, data)
    return buf.getvalue()


def pause_image(name: str, pause: Path) -> ImageSpec:
    return ImageSpec(name=name, files={"/pause": pause}, symlinks={}, entrypoint=["/pause"])


def busybox_image(name: str, busybox: Path, applets: Sequence[str]) -> ImageSpec:
    """busybox with a link for each applet, so ``sh``, ``env``, ``cat`` ... work."""
    if not is_static_elf(busybox.read_bytes()):
        raise ImageError(f"{busybox} is not a static binary: apt-get install busybox-static")
    return ImageSpec(name=name, files={"/bin/busybox": busybox},
                     symlinks={f"/bin/{a}": "busybox" for a in applets if a != "busybox"},
                     entrypoint=["/bin/sh"])
