"""CRDs from other projects' Go modules at pinned versions: the
InferencePool v1 CRD read from sigs.k8s.io/gateway-api-inference-extension
as the Go module proxy serves it, cached by version; a CRD of another
version or none at all refused; an unknown --crd refused before anything
starts. (The cluster's install of it: test_cluster_cli.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from toposerve.localcluster import crds
from toposerve.localcluster.cluster import ClusterSpec, validate
from toposerve.localcluster.clusters import ClusterError

pytestmark = pytest.mark.unit


def test_the_inference_pool_crd_comes_from_its_module_at_the_pinned_version(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("go") is None:
        pytest.skip("no go on PATH: the CRD is read from the Go module (make setup installs Go)")
    monkeypatch.setenv("TOPOSERVE_CACHE", str(tmp_path))
    path = crds.crd_file("inference-pool")
    assert path == tmp_path / "crds" / "inference-pool-v1.6.0.yaml"
    crd = crds.load("inference-pool")
    assert crd["metadata"]["name"] == "inferencepools.inference.networking.k8s.io"
    assert [v["name"] for v in crd["spec"]["versions"]] == ["v1"]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["required"] == ["selector", "targetPorts"]
    # the cache answers from now on: a changed copy is what is read
    path.write_text(path.read_text().replace("v1.6.0", "v1.5.0"))
    with pytest.raises(ClusterError, match=r"is not the inference-pool CRD of v1\.6\.0"):
        crds.load("inference-pool")


def test_what_is_no_crd_is_refused() -> None:
    for doc in ({"kind": "ConfigMap"}, [1], yaml.safe_load("kind: CustomResourceDefinition")):
        with pytest.raises(ClusterError, match="is not the inference-pool CRD"):
            crds.check("inference-pool", doc)


def test_an_unknown_crd_is_refused_before_anything_starts() -> None:
    with pytest.raises(ClusterError, match="--crd gateway: give one of inference-pool"):
        validate(ClusterSpec(name="x", groups=[("hgx-h100", 1)], crds=("gateway",)))
