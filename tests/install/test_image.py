"""`make image`: the install's images as OCI archives in the tool cache
(hack/build-image.sh, docs/install.md). Builds them when the cache has none
for the current inputs (minutes, with buildah as root), then reads the
archives as containerd's import would and runs the toposerve image."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.images import make_images
from toposerve.localcluster.realnode.images import is_static_elf
from toposerve.localcluster.tools import versions
from toposerve.main import EXTRAS

ROOT = Path(__file__).resolve().parents[2]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
SITE = re.compile(r"^opt/toposerve/lib/python3\.\d+/site-packages/")


@dataclass
class Image:
    ref: str
    archive: Path
    config: dict[str, Any]
    files: dict[str, tarfile.TarInfo]  # path in the image -> its topmost layer's entry
    layers: list[bytes]  # uncompressed, bottom first

    def read(self, path: str) -> bytes:
        """A file's bytes, from the topmost layer that has it."""
        for layer in reversed(self.layers):
            with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
                try:
                    f = tar.extractfile(path)
                except KeyError:
                    continue
                assert f is not None, path
                return f.read()
        raise KeyError(path)


def _uncompressed(data: bytes, media_type: str) -> bytes:
    return gzip.decompress(data) if media_type.endswith("+gzip") else data


def _load(ref: str, archive: Path) -> Image:
    """Checks the OCI layout on the way: every blob named by its digest and
    size, one manifest named by ``ref``, a diff_id per layer."""
    with tarfile.open(archive) as tar:
        members = {m.name.removeprefix("./"): m for m in tar.getmembers() if m.isfile()}
        raw = {name: tar.extractfile(m).read() for name, m in members.items()}  # type: ignore[union-attr]
    assert json.loads(raw["oci-layout"]) == {"imageLayoutVersion": "1.0.0"}
    blobs = {"index.json": raw["index.json"]}
    for name, data in raw.items():
        if name.startswith("blobs/sha256/"):
            digest = name.removeprefix("blobs/sha256/")
            assert hashlib.sha256(data).hexdigest() == digest, name
            blobs[f"sha256:{digest}"] = data
    index = json.loads(raw["index.json"])
    assert len(index["manifests"]) == 1
    desc = index["manifests"][0]
    assert desc["annotations"]["org.opencontainers.image.ref.name"] == ref
    assert len(blobs[desc["digest"]]) == desc["size"]
    manifest = json.loads(blobs[desc["digest"]])
    config = json.loads(blobs[manifest["config"]["digest"]])
    assert config["os"] == "linux" and config["architecture"] == "amd64"
    files: dict[str, tarfile.TarInfo] = {}
    layers = []
    assert len(config["rootfs"]["diff_ids"]) == len(manifest["layers"])
    for d, diff_id in zip(manifest["layers"], config["rootfs"]["diff_ids"], strict=True):
        assert len(blobs[d["digest"]]) == d["size"]
        layer = _uncompressed(blobs[d["digest"]], d["mediaType"])
        assert f"sha256:{hashlib.sha256(layer).hexdigest()}" == diff_id
        with tarfile.open(fileobj=io.BytesIO(layer)) as tar:
            for m in tar.getmembers():
                files[m.name.removeprefix("./")] = m
        layers.append(layer)
    return Image(ref=ref, archive=archive, config=config["config"], files=files, layers=layers)


@pytest.fixture(scope="module")
def images() -> dict[str, Image]:
    """``make image``'s archives by reference (its stdout names each one)."""
    return {ref: _load(ref, archive) for ref, archive in make_images().items()}


def images_redis_tag(images: dict[str, Image]) -> str:
    (ref,) = [r for r in images if r.startswith("localhost/redis:")]
    assert re.fullmatch(r"localhost/redis:\d+\.\d+\.\d+", ref), ref
    return ref.split(":")[1]


def test_make_image_writes_the_three_archives_to_the_cache(images: dict[str, Image]) -> None:
    assert sorted(images) == sorted([f"localhost/toposerve:{VERSION}",
                                     f"localhost/kube-scheduler:{versions()['K8S_VERSION']}",
                                     "localhost/redis:" + images_redis_tag(images)])
    cache = Path(os.environ.get("TOPOSERVE_CACHE", Path.home() / ".cache/toposerve"))
    for image in images.values():
        assert image.archive.parent == cache / "images"
        assert image.archive.is_file()


def test_toposerve_image_holds_the_product_and_the_forwarder(images: dict[str, Image]) -> None:
    image = images[f"localhost/toposerve:{VERSION}"]
    script = image.read("opt/toposerve/bin/toposerve")
    assert script.startswith(b"#!/opt/toposerve/bin/python")
    assert b"from toposerve.main import main" in script
    nic = image.files["opt/toposerve/bin/toposerve-nic"]
    assert nic.mode & 0o111 == 0o111
    assert is_static_elf(image.read("opt/toposerve/bin/toposerve-nic"))
    assert image.config["Entrypoint"] == ["toposerve"]
    path = next(e for e in image.config["Env"] if e.startswith("PATH="))
    assert path.startswith("PATH=/opt/toposerve/bin:")
    # one import name; the parts under it, the local cluster left out
    ours = {SITE.sub("", p).split("/")[1] for p in image.files
            if SITE.match(p) and SITE.sub("", p).startswith("toposerve/")}
    assert {"main.py", "dra_driver", "scheduler_ext", "router", "simulator"} <= ours
    assert "localcluster" not in ours


