"""Dependencies by role: with every optional extra missing, the router, the
simulator, the extender, the GPU driver and the install still import and
run their commands; a command that needs an extra says which, in one line."""

from __future__ import annotations

import subprocess
import sys

from toposerve_cli.main import EXTRAS

# Makes every extra's modules unimportable, as in an install without extras.
BLOCK = f"""
import importlib.abc, sys
class _NoExtras(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {sorted(EXTRAS)!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _NoExtras())
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK + code], capture_output=True, text=True,
                          timeout=120)


ROLES = ["router.http.server", "simulator.server", "scheduler_ext.server",
         "dra_driver.gpu.driver", "dra_driver.simulate", "manifests.render",
         "localcluster.cluster"]


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
    return _run(f"from toposerve_cli.main import main; sys.exit(main({list(argv)!r}))")


def test_commands_without_extras_work() -> None:
    r = _cli("manifests", "render", "--set", "apiServer.host=127.0.0.1")
    assert r.returncode == 0, r.stderr
    assert "kind: DaemonSet" in r.stdout


def test_a_missing_extra_is_one_line_naming_it(tmp_path: object) -> None:
    r = _cli("scale", "run", "-f", "small", "--out", str(tmp_path))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: this needs tqdm, from the 'scale' extra: pip install 'toposerve[scale]'"]
    # the blocker itself is sound: the module is importable without it
    assert subprocess.run([sys.executable, "-c", "import tqdm"], timeout=60).returncode == 0
