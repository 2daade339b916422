"""The architecture holds: the import contracts in pyproject.toml pass, and
break when a part imports across its floor; the wheel carries the product
and no tooling."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ["toposerve_cli", "localcluster", "manifests", "dra_driver", "scheduler_ext", "router",
           "simulator", "kubeapi", "wire", "topology"]
TOOLING = ["harness", "bench", "tests"]
LINT = Path(sys.executable).with_name("lint-imports")


def _tree(dest: Path) -> Path:
    """The packages and the contracts, copied (sources only)."""
    for pkg in PRODUCT + TOOLING:
        shutil.copytree(ROOT / pkg, dest / pkg,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "results"))
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(LINT), "--no-cache"], cwd=tree, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})


def test_contracts_hold_and_catch_a_part_importing_the_local_cluster(tmp_path: Path) -> None:
    tree = _tree(tmp_path)
    kept = _lint(tree)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "0 broken" in kept.stdout
    with (tree / "dra_driver" / "__init__.py").open("a") as f:
        f.write("\nimport localcluster.tools  # noqa: E402,F401\n")
    broken = _lint(tree)
    assert broken.returncode != 0
    assert "the product's floors" in broken.stdout
    assert "dra_driver -> localcluster.tools" in broken.stdout


@pytest.mark.parametrize("importer", ["router/state.py", "harness/procs.py"])
def test_contracts_catch_tooling_imported_where_it_must_not_be(tmp_path: Path,
                                                               importer: str) -> None:
    tree = _tree(tmp_path)
    with (tree / importer).open("a") as f:
        f.write("\nimport tests.conftest  # noqa: E402,F401\n")
    broken = _lint(tree)
    assert broken.returncode != 0
    assert "BROKEN" in broken.stdout


def test_wheel_holds_the_product_only(tmp_path: Path) -> None:
    # built from a copy: setuptools' build/ in the checkout could hold stale modules
    src = _tree(tmp_path / "src")
    shutil.copy(ROOT / "README.md", src / "README.md")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "-w", str(tmp_path), str(src)],
                   check=True, timeout=300, capture_output=True)
    (wheel,) = tmp_path.glob("toposerve-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("toposerve-")}
    assert tops == set(PRODUCT)
    assert not [n for n in names if "/tests/" in n or n.split("/")[0] in TOOLING]
    # ... and all of the product: every module of the source tree
    sources = {str(p.relative_to(ROOT)) for pkg in PRODUCT for p in (ROOT / pkg).rglob("*.py")}
    assert sources - set(names) == set()
    # the data the product reads at run time travels with it
    assert "manifests/templates/" in "".join(names)
    assert any(n.startswith("topology/profiles/") and n.endswith(".yaml") for n in names)
