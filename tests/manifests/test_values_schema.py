"""``toposerve manifests schema``: the values' JSON Schema accepts what
``render`` accepts and rejects what it rejects, so an editor or a CI check
on a values file says what ``render`` would say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.manifests.helpers import cli
from toposerve.manifests.values import InstallValues, load_values
from toposerve.topology.config_file import ConfigError

jsonschema = pytest.importorskip("jsonschema")

HOST = {"apiVersion": "toposerve.io/v1", "kind": "InstallValues",
        "apiServer": {"host": "127.0.0.1"}}


@pytest.fixture(scope="module")
def validator(tmp_path_factory: pytest.TempPathFactory) -> Any:
    out = tmp_path_factory.mktemp("schema") / "values.schema.json"
    assert cli(["manifests", "schema", "-o", str(out)]) == 0
    schema = json.loads(out.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_schema_to_stdout(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli(["manifests", "schema"]) == 0
    printed = capsys.readouterr().out
    assert json.loads(printed)["required"] == ["apiVersion", "kind"]
    assert cli(["manifests", "schema", "-o", str(tmp_path / "none" / "x.json")]) == 2
    assert "cannot write" in capsys.readouterr().err


def test_every_default_is_valid(validator: Any) -> None:
    defaults = InstallValues.model_validate(HOST).model_dump(by_alias=True, mode="json")
    assert defaults["router"]["config"]["discovery"]["kubernetes"]["labelSelector"]
    assert list(validator.iter_errors(defaults)) == []
    assert list(validator.iter_errors(HOST)) == []


def _valid_for_render(doc: dict[str, Any], tmp_path: Path) -> bool:
    f = tmp_path / "values.yaml"
    f.write_text(json.dumps(doc))  # JSON is YAML
    try:
        load_values(f)
    except ConfigError:
        return False
    return True


@pytest.mark.parametrize("doc", [
    {**HOST, "gpuDriver": {"nodeSelector": {"gpu": "yes"}, "tolerations": [{"operator": "Exists"}]},
     "image": {"repository": "registry.example.test/toposerve", "tag": "v1",
               "pullPolicy": "Never"}},
    # a component's config gives only what it changes
    {**HOST, "router": {"config": {"discovery": {"kubernetes": {"labelSelector": "app=x"}}}}},
    {**HOST, "router": {"config": {"discovery": {"kubernetes": {"namespace": "llm"}}}}},
    {**HOST, "router": {"config": {"discovery": {
        "kubernetes": None, "static": [{"url": "http://127.0.0.1:8000"}]}}}},
    {**HOST, "extender": {"config": {"placement": {"promiseTTLSeconds": 30}}}},
    {**HOST, "netDriver": {"enabled": True, "cni": {"chainInto": "10-pod.conflist"}}},
])
def test_good_values(validator: Any, doc: dict[str, Any], tmp_path: Path) -> None:
    assert [e.message for e in validator.iter_errors(doc)] == []
    assert _valid_for_render(doc, tmp_path)


@pytest.mark.parametrize("doc", [
    {"apiServer": {"host": "127.0.0.1"}},  # a file names its kind
    {**HOST, "gpuDriver": {"cdiRot": "/run/cdi"}},
    {**HOST, "image": {"pullPolicy": "Sometimes"}},
    {**HOST, "extender": {"replicas": 0}},
    {**HOST, "namespace": "Toposerve"},
    {**HOST, "kind": "Values"},
    {**HOST, "router": {"config": {"discovery": {"kubernetes": {"labelSelecter": "app=x"}}}}},
    {**HOST, "router": {"config": {"kind": "ExtenderConfig"}}},
    # a list replaces the default's: its items are whole
    {**HOST, "router": {"config": {"discovery": {"static": [{"role": "decode"}]}}}},
    {**HOST, "extender": {"config": {"placement": {"promiseTTLSecond": 30}}}},
])
def test_bad_values(validator: Any, doc: dict[str, Any], tmp_path: Path) -> None:
    assert list(validator.iter_errors(doc)) != []
    assert not _valid_for_render(doc, tmp_path)
