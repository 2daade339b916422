"""Every config loader: a misspelt field is named with the field it most
likely meant (``toposerve.topology.config_file.hint``), wherever it sits."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from toposerve.dra_driver.gpu.config import GpuConfig
from toposerve.dra_driver.kubeletplugin import parse_opaque
from toposerve.dra_driver.net.config import NetConfig
from toposerve.localcluster.scale.scenario import load_scenario
from toposerve.manifests.values import load_values
from toposerve.router.admission.keys import read_file
from toposerve.router.config import load_router_config
from toposerve.scheduler_ext.config import load_extender_config
from toposerve.topology.config_file import ConfigError
from toposerve.topology.profiles import load_profile

V1 = {"apiVersion": "toposerve.io/v1"}
ROOT = Path(__file__).parents[2]


def _scenario() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(
        (ROOT / "localcluster/scale/scenarios/small.yaml").read_text())
    doc["nodes"][0]["cont"] = doc["nodes"][0].pop("count")
    return doc


def _profile() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROOT / "topology/profiles/hgx-h100.yaml").read_text())
    doc["spec"]["modelz"] = doc["spec"].pop("models")
    return doc


@pytest.mark.parametrize("load, doc, message", [
    (load_router_config, {**V1, "kind": "RouterConfig",
                          "discovery": {"kubernetes": {"labelSelecter": "app=x"}}},
     "discovery.kubernetes.labelSelecter: Extra inputs are not permitted (unknown field: "
     "did you mean labelSelector?)"),
    (load_router_config, {**V1, "kind": "RouterConfig",
                          "discovery": {"static": [{"url": "http://127.0.0.1:1"}]},
                          "profile": {"scorers": [{"type": "queue", "wieght": 2}]}},
     "profile.scorers.0.wieght: Extra inputs are not permitted (unknown field: did you mean "
     "weight?)"),
    (load_extender_config, {**V1, "kind": "ExtenderConfig",
                            "placement": {"promiseTTLSecond": 3}},
     "placement.promiseTTLSecond: Extra inputs are not permitted (unknown field: did you mean "
     "promiseTTLSeconds?)"),
    (load_scenario, _scenario(),
     "nodes.0.cont: Extra inputs are not permitted (unknown field: did you mean count?)"),
    (lambda p: load_profile(str(p)), _profile(),
     "spec.modelz: Extra inputs are not permitted (unknown field: did you mean models?)"),
    (read_file, {**V1, "kind": "APIKeys", "tenant": {"a": ["k"]}},
     "tenant: Extra inputs are not permitted (unknown field: did you mean tenants?)"),
    (lambda p: load_values(p), {**V1, "kind": "InstallValues", "apiServer": {"host": "::1"},
                                "router": {"config": {"discovery": {"kubernetes": {
                                    "labelSelecter": "app=x"}}}}},
     "router.config.discovery.kubernetes.labelSelecter: Extra inputs are not permitted "
     "(unknown field: did you mean labelSelector?)"),
])
def test_a_misspelt_field_in_a_file(tmp_path: Path, load: Callable[[Path], object],
                                    doc: dict[str, Any], message: str) -> None:
    f = tmp_path / "config.yaml"
    f.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as err:
        load(f)
    assert message in str(err.value)


def test_a_misspelt_field_of_an_opaque_config() -> None:
    with pytest.raises(ValueError, match=r"^nicAlignmnt: Extra inputs are not permitted "
                                         r"\(unknown field: did you mean nicAlignment\?\)$"):
        parse_opaque({"apiVersion": "gpu.toposerve.io/v1", "kind": "GpuConfig",
                      "nicAlignmnt": "root"}, GpuConfig)
    with pytest.raises(ValueError, match=r"interfaceNme: .*did you mean interfaceName\?"):
        parse_opaque({"apiVersion": "net.toposerve.io/v1", "kind": "NetConfig",
                      "interfaceNme": "eth1"}, NetConfig)
    # far from every field: no guess
    with pytest.raises(ValueError, match=r"zzz: .*\(unknown field: remove it or check"):
        parse_opaque({"apiVersion": "gpu.toposerve.io/v1", "kind": "GpuConfig", "zzz": 1},
                     GpuConfig)
