"""The chart's monitoring: ServiceMonitors and a PodMonitor that scrape what
the components serve (checked against the Services, pods and configs of the
same render, and against the Prometheus operator's CRDs at a pinned
version), each only when asked for, and a Grafana dashboard whose every
PromQL expression names only series the components export (read from their
own Prometheus registries) with labels those series carry."""

from __future__ import annotations

import copy
import importlib
import json
import pkgutil
import re
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import CollectorRegistry

import toposerve.dra_driver
from tests.conftest import Cluster
from toposerve.kubeapi import ApiError, JsonApi
from toposerve.localcluster import crds
from toposerve.localcluster.clusters import ClusterError
from toposerve.localcluster.tools import helm_path
from toposerve.manifests.chart import HelmError, chart_dir, find_helm, template
from toposerve.manifests.values import load_values
from toposerve.router.config import RouterConfig
from toposerve.router.metrics import RouterMetrics
from toposerve.router.pool.static import load_static
from toposerve.router.state import RouterState
from toposerve.scheduler_ext.metrics import Metrics as ExtenderMetrics
from toposerve.topology.config_file import ConfigError

Obj = dict[str, Any]
DASHBOARDS = chart_dir() / "files" / "dashboards"
# Prometheus in the namespace `monitoring`, admitted to the extender's port
SCRAPER = "extender.networkPolicy.from=[{namespaceSelector: {matchLabels: {ns: monitoring}}}]"
ON = ("monitoring.serviceMonitor.enabled=true", "monitoring.podMonitor.enabled=true",
      "monitoring.grafanaDashboard.enabled=true", "gpuDriver.httpPort=9466", SCRAPER)


@pytest.fixture(scope="module")
def helm() -> Path:
    try:
        return find_helm(helm_path())
    except HelmError as err:
        pytest.skip(f"no helm to render the chart with: {err}")


def render(helm: Path, *sets: str) -> list[Obj]:
    text = template(load_values(None, list(sets)), helm)
    return [d for d in yaml.safe_load_all(text) if d]


def of_kind(objs: Iterable[Obj], kind: str) -> list[Obj]:
    return [o for o in objs if o["kind"] == kind]


def named(objs: Iterable[Obj], kind: str, name: str) -> Obj:
    (found,) = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def selects(selector: Mapping[str, str], labels: Mapping[str, str] | None) -> bool:
    return all((labels or {}).get(k) == v for k, v in selector.items())


def container(workload: Obj, name: str) -> Obj:
    found: list[Obj] = [c for c in workload["spec"]["template"]["spec"]["containers"]
                        if c["name"] == name]
    assert len(found) == 1, f"{len(found)} containers named {name}"
    return found[0]


def port_named(c: Obj, name: str) -> int:
    (port,) = [p["containerPort"] for p in c.get("ports", []) if p["name"] == name]
    return int(port)


def scraped_services(objs: list[Obj], monitor: Obj) -> list[Obj]:
    """The Services a ServiceMonitor picks: in its namespaceSelector's
    namespaces, labelled as its selector says."""
    spaces = monitor["spec"]["namespaceSelector"]["matchNames"]
    return [s for s in of_kind(objs, "Service") if s["metadata"]["namespace"] in spaces
            and selects(monitor["spec"]["selector"]["matchLabels"], s["metadata"]["labels"])]


def backing(objs: list[Obj], service: Obj, kind: str) -> list[Obj]:
    """The workloads of ``kind`` whose pods a Service's selector picks."""
    ns = service["metadata"]["namespace"]
    return [w for w in of_kind(objs, kind) if w["metadata"]["namespace"] == ns
            and selects(service["spec"]["selector"], w["spec"]["template"]["metadata"]["labels"])]


def config_of(objs: list[Obj], workload: Obj, volume: str) -> Any:
    """The YAML file a workload mounts from a ConfigMap volume (its one key)."""
    spec = workload["spec"]["template"]["spec"]
    (cm_name,) = [v["configMap"]["name"] for v in spec["volumes"] if v["name"] == volume]
    cm = named([o for o in objs if o["metadata"].get("namespace")
                == workload["metadata"]["namespace"]], "ConfigMap", cm_name)
    (text,) = cm["data"].values()
    return yaml.safe_load(text)


# --- the Prometheus operator's objects ---

