"""Which archive of ``make image`` belongs to this tree: ``hack/build-image.sh``
names each archive ``<name>-<key>.oci.tar`` in the tool cache, the key a
hash of the image's inputs (the script itself, the base image's recipe, the
Containerfile, the build context: the product's files as git lists them, the
wheels, the toposerve-nic binary, the kube-scheduler binary). This computes
the same keys, so an install takes the archive built from the tree it runs
from and refuses one built from another (tests/realnode hold the keys equal
to the script's after a real ``make image``)."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from toposerve.localcluster.realnode.forwarder import binary as nic_binary
from toposerve.localcluster.tools import cache_dir, versions

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "hack/build-image.sh"
NAMES = ("toposerve", "redis", "kube-scheduler")


class CannotTell(RuntimeError):
    """The keys cannot be computed here (not a checkout with its build
    script, or git missing); the message says why."""


@dataclass(frozen=True)
class Body:
    """A file by its contents (the script's temp files)."""

    data: bytes


@dataclass(frozen=True)
class Context:
    """A build context the script stages by copying: each file's name in
    it and where it is copied from (the key is computed without the copy)."""

    files: tuple[tuple[str, Path], ...]


def _sum(data: bytes, name: str) -> bytes:
    return hashlib.sha256(data).hexdigest().encode() + f"  {name}\n".encode()


def key(*args: str | Path | Body | Context) -> str:
    """The script's ``key``: a string on a line of its own, a file's
    ``sha256sum <file`` line, a directory's ``(cd dir && find . -type f
    -print0 | LC_ALL=C sort -z | xargs -0r sha256sum)`` lines; their
    sha256, 16 hex digits."""
    out = b""
    for a in args:
        if isinstance(a, Body):
            out += _sum(a.data, "-")
        elif isinstance(a, Context):
            for name, src in sorted(a.files, key=lambda x: ("./" + x[0]).encode()):
                out += _sum(src.read_bytes(), "./" + name)
        elif isinstance(a, Path) and a.is_dir():
            out += key_lines_of_dir(a)
        elif isinstance(a, Path):
            out += _sum(a.read_bytes(), "-")
        else:
            out += a.encode() + b"\n"
    return hashlib.sha256(out).hexdigest()[:16]


def key_lines_of_dir(d: Path) -> bytes:
    files = [p for p in d.rglob("*") if p.is_file() and not p.is_symlink()]
    return b"".join(_sum(p.read_bytes(), "./" + name) for name, p in sorted(
        ((str(p.relative_to(d)), p) for p in files), key=lambda x: ("./" + x[0]).encode()))


def debian_base(name: str, packages: Iterable[str]) -> str:
    """The name ``debian_base`` gives the Debian base it makes with mmdebstrap."""
    suite = os.environ.get("DEBIAN_SUITE", "bookworm")
    mirror = os.environ.get("DEBIAN_MIRROR", "http://deb.debian.org")
    opts = ["--variant=essential", f"--include={','.join(packages)}",
            "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
            "--dpkgopt=path-exclude=/usr/share/man/*", "--dpkgopt=path-exclude=/usr/share/info/*",
            "--dpkgopt=path-exclude=/usr/share/locale/*",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            '--aptopt=Acquire::Languages "none"',
            '--customize-hook=rm -rf "$1"/var/lib/apt "$1"/var/cache/apt "$1"/var/log/*']
    sources = [f"deb {mirror}/debian {suite} main", f"deb {mirror}/debian {suite}-updates main",
               f"deb {mirror}/debian-security {suite}-security main"]
    return f"localhost/toposerve-base/{name}:{suite}-{key(*opts, *sources)}"


def _requirements(pyproject: dict[str, Any]) -> bytes:
    """What ``wheelhouse`` writes to requirements.txt: the dependencies, the
    Containerfile's EXTRAS, the build backend."""
    m = re.search(r"^ARG EXTRAS=(.*)$", (ROOT / "Containerfile").read_text(), re.M)
    project = pyproject["project"]
    extras = [r for e in (m.group(1) if m else "").split(",")
              for r in project["optional-dependencies"][e]]
    reqs = [*project["dependencies"], *extras, *pyproject["build-system"]["requires"]]
    return ("\n".join(reqs) + "\n").encode()


def _product_files(pyproject: dict[str, Any]) -> list[str]:
    """What ``stage_toposerve`` copies: git's tracked and unignored files
    among pyproject.toml, README.md and the packages, regular files only."""
    folders = sorted(set(pyproject["tool"]["setuptools"]["package-dir"].values()))
    try:
        out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "--",
                              "pyproject.toml", "README.md", *folders],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        raise CannotTell(f"git ls-files in {ROOT} failed: {err}") from None
    return [f for f in out.splitlines() if (ROOT / f).is_file()]


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def python_base() -> str:
    """The toposerve image's base: ``TOPOSERVE_IMAGE_BASE`` or the Debian one."""
    return os.environ.get("TOPOSERVE_IMAGE_BASE") or debian_base(
        "python3", ["python3", "python3-venv", "libstdc++6"])


def build_base() -> str:
    """The build stage's base: ``TOPOSERVE_IMAGE_BUILD_BASE``, the custom base, or
    the Debian one with binutils."""
    if os.environ.get("TOPOSERVE_IMAGE_BASE"):
        return os.environ.get("TOPOSERVE_IMAGE_BUILD_BASE") or python_base()
    return debian_base("python3-build", ["python3", "python3-venv", "libstdc++6", "binutils"])


def wheelhouse(cache: Path, py_base: str) -> Path:
    """Where ``wheelhouse`` downloads the wheels: keyed by the requirements and the base."""
    return cache / "wheels" / key(Body(_requirements(_pyproject())), py_base)


def expected_archives(cache: Path | None = None) -> dict[str, Path]:
    """Image name -> the archive ``make image`` writes for this tree (it may
    not exist yet). Raises CannotTell outside a checkout."""
    cache = cache or cache_dir()
    if not SCRIPT.is_file():
        raise CannotTell(f"no {SCRIPT.relative_to(ROOT)} here: not a toposerve checkout")
    self_hash = hashlib.sha256(SCRIPT.read_bytes()).hexdigest()
    images = cache / "images"
    # toposerve: the Python base, the wheels resolved in it, the staged context
    py_base = python_base()
    wheels = wheelhouse(cache, py_base)
    staged = [(f"src/{f}", ROOT / f) for f in _product_files(_pyproject())]
    staged += [(f"wheels/{p.relative_to(wheels)}", p) for p in wheels.rglob("*")
               if p.is_file() and not p.is_symlink() and p.name != ".complete"]
    nic = nic_binary()
    if nic.is_file():
        staged.append(("toposerve-nic", nic))
    toposerve = key(self_hash, py_base, build_base(), ROOT / "Containerfile",
                    Context(tuple(staged)))
    redis_file = ROOT / "hack/images/redis.Containerfile"
    redis = key(self_hash, redis_file, debian_base("redis", ["redis-server"]))
    k8s = versions()["K8S_VERSION"]
    scheduler_bin = cache / "bin" / f"kubernetes-{k8s}" / "kube-scheduler"
    scheduler = key(self_hash, ROOT / "hack/images/kube-scheduler.Containerfile", Context(
        (("kube-scheduler", scheduler_bin),) if scheduler_bin.is_file() else ()))
    return {name: images / f"{name}-{k}.oci.tar"
            for name, k in (("toposerve", toposerve), ("redis", redis),
                            ("kube-scheduler", scheduler))}
