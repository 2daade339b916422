"""``make image`` from a test: the install's images of this tree (a no-op
of seconds when cached), so a test never runs an archive an older tree
built under the same tag."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def make_images(timeout_s: float = 1500) -> dict[str, Path]:
    """The archives by reference, as ``hack/build-image.sh`` names them on stdout."""
    if os.geteuid() != 0:
        raise RuntimeError("make image needs root (buildah's overlay storage, mmdebstrap)")
    done = subprocess.run(["make", "-s", "--no-print-directory", "image"], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout_s, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"make image failed:\n{done.stderr[-3000:]}")
    return {ref: Path(archive) for ref, archive in
            re.findall(r"^(localhost/\S+) (/\S+\.oci\.tar)$", done.stdout, re.M)}
