"""Values: every default is usable, and bad input is one clear error that
names the field and the fix, from a file and from --set alike."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import BaseModel

from tests.manifests.helpers import cli
from toposerve.localcluster.tools import versions
from toposerve.manifests.values import KUBERNETES_VERSION, InstallValues, apply_sets, load_values
from toposerve.scheduler_ext.config import ExtenderConfig
from toposerve.topology.config_file import ConfigError


def test_defaults_need_nothing() -> None:
    """A real cluster's install: the in-cluster API service, the release's
    namespace, the router in its own, the image of the chart's version."""
    v = load_values()
    assert v.api_server is None and v.namespace is None
    assert v.router.namespace == "toposerve-router"
    assert v.enabled() == ["gpu-driver", "admission-policy", "device-classes", "extender",
                           "scheduler", "router"]
    assert v.scheduler.image.ref == "registry.k8s.io/kube-scheduler:v1.37.2"
    assert v.image.repository == "ghcr.io/toposerve/toposerve" and v.image.tag == ""
    assert not (v.gpu_driver.host_network or v.extender.host_network
                or v.scheduler.host_network or v.router.host_network)
    given = load_values(None, ["apiServer.host=127.0.0.1"]).api_server
    assert given is not None and given.url == "https://127.0.0.1:6443"


def test_file_and_sets_merge(tmp_path: Path) -> None:
    f = tmp_path / "values.yaml"
    f.write_text("apiVersion: toposerve.io/v1\nkind: InstallValues\n"
                 "apiServer: {host: api.example.test, port: 443}\n"
                 "gpuDriver: {cdiRoot: /run/cdi, nodeSelector: {gpu: 'yes'}}\n")
    v = load_values(f, ["gpuDriver.enabled=false", "image.tag=v9", "apiServer.port=8443",
                        "gpuDriver.tolerations=[{operator: Exists}]", "scheduler.extenderURL="
                        "http://127.0.0.1:9999"])
    assert v.api_server is not None and v.api_server.url == "https://api.example.test:8443"
    assert v.gpu_driver.cdi_root == "/run/cdi" and not v.gpu_driver.enabled
    assert v.gpu_driver.node_selector == {"gpu": "yes"}
    assert v.gpu_driver.tolerations[0].operator == "Exists"
    assert v.image.ref == "ghcr.io/toposerve/toposerve:v9"
    assert v.scheduler.extender_url == "http://127.0.0.1:9999"


def test_component_configs_merge_over_their_defaults(tmp_path: Path) -> None:
    """A component's config in values gives only what it changes: mappings
    merge over the install's default for it, lists and scalars replace."""
    f = tmp_path / "values.yaml"
    f.write_text("apiVersion: toposerve.io/v1\nkind: InstallValues\n"
                 "router: {config: {discovery: {kubernetes: {port: 9000}},\n"
                 "                  profile: {scorers: [{type: queue}]}}}\n"
                 "extender: {config: {placement: {promiseTTLSeconds: 30}}}\n")
    v = load_values(f, ["apiServer.host=127.0.0.1",
                        "router.config.discovery.kubernetes.labelSelector=app=sglang",
                        "extender.config.persistDecisions=false"])
    k8s = v.router.config.discovery.kubernetes
    assert k8s is not None
    assert (k8s.namespace, k8s.label_selector, k8s.port) == ("default", "app=sglang", 9000)
    assert [s.type for s in v.router.config.profile.scorers] == ["queue"]
    default = InstallValues.model_validate({"apiServer": {"host": "127.0.0.1"}})
    assert v.router.config.profile.filters == default.router.config.profile.filters
    assert v.extender.config.placement.promise_ttl_seconds == 30
    assert not v.extender.config.persist_decisions
    # what values leave out of the extender's config is theirs to fill in
    assert v.extender.config.model_fields_set == {"api_version", "kind", "placement",
                                                  "persist_decisions"}
    # null replaces too: model servers from a static list only
    v = load_values(None, ["apiServer.host=127.0.0.1", "router.config.discovery.kubernetes=null",
                           "router.config.discovery.static=[{url: 'http://127.0.0.1:8000'}]"])
    assert v.router.config.discovery.kubernetes is None
    assert [e.url for e in v.router.config.discovery.static] == ["http://127.0.0.1:8000"]


def test_ipv6_api_server_url() -> None:
    given = load_values(None, ["apiServer.host=::1"]).api_server
    assert given is not None and given.url == "https://[::1]:6443"


