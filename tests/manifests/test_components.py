"""Components one at a time (``render --component X``) and the router left
out (``router.enabled=false``)."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.manifests.helpers import Obj, cli, objects
from toposerve.manifests.values import COMPONENTS, load_values


def _key(o: Obj) -> tuple[str, str, str]:
    return o["kind"], o["metadata"].get("namespace", ""), o["metadata"]["name"]


@pytest.mark.parametrize("component", COMPONENTS)
def test_each_component_renders_from_the_cli(component: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["manifests", "render", "--set", "apiServer.host=127.0.0.1",
                "--component", component]) == 0
    docs = [d for d in yaml.safe_load_all(capsys.readouterr().out) if d]
    components = {d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
                  for d in docs}
    # the secrets are labelled with the component that reads them
    assert components & ({"router", "extender"} if component == "secrets" else {component})


def test_components_one_at_a_time_make_the_whole_install() -> None:
    whole = {_key(o) for o in objects()}
    values = load_values(None, ["apiServer.host=127.0.0.1"])
    assert {_key(o) for c in values.enabled() for o in objects(only=[c])} == whole


def test_router_is_optional() -> None:
    # every enabled component, and the random Secrets made on request
    objs = objects("router.enabled=false") + objects("router.enabled=false", only=["secrets"])
    mentions = [_key(o) for o in objs if "router" in json.dumps(o)]
    # only the pod-writes policy names the router's service account: should a
    # router be installed later under this prefix, it is restricted from the start
    assert mentions == [("ValidatingAdmissionPolicy", "", "toposerve-pod-writes")]
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Secret"] == [
        "toposerve-extender-key"]
