"""What the endpoint picker cannot serve in a RouterConfig, checked without
the epp extra (no gRPC, no Envoy protos): by ``toposerve router --mode
endpoint-picker`` before it binds, and by the install's values before a pod
would refuse it at start."""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from toposerve.router.config import RouterConfig


def unfit(cfg: RouterConfig) -> str | None:
    """What in ``cfg`` the picker cannot serve, for a person; None: all.
    A proxy connects to the address the picker names, so a static endpoint
    is named by IP; a split request takes two upstream calls the proxy
    would not make."""
    if cfg.disaggregation.enabled:
        return ("disaggregation.enabled: the endpoint picker does not split requests yet; "
                "run the router standalone for prefill/decode disaggregation")
    for i, ep in enumerate(cfg.discovery.static):
        host = urlsplit(ep.url).hostname or ""
        try:
            ipaddress.ip_address(host)
        except ValueError:
            return (f"discovery.static[{i}].url: {ep.url} names a host; the endpoint picker "
                    "names endpoints by IP:PORT for the proxy to connect to: give its IP")
    return None