def test_toposerve_image_has_no_tests_compilers_or_caches(images: dict[str, Image]) -> None:
    image = images[f"localhost/toposerve:{VERSION}"]
    packages = {SITE.sub("", p).split("/")[0] for p in image.files if SITE.match(p)}
    assert not packages & {"tests", "bench", "harness", "pip", "setuptools",
                           "huggingface_hub", "hf_xet", "fsspec"}
    # the extensions without their debug info (uvloop's loop: 13.6 MB as shipped)
    (loop,) = [m for p, m in image.files.items()
               if SITE.match(p) and re.search(r"/uvloop/loop\.[^/]*\.so$", p)]
    assert loop.size < 4 << 20, loop.size
    compilers = re.compile(r"^usr/(local/)?bin/(\S+-)?(gcc|g\+\+|cc|c\+\+|ld|as|go)(-[\d.]+)?$"
                           r"|^usr/(lib|libexec)/gcc/")
    assert not [p for p in image.files if compilers.match(p)]
    assert not [p for p in image.files if "/.cache/" in f"/{p}"]  # pip's cache, any other
    # the build stage's context and wheels stay in the build stage
    assert not [p for p in image.files if p.startswith(("ctx/", "src/"))]


def test_kube_scheduler_image_is_the_static_binary_alone(images: dict[str, Image]) -> None:
    image = images[f"localhost/kube-scheduler:{versions()['K8S_VERSION']}"]
    assert {p for p, m in image.files.items() if m.isfile()} == {"usr/local/bin/kube-scheduler"}
    assert is_static_elf(image.read("usr/local/bin/kube-scheduler"))
    assert image.config["Entrypoint"] == ["kube-scheduler"]


def test_redis_image_runs_debians_redis_server(images: dict[str, Image]) -> None:
    image = images[f"localhost/redis:{images_redis_tag(images)}"]
    server = image.files["usr/bin/redis-server"]
    if server.issym():  # Debian's is a link to the one redis binary
        server = image.files[f"usr/bin/{server.linkname}"]
    assert server.isfile() and server.mode & 0o111
    assert image.config["Entrypoint"][0] == "redis-server"
    assert image.config["User"] == "999:999"


@pytest.fixture
def buildah(tmp_path: Path) -> Iterator[list[str]]:
    """buildah on storage of the test's own (the archive is imported there)."""
    if shutil.which("buildah") is None:
        pytest.fail("buildah is not installed: make sysdeps")
    cmd = ["buildah", "--root", str(tmp_path / "root"), "--runroot", str(tmp_path / "run"),
           "--storage-driver", "overlay"]
    try:
        yield cmd
    finally:
        subprocess.run([*cmd, "rm", "--all"], capture_output=True, check=False)
        subprocess.run([*cmd, "rmi", "--all", "--force"], capture_output=True, check=False)


# Imports every module of the product in the image; prints the ones that
# fail as {module: "ExceptionType: missing-module-or-message"}.
IMPORT_ALL = """
import importlib, json, pkgutil
failed = {}
for top in %r:
    pkg = importlib.import_module(top)
    for m in pkgutil.walk_packages(pkg.__path__, top + "."):
        if m.name.endswith(".__main__"):  # `python -m toposerve`: importing it runs the CLI
            continue
        try:
            importlib.import_module(m.name)
        except ModuleNotFoundError as e:
            failed[m.name] = "ModuleNotFoundError: " + (e.name or "")
        except Exception as e:
            failed[m.name] = type(e).__name__ + ": " + str(e)
print(json.dumps(failed))
"""


def test_toposerve_image_runs_every_part_as_the_manifests_user(
        images: dict[str, Image], buildah: list[str]) -> None:
    image = images[f"localhost/toposerve:{VERSION}"]
    ctr = subprocess.run([*buildah, "from", "--quiet", f"oci-archive:{image.archive}"],
                         capture_output=True, text=True, check=True).stdout.strip()

    def run(*argv: str) -> str:
        # as the pods run it: uid 65532, PATH from the image
        done = subprocess.run([*buildah, "run", "--isolation", "chroot", "--user", "65532:65532",
                               ctr, "--", *argv], capture_output=True, text=True, timeout=300,
                              check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout

    for part in ("driver", "extender", "router", "sim", "manifests"):
        assert "usage: toposerve" in run("toposerve", part, "--help")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    tops = [pyproject["tool"]["setuptools"]["packages"][0]]  # the one import name
    failed = json.loads(run("python3", "-c", IMPORT_ALL % tops))
    # only what needs an extra the image leaves out (the Containerfile's EXTRAS)
    in_image = re.search(r"^ARG EXTRAS=(\S+)$", (ROOT / "Containerfile").read_text(),
                         re.M).group(1).split(",")  # type: ignore[union-attr]
    left_out = {m for m, extra in EXTRAS.items() if extra not in in_image}
    unexpected = {m: why for m, why in failed.items()
                  if why.removeprefix("ModuleNotFoundError: ").split(".")[0] not in left_out}
    assert unexpected == {}
