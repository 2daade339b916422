"""The architecture holds: the import contracts in pyproject.toml pass, and
break when a part imports across its floor; the wheel carries the product
and no tooling."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# import name -> the repository folder it installs from (pyproject's package-dir)
FOLDERS: dict[str, str] = PYPROJECT["tool"]["setuptools"]["package-dir"]
TOOLING = ["harness", "bench", "tests"]
LINT = Path(sys.executable).with_name("lint-imports")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "results")


def _tree(dest: Path) -> Path:
    """The packages as they install (``toposerve/...``), the tooling beside
    them and the contracts: sources only, copied."""
    for name, folder in sorted(FOLDERS.items()):
        shutil.copytree(ROOT / folder, dest.joinpath(*name.split(".")), ignore=IGNORE,
                        dirs_exist_ok=True)
    for pkg in TOOLING:
        shutil.copytree(ROOT / pkg, dest / pkg, ignore=IGNORE)
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT), "--no-cache"], cwd=tree, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})


def _planted(tree: Path, importer: str, statement: str) -> subprocess.CompletedProcess[str]:
    """lint-imports over ``tree`` with ``statement`` appended to ``importer``."""
    with (tree / importer).open("a") as f:
        f.write(f"\n{statement}  # noqa: E402,F401\n")
    return _lint(tree)


def test_contracts_hold_and_catch_a_part_importing_the_local_cluster(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    kept = _lint(tree)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "0 broken" in kept.stdout
    broken = _planted(tree, "toposerve/dra_driver/__init__.py",
                      "import toposerve.localcluster.tools")
    assert broken.returncode != 0
    assert "the product's floors" in broken.stdout
    assert "toposerve.dra_driver -> toposerve.localcluster.tools" in broken.stdout


@pytest.mark.parametrize("importer", ["toposerve/router/state.py", "harness/procs.py"])
def test_contracts_catch_tooling_imported_where_it_must_not_be(tmp_path: Path,
                                                               importer: str) -> None:
    broken = _planted(_tree(tmp_path), importer, "import tests.conftest")
    assert broken.returncode != 0
    assert "BROKEN" in broken.stdout


def test_contracts_catch_a_part_importing_the_kubernetes_client(tmp_path: Path) -> None:
    broken = _planted(_tree(tmp_path), "toposerve/router/state.py", "import kubernetes.client")
    assert broken.returncode != 0
    assert "only toposerve.kubeapi talks to Kubernetes" in broken.stdout
    assert "toposerve.router.state -> kubernetes" in broken.stdout
    assert ", 1 broken." in broken.stdout


def test_wheel_installs_one_import_name_and_the_whole_product(tmp_path: Path) -> None:
    # built from a copy of the checkout's layout: setuptools' build/ in the
    # checkout holds the editable install's link tree
    src = tmp_path / "src"
    for folder in sorted(set(FOLDERS.values())) + TOOLING:
        shutil.copytree(ROOT / folder, src / folder, ignore=IGNORE)
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / f, src / f)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path), str(src)],
                   check=True, timeout=300, capture_output=True)
    (wheel,) = tmp_path.glob("toposerve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("toposerve-")}
    assert tops == {"toposerve"}
    assert not [n for n in names if "/tests/" in n or "/bench/" in n or "/harness/" in n]
    # ... and all of the product: every module of every mapped folder, at
    # its import name (a package missing from pyproject's list fails here)
    installs = {folder: name.replace(".", "/") for name, folder in FOLDERS.items()}
    sources = {f"{installs[folder]}/{p.relative_to(ROOT / folder)}"
               for folder in installs for p in (ROOT / folder).rglob("*.py")}
    assert sources - set(names) == set()
    # the data the product reads at run time travels with it
    chart = "toposerve/manifests/chart/toposerve"
    assert {f"{chart}/{f}" for f in ("Chart.yaml", "values.yaml", "values.schema.json",
                                     ".helmignore", "templates/_helpers.tpl",
                                     "templates/router.yaml", "ci/local-cluster-values.yaml",
                                     "files/dashboards/toposerve.json")} <= set(names)
    assert any(n.startswith("toposerve/topology/profiles/") and n.endswith(".yaml") for n in names)
    assert "toposerve/py.typed" in names