def test_nothing_unless_asked(helm: Path) -> None:
    objs = render(helm)
    assert {o["kind"] for o in objs}.isdisjoint({"ServiceMonitor", "PodMonitor"})
    assert not [o for o in objs if o["metadata"]["name"].endswith(("-metrics", "-dashboards"))]
    assert not [o for o in objs if o["apiVersion"].startswith("monitoring.coreos.com/")]


def test_router_service_monitor_scrapes_every_replica(helm: Path) -> None:
    objs = render(helm, *ON, "monitoring.serviceMonitor.interval=15s",
                  "monitoring.serviceMonitor.scrapeTimeout=10s",
                  "monitoring.serviceMonitor.labels={release: kps}")
    router = named(objs, "Deployment", "toposerve-router")
    monitor = named(objs, "ServiceMonitor", "toposerve-router")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == router["metadata"]["namespace"] == "toposerve-router"
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["metadata"]["labels"]["app.kubernetes.io/component"] == "router"
    # one headless Service, not the router's own (under hot-standby that one
    # reaches the leader only): every pod, whatever its role
    (svc,) = scraped_services(objs, monitor)
    assert svc["metadata"]["name"] == "toposerve-router-metrics"
    assert "toposerve.io/router-role" not in svc["spec"]["selector"]
    assert svc["spec"]["clusterIP"] == "None"
    assert backing(objs, svc, "Deployment") == [router] and router["spec"]["replicas"] == 2
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert (endpoint["interval"], endpoint["scrapeTimeout"]) == ("15s", "10s")
    # its `endpoint` label (a model server) must not be renamed exported_endpoint
    assert endpoint["honorLabels"] is True
    (port,) = [p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"]]
    c = container(router, "router")
    served = config_of(objs, router, "config")["server"]
    assert port_named(c, port["targetPort"]) == served["port"] == 8080
    assert served["host"] == "0.0.0.0"


def test_extender_service_monitor(helm: Path) -> None:
    objs = render(helm, *ON)
    extender = named(objs, "Deployment", "toposerve-extender")
    monitor = named(objs, "ServiceMonitor", "toposerve-extender")
    assert monitor["metadata"]["namespace"] == extender["metadata"]["namespace"] == (
        "toposerve-system")
    (svc,) = scraped_services(objs, monitor)
    assert backing(objs, svc, "Deployment") == [extender]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["path"], endpoint["scheme"], endpoint["interval"]) == (
        "/metrics", "http", "30s")
    assert "scrapeTimeout" not in endpoint
    (port,) = [p for p in svc["spec"]["ports"] if p["name"] == endpoint["port"]]
    served = config_of(objs, extender, "config")["server"]
    target = port["targetPort"]
    number = port_named(container(extender, "extender"), target) if isinstance(
        target, str) else target
    assert number == served["port"] == 8888
    assert served["host"] != "127.0.0.1"
    # with a certificate it serves HTTPS only
    tls = render(helm, *ON, "extender.config.server.certFile=/tls/crt",
                 "extender.config.server.keyFile=/tls/key")
    assert named(tls, "ServiceMonitor", "toposerve-extender")["spec"]["endpoints"][0][
        "scheme"] == "https"


def test_gpu_driver_pod_monitor(helm: Path) -> None:
    objs = render(helm, *ON, "netDriver.enabled=true", "monitoring.podMonitor.labels={a: b}")
    monitor = named(objs, "PodMonitor", "toposerve-gpu-driver")
    gpu = named(objs, "DaemonSet", "toposerve-gpu-driver")
    assert monitor["metadata"]["namespace"] == gpu["metadata"]["namespace"] == "toposerve-system"
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == ["toposerve-system"]
    assert monitor["metadata"]["labels"]["a"] == "b"
    picked = [d["metadata"]["name"] for d in of_kind(objs, "DaemonSet")
              if selects(monitor["spec"]["selector"]["matchLabels"],
                         d["spec"]["template"]["metadata"]["labels"])]
    assert picked == ["toposerve-gpu-driver"]
    # the NIC driver is on the node's network, its /metrics on the loopback
    assert [m["metadata"]["name"] for m in of_kind(objs, "PodMonitor")] == [
        "toposerve-gpu-driver"]
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["path"] == "/metrics"
    driver = container(gpu, "driver")
    assert port_named(driver, endpoint["port"]) == 9466
    (address,) = [a.split("=", 1)[1] for a in driver["command"]
                  if a.startswith("--http-address=")]
    assert address == "0.0.0.0:9466"
    assert not gpu["spec"]["template"]["spec"].get("hostNetwork")