@pytest.mark.parametrize("sets, message", [
    (["gpuDriver.cdiRot=/x"],
     "gpuDriver.cdiRot: Extra inputs are not permitted (unknown field: did you mean cdiRoot?)"),
    (["apiserver.port=1"], "apiserver: Extra inputs are not permitted (unknown field: did you "
                           "mean apiServer?)"),
    (["scheduler.tolerations=[{keyy: a}]"], "scheduler.tolerations.0.keyy: Extra inputs are "
                                            "not permitted (unknown field: did you mean key?)"),
    (["zzz=1"], "zzz: Extra inputs are not permitted (unknown field: remove it or check its "
                "spelling)"),
    (["extender.replicas=0"], "extender.replicas: Input should be greater than or equal to 1"),
    (["extender.port=http"], "extender.port: Input should be a valid integer"),
    (["apiServer.host=https://10.0.0.1"], "apiServer.host: Value error, give an IP address or a "
                                          "DNS name, without scheme or port"),
    (["gpuDriver.cdiRoot=run/cdi"], "gpuDriver.cdiRoot: String should match pattern"),
    (["image.pullPolicy=Sometimes"], "image.pullPolicy: Input should be 'Always', "
                                     "'IfNotPresent' or 'Never'"),
    (["namespace=Toposerve"], "namespace: String should match pattern"),
    (["kind=Values"], "kind: expected 'InstallValues', got 'Values'"),
    (["gpuDriver=on"], "gpuDriver: Input should be a valid dictionary or instance of GpuDriver"),
    (["router.config.discovery.kubernetes.labelSelecter=app=x"],
     "router.config.discovery.kubernetes.labelSelecter: Extra inputs are not permitted (unknown "
     "field: did you mean labelSelector?)"),
    (["extender.config.placement.promiseTTLSecond=3"],
     "extender.config.placement.promiseTTLSecond: Extra inputs are not permitted (unknown "
     "field: did you mean promiseTTLSeconds?)"),
    (["router.config.kind=ExtenderConfig"], "router.config.kind: Input should be 'RouterConfig'"),
    (["deviceClasses.extendedResourceName=gpu"],
     "deviceClasses.extendedResourceName: String should match pattern"),
    (["deviceClasses.extendedResourceName=example.kubernetes.io/gpu"],
     "deviceClasses.extendedResourceName: Value error, 'example.kubernetes.io/gpu' is in the "
     "kubernetes.io domain"),
])
def test_bad_values_name_the_field(sets: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_values(None, ["apiServer.host=127.0.0.1", *sets])
    assert message in str(err.value)
    # nothing but that one problem is reported
    assert len(str(err.value).splitlines()) <= 2


@pytest.mark.parametrize("item, message", [
    ("apiServer.host", "expected key.path=value"),
    ("a..b=1", "expected key.path=value"),
    ("logLevel.x=1", "logLevel is not a mapping, so it has no field 'x'"),
])
def test_bad_set_syntax(item: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        apply_sets({"logLevel": "info"}, [item])


def test_set_reads_an_escaped_dot_as_helm_does() -> None:
    doc = apply_sets({}, ['gpuDriver.nodeSelector.nvidia\\.com/gpu\\.present="true"'])
    assert doc == {"gpuDriver": {"nodeSelector": {"nvidia.com/gpu.present": "true"}}}


def test_set_does_not_touch_the_file_document() -> None:
    doc = {"gpuDriver": {"cdiRoot": "/a"}}
    apply_sets(doc, ["gpuDriver.cdiRoot=/b"])
    assert doc == {"gpuDriver": {"cdiRoot": "/a"}}


@pytest.mark.parametrize("text, message", [
    ("apiVersion: toposerve.io/v2\nkind: InstallValues\n",
     "apiVersion: expected 'toposerve.io/v1', got 'toposerve.io/v2'"),
    ("- a\n- b\n", "expected a YAML mapping with apiVersion and kind"),
    # a plain Helm values file: the fix named
    ("router: {replicas: 2}\n",
     "no apiVersion: start the file with apiVersion: toposerve.io/v1 and kind: InstallValues"),
    ("apiVersion: toposerve.io/v1\n", "no kind: start the file with apiVersion"),
    ("a: [\n", "not valid YAML"),
    # the second would silently win
    ("apiVersion: toposerve.io/v1\nkind: InstallValues\nrouter: {replicas: 2}\n"
     "router: {replicas: 3}\n", r"key 'router' given twice: keep one \(line 4, column 1\)"),
])
def test_bad_file(tmp_path: Path, text: str, message: str) -> None:
    f = tmp_path / "values.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_values(f, ["apiServer.host=127.0.0.1"])


def test_cli_bad_values_exit_2_with_the_error(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    f = tmp_path / "values.yaml"
    f.write_text("apiVersion: toposerve.io/v1\nkind: InstallValues\n"
                 "apiServer: {host: 127.0.0.1}\ngpuDriver: {kubeletDirectory: /x}\n")
    assert cli(["manifests", "render", "-f", str(f)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == [
        f"error: {f}: gpuDriver.kubeletDirectory: Extra inputs are not permitted (unknown "
        "field: did you mean kubeletDir?)"]
    assert cli(["manifests", "render", "-f", str(tmp_path / "none.yaml")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_every_field_is_documented() -> None:
    def walk(model: type[BaseModel]) -> list[str]:
        missing = []
        for name, f in model.model_fields.items():
            sub = f.annotation
            if sub is ExtenderConfig:
                continue  # the extender's own model, documented in docs/extender.md
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                missing += walk(sub)
            elif not f.description and name != "api_version":
                missing.append(f"{model.__name__}.{name}")
        return missing

    assert walk(InstallValues) == []


def test_install_page_reference_is_current() -> None:
    from toposerve.manifests.values_docs import PAGE, page

    current = PAGE.read_text()
    assert page(current) == current, "run: python -m toposerve.manifests.values_docs"


def test_scheduler_version_is_the_local_clusters() -> None:
    """The install's kube-scheduler release and the one the local cluster
    builds are pinned in two places (the product cannot read the dev
    cluster's pins); they must name the same release."""
    assert versions()["K8S_VERSION"] == KUBERNETES_VERSION
    assert InstallValues.model_validate(
        {"apiServer": {"host": "127.0.0.1"}}).scheduler.image.tag == KUBERNETES_VERSION
