"""Dependencies by role: with every optional extra missing, the router, the
simulator, the extender, the GPU driver and the install still import and
run their commands; a command that needs an extra says which, in one line.
Likewise without the local cluster, which the image leaves out."""

from __future__ import annotations

import re
import subprocess
import sys

from toposerve.main import EXTRAS


def _blocking(prefixes: list[str]) -> str:
    """Code that makes the modules under ``prefixes`` unimportable."""
    return f"""
import importlib.abc, sys
class _Gone(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if any(name == p or name.startswith(p + ".") for p in {prefixes!r}):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Gone())
"""


# as in an install without extras
BLOCK = _blocking(sorted(EXTRAS))


def _run(code: str, block: str = BLOCK) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", block + code], capture_output=True, text=True,
                          timeout=120)


ROLES = ["toposerve.router.http.app", "toposerve.simulator.server",
         "toposerve.scheduler_ext.server", "toposerve.dra_driver.gpu.driver",
         "toposerve.dra_driver.simulate", "toposerve.manifests.render",
         "toposerve.localcluster.cluster"]


def test_roles_import_without_extras() -> None:
    # one interpreter for all: each import is tried and its failure named
    r = _run(f"""
import importlib, traceback
bad = []
for m in {ROLES!r}:
    try:
        importlib.import_module(m)
    except Exception as err:
        bad.append(f"{{m}}: {{err!r}}")
print("\\n".join(bad))
""")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == ""


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return _run(f"from toposerve.main import main; sys.exit(main({list(argv)!r}))")


def test_commands_without_extras_work() -> None:
    r = _cli("manifests", "render", "--set", "apiServer.host=127.0.0.1")
    assert r.returncode == 0, r.stderr
    assert "kind: DaemonSet" in r.stdout


def test_a_missing_extra_is_one_line_naming_it(tmp_path: object) -> None:
    r = _cli("scale", "run", "-f", "small", "--out", str(tmp_path))
    assert r.returncode == 2
    (line,) = r.stderr.strip().splitlines()
    # whichever of the extra's modules the runner imports first
    needed = re.fullmatch(
        r"error: this needs (\w+), from the 'scale' extra: pip install 'toposerve\[scale\]'", line)
    assert needed is not None and EXTRAS[needed.group(1)] == "scale", line
    # the blocker itself is sound: the module is importable without it
    assert subprocess.run([sys.executable, "-c", f"import {needed.group(1)}"],
                          timeout=60).returncode == 0


def test_without_the_local_cluster_the_parts_run_and_cluster_says_why() -> None:
    # the image deletes toposerve/localcluster (Containerfile): its pods run
    # the parts; `cluster` and `scale` belong where the wheel is installed
    block = _blocking(["toposerve.localcluster"])
    cli = "from toposerve.main import main; sys.exit(main({!r}))"
    r = _run(cli.format(["manifests", "render", "--set", "apiServer.host=127.0.0.1"]), block)
    assert r.returncode == 0, r.stderr
    for argv in (["cluster", "status"], ["scale", "list"]):
        r = _run(cli.format(argv), block)
        assert r.returncode == 2, r.stderr
        assert r.stderr.strip().splitlines() == [
            "error: the local cluster (toposerve cluster, toposerve scale) is not part of this "
            "install (the image leaves it out): run it where toposerve is pip-installed"], argv