@pytest.mark.parametrize(("sets", "says"), [
    (("monitoring.podMonitor.enabled=true",), "give gpuDriver.httpPort"),
    (("monitoring.podMonitor.enabled=true", "gpuDriver.httpPort=9466",
      "gpuDriver.hostNetwork=true"), "gpuDriver.hostNetwork"),
    (("monitoring.serviceMonitor.enabled=true", "router.hostNetwork=true", SCRAPER),
     "router.hostNetwork"),
])
def test_unscrapable_refused(helm: Path, sets: tuple[str, ...], says: str) -> None:
    with pytest.raises(HelmError) as err:
        render(helm, *sets)
    assert says in str(err.value) and "\n" not in str(err.value)


def test_prometheus_must_be_admitted_to_the_extender(helm: Path) -> None:
    """Its NetworkPolicy admits only the scheduler: a ServiceMonitor without
    Prometheus among `from` would scrape nothing, so the render refuses it,
    in the values model and in helm alone."""
    with pytest.raises(ConfigError, match=r"pods to extender\.networkPolicy\.from"):
        load_values(None, ["monitoring.serviceMonitor.enabled=true"])
    done = subprocess.run([str(helm), "template", "t", str(chart_dir()), "--set",
                           "monitoring.serviceMonitor.enabled=true"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode != 0 and "extender.networkPolicy.from" in done.stderr
    objs = render(helm, *ON)
    (policy,) = [p for p in of_kind(objs, "NetworkPolicy")
                 if p["metadata"]["name"] == "toposerve-extender"]
    assert policy["spec"]["ingress"][0]["from"][1] == {
        "namespaceSelector": {"matchLabels": {"ns": "monitoring"}}}
    # without the policy, nothing to admit
    render(helm, "monitoring.serviceMonitor.enabled=true", "extender.networkPolicy.enabled=false")


def test_monitors_off_with_their_component(helm: Path) -> None:
    objs = render(helm, *ON, "router.enabled=false", "gpuDriver.enabled=false")
    assert [m["metadata"]["name"] for m in of_kind(objs, "ServiceMonitor")] == [
        "toposerve-extender"]
    assert of_kind(objs, "PodMonitor") == []


def _strict(schema: Any) -> Any:
    """A CRD's schema refusing fields it does not name, as the API server's
    strict field validation does (it prunes them otherwise)."""
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _strict(v) for k, v in schema.items()}
    if ("properties" in out and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    return out


@pytest.fixture(scope="module")
def monitor_crds() -> dict[str, Any]:
    """The v1 schema of each of the Prometheus operator's monitor kinds, by
    kind, from its Go module at the pinned version (localcluster.crds)."""
    jsonschema = pytest.importorskip("jsonschema")
    out: dict[str, Any] = {}
    for name in ("service-monitor", "pod-monitor"):
        try:
            crd = crds.load(name)
        except ClusterError as err:
            pytest.skip(f"no {name} CRD to check against: {err}")
        assert crd["spec"]["scope"] == "Namespaced"
        (v1,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1" and v["served"]]
        # no CEL rules: the schema is all the API server checks of them
        assert "x-kubernetes-validations" not in json.dumps(v1)
        out[crd["spec"]["names"]["kind"]] = jsonschema.Draft7Validator(
            _strict(v1["schema"]["openAPIV3Schema"]))
    return out


def test_monitors_valid_for_the_operator_crds(helm: Path, monitor_crds: dict[str, Any]) -> None:
    objs = render(helm, *ON, "monitoring.serviceMonitor.scrapeTimeout=10s",
                  "monitoring.serviceMonitor.labels={release: kps}",
                  "monitoring.podMonitor.labels={release: kps}",
                  "extender.config.server.certFile=/tls/crt",
                  "extender.config.server.keyFile=/tls/key")
    monitors = [o for o in objs if o["apiVersion"] == "monitoring.coreos.com/v1"]
    assert sorted(o["kind"] for o in monitors) == ["PodMonitor", "ServiceMonitor",
                                                   "ServiceMonitor"]
    for obj in monitors:
        assert obj["metadata"]["namespace"]
        errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
                  for e in monitor_crds[obj["kind"]].iter_errors(obj)]
        assert errors == [], f"{obj['kind']} {obj['metadata']['name']}"
        # what the check refuses: a misspelt field, a bad duration
        bad = copy.deepcopy(obj)
        endpoints = bad["spec"].get("endpoints") or bad["spec"]["podMetricsEndpoints"]
        endpoints[0]["intervall"] = endpoints[0].pop("interval")
        endpoints[0]["scrapeTimeout"] = "10 s"
        assert len(list(monitor_crds[obj["kind"]].iter_errors(bad))) == 2


def test_lint_strict_with_monitoring(helm: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(json.dumps(load_values(None, list(ON)).model_dump(
        by_alias=True, mode="json", exclude_unset=True)))
    done = subprocess.run([str(helm), "lint", "--strict", str(chart_dir()), "-f", str(values)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


# --- the Grafana dashboard ---

def dashboards() -> list[Path]:
    found = sorted(DASHBOARDS.glob("*.json"))
    assert found, f"no dashboards in {DASHBOARDS}"
    return found


def test_dashboard_config_map(helm: Path) -> None:
    objs = render(helm, *ON, "monitoring.grafanaDashboard.namespace=monitoring",
                  "monitoring.grafanaDashboard.annotations={grafana_folder: toposerve}")
    cm = named(objs, "ConfigMap", "toposerve-dashboards")
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "toposerve"}
    assert cm["data"] == {p.name: p.read_text() for p in dashboards()}
    default = named(render(helm, "monitoring.grafanaDashboard.enabled=true"), "ConfigMap",
                    "toposerve-dashboards")
    assert default["metadata"]["namespace"] == "toposerve-system"


@pytest.mark.unit
@pytest.mark.parametrize("path", dashboards(), ids=lambda p: p.name)
def test_dashboard_is_grafana_json(path: Path) -> None:
    dash = json.loads(path.read_text())
    assert dash["uid"] and dash["title"] and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"panel {p['title']!r} overlaps another"
        cells |= mine
        if p["type"] == "row":
            continue
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        assert all(t["expr"].strip() for t in p["targets"]), p["title"]


# --- what the dashboard's PromQL names, against what the components export ---

# what the Prometheus operator's scrape adds to every series (ServiceMonitor
# and PodMonitor targets)
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "container", "service",
                           "endpoint"})
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",),
            "histogram": ("_bucket", "_count", "_sum", "_created"),
            "summary": ("", "_count", "_sum", "_created"), "info": ("_info",),
            "stateset": ("",), "enum": ("",), "unknown": ("",)}


def _families(registry: CollectorRegistry) -> Iterator[tuple[str, str, frozenset[str]]]:
    """(name, type, label names) of each family a registry exposes."""
    wrappers = {c._name: c for c in registry._collector_to_names
                if isinstance(c, MetricWrapperBase)}
    for fam in registry.collect():
        # a labelled metric not observed yet has no samples to read labels from
        # (prometheus_client keeps them where its metric or family was made)
        named_labels: tuple[str, ...] = (getattr(wrappers.get(fam.name), "_labelnames", ())
                                         or getattr(fam, "_labelnames", ()))
        labels = set(named_labels) | {k for s in fam.samples for k in s.labels}
        yield fam.name, fam.type, frozenset(labels)


@cache
def exported() -> dict[str, frozenset[str]]:
    """Every series name the router, the extender and the DRA drivers serve
    on /metrics, with its label names: read from the registries they serve
    (the router's and the extender's own; the drivers' process-wide one,
    filled by the driver package's modules as they are imported)."""
    cfg = RouterConfig.model_validate({
        "apiVersion": "toposerve.io/v1", "kind": "RouterConfig",
        "discovery": {"static": [{"url": "http://127.0.0.1:1"}]}})
    state = RouterState(cfg)
    load_static(state.pool, cfg.discovery.static)  # the per-endpoint families then have labels
    for module in pkgutil.walk_packages(toposerve.dra_driver.__path__,
                                        toposerve.dra_driver.__name__ + "."):
        importlib.import_module(module.name)
    out: dict[str, frozenset[str]] = {}
    for registry in (RouterMetrics(state).registry, ExtenderMetrics().registry,
                     prometheus_client.REGISTRY):
        for name, kind, labels in _families(registry):
            for suffix in SUFFIXES[kind]:
                out[name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
    return out


TOKEN = re.compile(r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
  | (?P<matchers>\{(?:[^{}"]|"(?:[^"\\]|\\.)*")*\})
  | (?P<range>\[[^\]]*\])
  | (?P<var>\$\{?\w+\}?)
  | (?P<number>[0-9][\w.]*)
  | (?P<ident>[A-Za-z_:][\w:]*)
  | (?P<other>\S)""", re.VERBOSE)
MATCHER = re.compile(r"""\s*([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)\s*"(?:[^"\\]|\\.)*"\s*(?:,|$)""")
GROUPING = {"by", "without", "on", "ignoring", "group_left", "group_right"}
KEYWORDS = GROUPING | {"bool", "and", "or", "unless", "offset", "atan2"}
AGGREGATIONS = {"sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk",
                "quantile", "count_values", "group", "limitk", "limit_ratio"}


def _matcher_labels(block: str) -> list[str]:
    inner = block[1:-1].strip()
    labels: list[str] = []
    while inner:
        m = MATCHER.match(inner)
        assert m, f"cannot read the label matchers {block}"
        labels.append(m.group(1))
        inner = inner[m.end():].strip()
    return labels


def problems(expr: str, known: Mapping[str, frozenset[str]]) -> list[str]:
    """What in a PromQL expression names a series or label no component
    exports: each selector's metric name and matchers, and the grouping
    labels (by, on, ...) against the labels of the expression's series."""
    tokens = [(m.lastgroup, m.group()) for m in TOKEN.finditer(expr)]
    label_lists: set[int] = set()  # tokens inside a `by (...)`-like list
    for i, (kind, text) in enumerate(tokens):
        if kind == "ident" and text in GROUPING and tokens[i + 1:i + 2] == [("other", "(")]:
            j = i + 2
            while j < len(tokens) and tokens[j][1] != ")":
                label_lists.add(j)
                j += 1
    out: list[str] = []
    allowed = set(TARGET_LABELS)
    for i, (kind, text) in enumerate(tokens):
        after = tokens[i + 1] if i + 1 < len(tokens) else ("", "")
        if (kind != "ident" or i in label_lists or text in KEYWORDS or text in AGGREGATIONS
                or after[1] == "("):  # a function
            continue
        if text not in known:
            out.append(f"{text}: no component exports it")
            continue
        allowed |= known[text]
        if after[0] == "matchers":
            out += [f"{text}: no label {label}" for label in _matcher_labels(after[1])
                    if label not in known[text] | TARGET_LABELS]
    grouped = [tokens[i][1] for i in sorted(label_lists) if tokens[i][0] == "ident"]
    out += [f"grouping by {label}: none of the series has it"
            for label in grouped if label not in allowed]
    return out


def series(expr: str, known: Mapping[str, frozenset[str]]) -> list[str]:
    """The exported series an expression names."""
    return [m.group() for m in TOKEN.finditer(expr) if m.lastgroup == "ident"
            and m.group() in known]


def expressions(dash: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(where, PromQL, legend) of every panel target and query variable."""
    def panels(items: Iterable[Mapping[str, Any]]) -> Iterator[Mapping[str, Any]]:
        for p in items:
            yield p
            yield from panels(p.get("panels", []))
    for p in panels(dash["panels"]):
        for t in p.get("targets", []):
            yield f"panel {p['title']!r} {t['refId']}", t["expr"], t.get("legendFormat", "")
    for v in dash["templating"]["list"]:
        if v["type"] == "query":
            q = v["query"]["query"] if isinstance(v["query"], Mapping) else v["query"]
            m = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", q.strip())
            assert m, f"variable {v['name']}: expected label_values(selector, label)"
            yield f"variable {v['name']}", f"sum by ({m.group(2)}) ({m.group(1)})", ""


@pytest.mark.unit
def test_exported_metrics_read_from_the_registries() -> None:
    known = exported()
    # one family of each component and each kind, as /metrics names them
    assert {"toposerve_router_requests_total", "toposerve_router_time_to_first_byte_seconds_bucket",
            "toposerve_router_endpoint_healthy", "toposerve_router_loop_errors_total",
            "toposerve_extender_calls_total", "toposerve_dra_prepare_seconds_count",
            "toposerve_dra_slices", "toposerve_dra_slice_writes_total"} <= set(known)
    assert "toposerve_router_requests" not in known  # a counter is served as _total
    assert known["toposerve_router_endpoint_healthy"] == {"endpoint"}
    assert known["toposerve_router_loop_errors_total"] == {"loop"}
    assert known["toposerve_dra_prepare_seconds_bucket"] == {"driver", "result", "le"}


@pytest.mark.unit
@pytest.mark.parametrize(("expr", "wrong"), [
    ("sum(rate(toposerve_router_requests[5m]))", ["toposerve_router_requests: no component"]),
    ('rate(toposerve_router_tenant_requests_total{band="0"}[$__rate_interval])',
     ["no label band"]),
    ("sum by (band) (toposerve_router_queued_requests)", ["grouping by band"]),
    ("histogram_quantile(0.9, sum by (le, verb) (rate(toposerve_extender_call_second_bucket"
     "[1m])))", ["toposerve_extender_call_second_bucket: no component", "grouping by le",
                 "grouping by verb"]),
    ("max by (endpoint) (toposerve_router_endpoint_healthy and on (pod) "
     "(toposerve_router_leader == 1)) offset 5m", []),
])
def test_problems_finds_unknown_names(expr: str, wrong: list[str]) -> None:
    found = problems(expr, exported())
    assert len(found) == len(wrong) and all(w in f for w, f in zip(wrong, found, strict=True)), (
        found)


@pytest.mark.unit
@pytest.mark.parametrize("path", dashboards(), ids=lambda p: p.name)
def test_dashboard_names_only_exported_series(path: Path) -> None:
    known = exported()
    dash = json.loads(path.read_text())
    wrong: list[str] = []
    named_series = 0
    for where, expr, legend in expressions(dash):
        wrong += [f"{where}: {p}" for p in problems(expr, known)]
        names = series(expr, known)
        named_series += len(names)
        # a legend names labels the expression's result can have
        labels = set(TARGET_LABELS).union(*(known[n] for n in names))
        wrong += [f"{where}: legend label {label} is on none of its series"
                  for label in re.findall(r"\{\{\s*(\w+)\s*\}\}", legend)
                  if label not in labels]
    assert not wrong, "\n".join(wrong)
    assert named_series > 40  # the check read the expressions, it did not skip them


# --- on the real API server ---

STRICT = [("dryRun", "All"), ("fieldValidation", "Strict")]
PATHS = {"Service": "/api/v1/namespaces/{}/services",
         "ConfigMap": "/api/v1/namespaces/{}/configmaps",
         "ServiceMonitor": "/apis/monitoring.coreos.com/v1/namespaces/{}/servicemonitors",
         "PodMonitor": "/apis/monitoring.coreos.com/v1/namespaces/{}/podmonitors"}


@pytest.mark.cluster
def test_monitoring_objects_pass_a_strict_dry_run(cluster: Cluster, helm: Path) -> None:
    """What monitoring adds to an install is created by a server-side dry
    run with strict field validation once the operator's CRDs are served,
    and comes back as written; a misspelt field is refused there."""
    rest = JsonApi(cluster.api)
    crds.install_named(rest, ["service-monitor", "pod-monitor"])
    # all in `default`: a dry run needs its namespace to exist
    objs = render(helm, *ON, "namespace=default", "router.namespace=default",
                  "router.createNamespace=false", "monitoring.serviceMonitor.scrapeTimeout=10s",
                  "monitoring.serviceMonitor.labels={release: kps}")
    added = [o for o in objs if o["kind"] in ("ServiceMonitor", "PodMonitor")
             or o["metadata"]["name"] in ("toposerve-router-metrics", "toposerve-dashboards")]
    assert sorted(o["kind"] for o in added) == ["ConfigMap", "PodMonitor", "Service",
                                                "ServiceMonitor", "ServiceMonitor"]
    for obj in added:
        got = rest.request("POST", PATHS[obj["kind"]].format(obj["metadata"]["namespace"]),
                           STRICT, body=obj)
        assert got["metadata"].get("uid"), obj["metadata"]["name"]  # answered as created
        if obj["kind"] == "Service":  # it gains defaults (clusterIPs, ipFamilies, ...)
            assert got["spec"]["selector"] == obj["spec"]["selector"]
            assert got["spec"]["clusterIP"] == "None"
        else:
            assert got.get("spec", got.get("data")) == obj.get("spec", obj.get("data"))
    bad = copy.deepcopy(named(added, "ServiceMonitor", "toposerve-router"))
    bad["spec"]["endpoints"][0]["intervall"] = "30s"
    with pytest.raises(ApiError) as err:
        rest.request("POST", PATHS["ServiceMonitor"].format("default"), STRICT, body=bad)
    assert err.value.status in (400, 422) and "intervall" in str(err.value)
