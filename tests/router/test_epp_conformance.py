"""The Gateway API Inference Extension conformance suite against the local
cluster, as far as it runs here (docs/endpoint-picker.md, Conformance).

The suite (``sigs.k8s.io/gateway-api-inference-extension/conformance`` at
the InferencePool CRD's pin, built from the Go module proxy by
hack/epp-conformance.sh) has one profile, Gateway: it checks a Gateway
implementation, deploying its own endpoint picker and echo backends as
images, and each of its tests starts by waiting for a GatewayClass a
controller accepted and two Gateways it programmed. No such controller runs
here, so no test of it passes or fails here. What does run is the suite up
to that wait, and that is checked: it accepts the local cluster's CRDs (the
Gateway API's of the version it is built with, our InferencePool CRD), it
knows every test the docs list (and no other), and for each it stops at the
GatewayClass and nowhere earlier."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import Cluster
from toposerve.kubeapi import JsonApi
from toposerve.localcluster import crds
from toposerve.localcluster.clusters import kubeconfig_path

pytestmark = [pytest.mark.cluster,
              pytest.mark.timeout(1800)]  # the first build takes minutes on two cores

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "epp-conformance.sh"
DOCS = ROOT / "docs" / "endpoint-picker.md"
# a GatewayClass no controller here accepts (none does); the suite's wait for
# it is cut to 1s in case one of that name is there
GATEWAY_CLASS = "toposerve-conformance"
REACHED = "Test Setup: Ensuring GatewayClass has been accepted"


def script(*args: str) -> str:
    done = subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=1700,
                          check=False, env={**os.environ, "PYTHON": sys.executable})
    assert done.returncode == 0, f"hack/epp-conformance.sh {' '.join(args)}: {done.stderr[-2000:]}"
    return done.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def suite() -> Path:
    """The suite's binary (before any cluster: without Go there is nothing to run)."""
    if shutil.which("go") is None:
        reason = "the conformance suite is built from the Go module proxy: no go on PATH"
        print(reason, file=sys.stderr)
        pytest.skip(reason)
    return Path(script("build"))


@pytest.fixture(scope="module")
def suite_cluster(suite: Path, request: pytest.FixtureRequest) -> Cluster:
    """The local cluster with the CRDs the suite checks: the Gateway API's
    standard ones of the version it is built with, and our InferencePool CRD.
    (Asked for after ``suite``, so that a skip starts no cluster.)"""
    cluster: Cluster = request.getfixturevalue("cluster")
    gateway_api: list[dict[str, Any]] = [
        d for f in sorted(Path(script("gateway-crds")).glob("*.yaml"))
        for d in yaml.safe_load_all(f.read_text())
        if isinstance(d, dict) and d.get("kind") == "CustomResourceDefinition"]
    rest = JsonApi(cluster.api)
    crds.install(rest, gateway_api, "the Gateway API CRDs")
    crds.install_named(rest, ["inference-pool"])
    return cluster


def documented() -> list[str]:
    """The tests the Conformance section of the docs lists (its table's first column)."""
    section = DOCS.read_text().split("\n## Conformance\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^\| `(\w+)` \|", section, flags=re.M)


def run(binary: Path, cluster: Cluster, *flags: str) -> tuple[int, str]:
    done = subprocess.run(
        [str(binary), "-test.v", "-test.run", "^TestConformance$",
         f"--gateway-class={GATEWAY_CLASS}", "--timeout-config-overrides=GWCMustBeAccepted=1s",
         *flags],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "KUBECONFIG": str(kubeconfig_path(cluster.name))})
    return done.returncode, done.stdout + done.stderr


def test_the_suite_runs_to_the_gateway_for_each_test_the_docs_list(
        suite: Path, suite_cluster: Cluster) -> None:
    cluster = suite_cluster
    names = documented()
    assert len(names) == len(set(names)) >= 1, names
    for name in names:
        rc, out = run(suite, cluster, f"--run-test={name}")
        # past the suite's checks of the cluster's CRDs (each fails before this line)
        assert REACHED in out, f"{name}:\n{out[-3000:]}"
        # and stopped there: no GatewayClass accepted, nothing applied
        assert rc != 0 and "Applying base manifests" not in out, f"{name}:\n{out[-3000:]}"
        assert f"error waiting for {GATEWAY_CLASS} GatewayClass to have Accepted" in out, \
            f"{name}:\n{out[-3000:]}"
        assert "--- FAIL: TestConformance" in out, out[-3000:]
    # a name the suite does not have is refused before the wait: the loop above
    # would have caught a test the docs list and the suite lacks
    rc, out = run(suite, cluster, "--run-test=NoSuchConformanceTest")
    assert rc != 0 and '"NoSuchConformanceTest" does not exist' in out and REACHED not in out, \
        out[-3000:]


def test_the_docs_list_every_test_of_the_suite(suite: Path) -> None:
    """Each test the suite's source registers (by its ShortName) is in the
    docs' table: a test added upstream at a new pin is not left out."""
    source = Path(script("source"))
    names = set(re.findall(r'ShortName:\s*"(\w+)"',
                           "".join(p.read_text() for p in (source / "tests").glob("*.go"))))
    assert names and names == set(documented()), (sorted(names), documented())
